"""The private parts of uvicorn the gateway's server stands on (llm_gateway/http/uvicorn_private.py), checked
against the installed uvicorn: every method the gateway overrides or calls is there with the parameters it
expects, every field it reads or writes is set where it expects, the cycle is still built inline where the
class swap expects it, and nothing else in the product imports uvicorn's internals. An upgrade that changes
one of them fails here, naming it, before it breaks a connection; pyproject.toml allows only the minor
version checked."""

from __future__ import annotations

import ast
import asyncio
import inspect
import logging
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn
from packaging.requirements import Requirement
from packaging.version import Version
from uvicorn.protocols.http.flow_control import FlowControl

from llm_gateway.http import uvicorn_private as up
from llm_gateway.http.direct_cycle import CoalescingCycle

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "llm_gateway"
VERSION = f"uvicorn {uvicorn.__version__} (uvicorn_private.py was checked against {up.CHECKED})"


async def _app(scope: Any, receive: Any, send: Any) -> None:
    return None


def _params(fn: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(fn).parameters)


def _check_methods(cls: type, expected: dict[str, tuple[str, ...]]) -> list[str]:
    changed = []
    for name, params in expected.items():
        fn = getattr(cls, name, None)
        if not callable(fn):
            changed.append(f"{cls.__name__}.{name} is gone")
        elif _params(fn) != params:
            changed.append(f"{cls.__name__}.{name}{_params(fn)}, where the gateway expects {params}")
    return changed


def test_the_methods_the_gateway_overrides_or_calls_are_there_with_their_parameters() -> None:
    changed = [
        *_check_methods(up.HttpToolsProtocol, up.PROTOCOL_METHODS),
        *_check_methods(up.RequestResponseCycle, up.CYCLE_METHODS),
        *_check_methods(uvicorn.Server, up.SERVER_METHODS),
    ]
    assert not changed, f"{VERSION}:\n" + "\n".join(changed)


def test_the_check_names_a_changed_method() -> None:
    class Changed:
        def send(self, message: Any, more: bool) -> None: ...

    assert _check_methods(Changed, {"send": ("self", "message"), "receive": ("self",)}) == [
        "Changed.send('self', 'message', 'more'), where the gateway expects ('self', 'message')",
        "Changed.receive is gone",
    ]


def _protocol() -> Any:
    config = uvicorn.Config(_app, http="httptools", log_config=None)
    config.load()
    loop = asyncio.new_event_loop()
    try:
        proto = up.HttpToolsProtocol(config=config, server_state=up.ServerState(), app_state={}, _loop=loop)
    finally:
        loop.close()
    return proto


def test_the_protocol_sets_the_fields_the_gateway_replays_and_reads() -> None:
    proto = _protocol()
    missing = [name for name in up.PROTOCOL_STATE if name not in vars(proto)]
    assert not missing, f"{VERSION}: HttpToolsProtocol.__init__ no longer sets {missing}"
    proto.on_message_begin()  # a request begins: its URL and headers are gathered here
    assert isinstance(proto.url, bytes) and proto.headers == [], f"{VERSION}: on_message_begin changed"


def test_the_cycle_sets_the_fields_the_direct_writes_use() -> None:
    cycle = up.RequestResponseCycle(
        scope={"method": "GET"},  # type: ignore[arg-type]
        transport=None,  # type: ignore[arg-type]
        flow=None,  # type: ignore[arg-type]
        logger=logging.getLogger("t"),
        access_logger=logging.getLogger("t"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )
    missing = [name for name in up.CYCLE_STATE if name not in vars(cycle)]
    assert not missing, f"{VERSION}: RequestResponseCycle.__init__ no longer sets {missing}"
    flow = FlowControl(None)  # type: ignore[arg-type]
    missing = [name for name in up.FLOW_STATE if not hasattr(flow, name)]
    assert not missing, f"{VERSION}: the cycle's FlowControl lacks {missing}"


def test_the_server_has_the_fields_the_gateway_reads() -> None:
    server = uvicorn.Server(uvicorn.Config(_app, log_config=None))
    set_later = {"servers": uvicorn.Server.startup, "lifespan": uvicorn.Server._serve}  # type: ignore[attr-defined]
    missing = [
        name
        for name in up.SERVER_STATE
        if name not in vars(server)
        and not (name in set_later and f"self.{name} =" in inspect.getsource(set_later[name]))
    ]
    assert not missing, f"{VERSION}: uvicorn.Server no longer sets {missing}"
    assert isinstance(server._captured_signals, list), f"{VERSION}: Server._captured_signals is not a list"


def test_the_protocol_still_builds_the_cycle_inline_where_the_class_swap_expects_it() -> None:
    source = inspect.getsource(up.HttpToolsProtocol.on_headers_complete)
    assert "RequestResponseCycle(" in source, f"{VERSION}: on_headers_complete no longer builds the cycle itself"


def test_the_gateway_cycle_can_take_the_place_of_uvicorns() -> None:
    """The swap is sound only while the gateway's cycle adds methods and class attributes, and leaves alone
    `run_asgi`, whose coroutine exists before the swap."""
    assert "__slots__" not in vars(CoalescingCycle) and "__init__" not in vars(CoalescingCycle)
    assert "run_asgi" not in vars(CoalescingCycle)
    cycle = object.__new__(up.RequestResponseCycle)
    assert up.adopt_cycle(cycle, CoalescingCycle) and type(cycle) is CoalescingCycle
    assert not up.adopt_cycle(cycle, CoalescingCycle)  # not uvicorn's plain cycle (any more): left as it is


def test_no_other_module_imports_uvicorns_internals() -> None:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "uvicorn_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.relative_to(REPO)}: {n}" for n in names if n.startswith("uvicorn.")]
    assert not found, "import uvicorn's internals through llm_gateway/http/uvicorn_private.py:\n" + "\n".join(found)


def test_uvicorn_is_held_to_the_minor_version_checked() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if Requirement(d).name == "uvicorn"]
    checked = Version(up.CHECKED)
    assert spec.contains(up.CHECKED), f"pyproject.toml's uvicorn{spec} excludes the version checked, {up.CHECKED}"
    assert not spec.contains(f"{checked.major}.{checked.minor + 1}.0"), f"pyproject.toml's uvicorn{spec} is open above"
    assert spec.contains(uvicorn.__version__), f"{VERSION} is installed, outside pyproject.toml's uvicorn{spec}"
