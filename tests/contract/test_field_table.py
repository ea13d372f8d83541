"""The field tables enforced on every contract target (real llama-server, vLLM and Ollama, the emulators
of all six engines), through a gateway process, with the unmodified `openai` SDK.

For every field of the engine's table (llm_gateway/adapters/field_table.py; Ollama's in
adapters/ollama_request.py) at a value that asks something of the engine (tests/unit/test_field_tables.py
`VALUES`): a refused one is `openai.BadRequestError` with `param` the field and a message naming the
engine, and the engine was never called, by its own account (emulators: their per-path request count;
vLLM: its `http_requests_total` for the route; llama-server: the task ids of its slots, which move with
every generation; Ollama: the exchanges its server logged). A field the table passes is answered 200,
and on the emulators it arrived in the engine's request as it was sent (`stats.last_request`). On the
real engines only a few passed fields are sent (4 tokens each): each costs a generation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from llm_gateway.adapters.field_table import PASSED, TRANSLATED
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.adapters.registry import ADAPTERS
from tests.contract.targets import ENGINE_HTTP_TIMEOUT_S, Target, open_target, poll
from tests.contract.test_contract import TARGETS
from tests.support.gateway_process import GatewayProcess
from tests.support.mlx_engine import MlxServer
from tests.support.real_engines import OllamaServer
from tests.unit.test_field_tables import ENGINE_NAMES, VALUES, with_field
from tests.unit.test_ollama_truth import CHAT_REFUSED, CHAT_SENT, COMPLETIONS_REFUSED, COMPLETIONS_SENT

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
  - {{name: good, engine: {engine}, url: "{url}", api_key: "{key}", capacity: 4, probe: {{interval_s: 0.5}}}}
models:
  - name: m
    deployments: [{{backend: good, model: "{model}", format: {fmt}, capabilities: [chat, completions, tools]}}]
"""
MAX = 4  # tokens of every answer
TIMEOUT_S = 180.0  # per request: a real engine on a busy 2-core machine may answer very late (vLLM stalled 60 s)
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
OLLAMA_PATHS = {"chat": "/api/chat", "completions": "/api/generate"}
#: the few passed fields sent to each real engine (each one is a generation)
REAL_PASSED = {
    "llama-server": ("temperature", "seed", "stop", "top_logprobs", "logit_bias"),
    "vllm": ("temperature", "seed", "stop", "top_logprobs", "logit_bias", "n"),
    "ollama": ("temperature", "seed", "stop"),
    "mlx": ("temperature", "seed", "logit_bias", "top_logprobs"),
}
ENGINE_NAMES_ALL = {**ENGINE_NAMES, "ollama": "Ollama", "mlx": "MLX-LM"}


def has_table(target_id: str) -> bool:
    """Ollama's table is its own; Dynamo's frontend has none (it refuses per worker itself, adapters/dynamo.py)."""
    engine = target_id.split("/")[0]
    cls = ADAPTERS[engine]
    return engine == "ollama" or (issubclass(cls, OpenAICompatAdapter) and cls.field_table is not None)


@pytest.fixture(scope="module", params=[t for t in TARGETS if has_table(t)])
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    """The contract suite's targets (tests/contract/test_contract.py) whose adapter has a field table."""
    yield from open_target(request)


