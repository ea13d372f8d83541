"""The hot path's optional capabilities are declared, not found by name.

An optional capability (an upstream response that pushes its chunks, an exchange with a direct chunk writer,
a limit store that answers without suspending, an engine that counts prompts) is a Protocol or a typed flag,
checked once, never a `getattr(obj, "name", None)` per call that no interface declares. The scan below fails
on any `getattr`/`hasattr` in llm_gateway/ that is not one of the dynamic uses listed in `DYNAMIC`, each with
its reason: a new capability found by name has to be declared instead, or listed here consciously.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from llm_gateway.access.memory import MemoryStore
from llm_gateway.access.store import InlineStore
from llm_gateway.adapters.base import Adapter
from llm_gateway.adapters.registry import ADAPTERS
from llm_gateway.dialects.anthropic.exchange import AnthropicExchange
from llm_gateway.dialects.responses.exchange import ResponsesExchange
from llm_gateway.exchange import DirectWriter
from llm_gateway.http.call import Call
from llm_gateway.types import Capability
from llm_gateway.upstream.base import PushResponse
from llm_gateway.upstream.h1_response import H1Response

PKG = Path(__file__).resolve().parents[2] / "llm_gateway"

#: (module, attribute) -> why the lookup by name is legitimate: not an optional capability of the gateway's own
DYNAMIC = {
    ("admin/schemas.py", "<dynamic>"): "pydantic fields by name, in a loop over the model's fields",
    ("observability/logs.py", "fields"): "a LogRecord's `extra=` attribute: logging sets it on the record",
    ("settings/loader.py", "problem_mark"): "PyYAML's MarkedYAMLError attributes, absent on its other errors",
    ("settings/loader.py", "problem"): "PyYAML's MarkedYAMLError attributes, absent on its other errors",
    ("state/driver_errors.py", "sqlstate"): "the database driver's exception (asyncpg's) says its SQLSTATE this way",
    ("http/call.py", "__self__"): "the owner of the server's `send`, a bound method (then an isinstance check)",
    ("admin/gate.py", "__self__"): "the owner of the server's `send`, a bound method (then an isinstance check)",
    ("http/direct_cycle.py", "<dynamic>"): "`__getattr__` of the transport stand-ins: delegation to the transport",
    ("types.py", "<dynamic>"): "`Capability`: a declared protocol's methods on a type, once per type",
}


def lookups_by_name(source: str) -> list[tuple[str, int]]:
    """(the attribute named, line) of every getattr/hasattr call; "<dynamic>" when it is not a literal."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            arg = node.args[1] if len(node.args) > 1 else None
            name = arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else "<dynamic>"
            found.append((name, node.lineno))
    return found


def test_the_scan_finds_lookups_by_name() -> None:
    src = "a = getattr(x, 'pipe', None)\nif hasattr(y, 'restore'): pass\nb = getattr(z, name)\n"
    assert lookups_by_name(src) == [("pipe", 1), ("restore", 2), ("<dynamic>", 3)]


def test_no_capability_is_found_by_name() -> None:
    undeclared = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        for name, line in lookups_by_name(path.read_text()):
            if (rel, name) not in DYNAMIC:
                undeclared.append(f"llm_gateway/{rel}:{line} looks up {name!r} by name")
    assert not undeclared, "declare these capabilities (a Protocol or a typed flag), or list them in DYNAMIC:\n" + (
        "\n".join(undeclared)
    )


# -- the declarations hold for the gateway's own implementations -----------------------------------------------


def test_the_own_upstream_response_pushes() -> None:
    assert Capability(PushResponse).methods == ("buffered", "pipe")
    assert Capability(PushResponse).holds_for(H1Response)


@pytest.mark.parametrize("cls", [Call, AnthropicExchange, ResponsesExchange])
def test_the_exchanges_offer_a_direct_writer(cls: type) -> None:
    assert Capability(DirectWriter).holds_for(cls)


def test_a_capability_is_checked_once_per_type() -> None:
    class Pushing:
        def buffered(self) -> bool:
            return False

        def pipe(self, sink: object) -> None:
            return None

    class Pulling:
        pipe = None  # not a method: not the capability

    pushes: Capability[PushResponse] = Capability(PushResponse)
    first, second = Pushing(), Pushing()
    assert pushes.of(first) is first and pushes.of(second) is second and pushes.of(Pulling()) is None
    del Pushing.pipe  # the type's answer is kept: the type is not looked at again
    assert pushes.of(first) is first
    assert Capability(PushResponse).of(first) is None  # a fresh check sees the change


def test_the_in_process_store_is_inline() -> None:
    assert isinstance(MemoryStore(), InlineStore)


def test_a_store_that_must_suspend_is_not_inline() -> None:
    pytest.importorskip("redis")
    from llm_gateway.access.redis_store import RedisStore

    assert not issubclass(RedisStore, InlineStore)


@pytest.mark.parametrize("cls", [*ADAPTERS.values()])
def test_an_adapter_says_it_counts_prompts_exactly_when_it_can(cls: type[Adapter]) -> None:
    overrides = cls.count_prompt_tokens is not Adapter.count_prompt_tokens
    assert cls.counts_prompts is overrides, f"{cls.__name__}: counts_prompts must say whether it counts"


def test_prompt_counting_engines_are_the_tokenizer_ones() -> None:
    assert {k for k, cls in ADAPTERS.items() if cls.counts_prompts} == {"llama-server", "vllm"}