@pytest.fixture(scope="module")
def gateway(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(**target.config_fields)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-fields"), startup_timeout=60) as gw:
        yield gw


@pytest.fixture
def oai(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0, timeout=TIMEOUT_S)


def refused_values(engine: str, endpoint: str) -> dict[str, Any]:
    """Each field the engine's table refuses, at a value that asks something."""
    if engine == "ollama":
        return dict(CHAT_REFUSED if endpoint == "chat" else COMPLETIONS_REFUSED)
    table = adapter_table(engine)[endpoint]
    return {f: VALUES[endpoint][f] for f, rule in table.items() if rule.accepted is not None}


def passed_values(engine: str, endpoint: str) -> dict[str, tuple[Any, bool]]:
    """Each field the engine's table sends, at a value the engine honours: (value, sent as it is)."""
    if engine == "ollama":
        return {f: (v, False) for f, v in (CHAT_SENT if endpoint == "chat" else COMPLETIONS_SENT).items()}
    out: dict[str, tuple[Any, bool]] = {}
    for f, rule in adapter_table(engine)[endpoint].items():
        if rule.how in (PASSED, TRANSLATED):
            value = VALUES[endpoint][f]
            if rule.accepted is not None:
                value = next(v for v in rule.accepted if v not in (None, "auto"))
            out[f] = (value, rule.how == PASSED)
    return out


def adapter_table(engine: str) -> Any:
    cls = ADAPTERS[engine]
    assert issubclass(cls, OpenAICompatAdapter) and cls.field_table is not None, engine
    return cls.field_table.tables


def call(oai: openai.OpenAI, endpoint: str, field: str, value: Any, alone: bool = False) -> Any:
    """One request through the SDK with `field` set (and what it needs beside it, unless `alone`: a refused
    `top_logprobs` goes without the `logprobs` the same engine refuses, which the SDK would send first)."""
    body = with_field(endpoint, field, value)
    if alone:
        body = {k: v for k, v in body.items() if k == field or k in ("messages", "prompt")}
    if field not in ("max_tokens", "max_completion_tokens"):
        body["max_tokens"] = MAX
    body.pop("model", None)  # the gateway's field: the public model is asked for
    create = oai.chat.completions.create if endpoint == "chat" else oai.completions.create
    answer = create(model="m", **body)
    if body.get("stream"):
        return list(answer)
    return answer


def engine_calls(t: Target, endpoint: str) -> Any:
    """The engine's own account of the generation requests it has received so far."""
    if t.emulator is not None:
        path = (OLLAMA_PATHS if t.engine == "ollama" else PATHS)[endpoint]
        return t.emulator.stats.by_path.get(path, 0)
    if t.engine == "vllm":
        text = httpx.get(t.url + "/metrics", timeout=ENGINE_HTTP_TIMEOUT_S).text
        return sum(
            float(line.rsplit(None, 1)[-1])
            for line in text.splitlines()
            if line.startswith("http_requests_total{") and f'handler="{PATHS[endpoint]}"' in line
        )
    if t.engine == "llama-server":
        slots = httpx.get(t.url + "/slots", headers=t.headers, timeout=ENGINE_HTTP_TIMEOUT_S).json()
        return tuple(s.get("id_task") for s in slots)
    if isinstance(t.real, MlxServer):
        return t.real.requests_logged(PATHS[endpoint])
    assert isinstance(t.real, OllamaServer)
    return t.real.exchanges_logged(OLLAMA_PATHS[endpoint])


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_refused_fields_are_400_and_never_reach_the_engine(target: Target, oai: openai.OpenAI, endpoint: str) -> None:
    refused = refused_values(target.engine, endpoint)
    assert refused, f"{target.id}: no refused field: the case would prove nothing"
    before = engine_calls(target, endpoint)
    for field, value in refused.items():
        with pytest.raises(openai.BadRequestError) as e:
            call(oai, endpoint, field, value, alone=True)
        assert e.value.param == field and e.value.code == "unsupported_parameter", (field, e.value.body)
        assert field in e.value.message and ENGINE_NAMES_ALL[target.engine] in e.value.message, e.value.message
    assert engine_calls(target, endpoint) == before, f"{target.id}: a refused request reached the engine"
    call(oai, endpoint, "temperature", 0.0)  # the evidence moves when the engine is called
    assert _moved(target, endpoint, before), f"{target.id}: the engine's account did not move for a real call"


def _moved(t: Target, endpoint: str, before: Any) -> bool:
    return poll(lambda: engine_calls(t, endpoint) != before, 30.0, 0.2)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_passed_fields_are_answered_and_reach_the_engine(target: Target, oai: openai.OpenAI, endpoint: str) -> None:
    fields = passed_values(target.engine, endpoint)
    if target.real is not None:
        fields = {f: fv for f, fv in fields.items() if f in REAL_PASSED[target.engine]}
        assert fields, target.id
    for field, (value, as_is) in fields.items():
        if target.real is not None and target.engine == "ollama" and field in ("tools", "tool_choice"):
            continue  # the real tiny model's template has no tools (Ollama refuses them itself)
        try:
            answer = call(oai, endpoint, field, value)
        except openai.APIError as e:
            raise AssertionError(f"{target.id}: {field}={value!r} was not answered: {e!r}") from e
        assert answer, (field, value)
        if target.emulator is not None and as_is:
            got = (target.emulator.stats.last_request or {}).get("json") or {}
            assert got.get(field) == value, f"{target.id}: {field}={value!r} did not arrive: {got}"
