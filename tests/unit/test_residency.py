"""Residency: which models an engine has loaded, as its probe reads it (Ollama `/api/ps`, vLLM's sleep
state, llama-server router mode's `status.value`, the others loaded when ready), the deployment's view
of it, selection preferring a loaded model to a cold load, the `gateway_deployment_resident` gauge and
`/v1/models` `resident`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.openai_generic import GenericOpenAIAdapter
from llm_gateway.adapters.vllm import VLLMAdapter, sleeping
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.unit.test_context_windows import ADAPTERS, EmulatorProbeClient, captured, info, probed
from tests.unit.test_probes import FakeClient

VERSION = captured("ollama/api-version.txt")
TAGS = captured("ollama/api-tags.txt")


# -- what each adapter reads -----------------------------------------------------------------------------


async def test_ollama_a_model_api_ps_lists_is_resident_from_the_real_capture() -> None:
    client = FakeClient({"/api/version": VERSION, "/api/tags": TAGS, "/api/ps": captured("ollama/api-ps-loaded.txt")})
    res = await OllamaAdapter(info()).probe(client)
    assert res.resident == {"tiny:latest": True, "tiny": True}
    assert client.headers_for("/api/ps")["Host"].startswith("localhost")


async def test_ollama_a_pulled_model_api_ps_does_not_list_is_cold_from_the_real_capture() -> None:
    client = FakeClient({"/api/version": VERSION, "/api/tags": TAGS, "/api/ps": captured("ollama/api-ps-empty.txt")})
    res = await OllamaAdapter(info()).probe(client)
    assert res.models and res.resident == dict.fromkeys(res.models, False)


@pytest.mark.parametrize("ps", [(404, b"404 page not found"), (200, b"garbage"), (200, b'{"models":null}')])
async def test_ollama_without_a_usable_api_ps_cannot_tell(ps: tuple[int, bytes]) -> None:
    client = FakeClient({"/api/version": VERSION, "/api/tags": TAGS, "/api/ps": ps})
    res = await OllamaAdapter(info()).probe(client)
    assert res.state == "ready" and res.models and res.resident is None


async def test_ollama_emulator_model_turns_resident_after_its_first_request() -> None:
    with EmulatorThread(EmulatorConfig(engine="ollama", model="tiny")) as emu:
        async with httpx.AsyncClient(timeout=10) as http:
            adapter, client = OllamaAdapter(info()), EmulatorProbeClient(emu.url, http)
            before = (await adapter.probe(client)).resident
            r = await http.post(emu.url + "/api/chat", json={"model": "tiny", "messages": [], "stream": False})
            after = (await adapter.probe(client)).resident
    assert r.status_code == 200
    assert before == {"tiny:latest": False, "tiny": False}
    assert after == {"tiny:latest": True, "tiny": True}


METRICS = captured("vllm/metrics-under-load-max-num-seqs-2.txt")[1]
ASLEEP = METRICS.replace(b'sleep_state="awake"} 1.0', b'sleep_state="awake"} 0.0').replace(
    b'sleep_state="weights_offloaded"} 0.0', b'sleep_state="weights_offloaded"} 1.0'
)


def test_vllm_sleep_state_from_the_real_metrics() -> None:
    assert b'vllm:engine_sleep_state{engine="0",model_name="tiny-llama",sleep_state="awake"} 1.0' in METRICS
    assert ASLEEP != METRICS
    assert sleeping(METRICS) is False and sleeping(ASLEEP) is True
    assert sleeping(b"") is False  # an older build without the gauge: awake when ready


@pytest.mark.parametrize(("metrics", "resident"), [(METRICS, True), (ASLEEP, False)])
async def test_vllm_is_resident_when_ready_unless_asleep(metrics: bytes, resident: bool) -> None:
    client = FakeClient({"/health": (200, b""), "/v1/models": captured("vllm/models.txt"), "/metrics": (200, metrics)})
    res = await VLLMAdapter(info()).probe(client)
    assert res.resident == {"tiny-llama": resident}


async def test_a_generic_openai_server_cannot_tell() -> None:
    client = FakeClient({"/v1/models": (200, b'{"data":[{"id":"m"}]}')})
    res = await GenericOpenAIAdapter(info()).probe(client)
    assert res.state == "ready" and res.models and res.resident is None


@pytest.mark.parametrize("engine", ["llama-server", "vllm", "sglang", "tabbyapi", "lmdeploy"])
async def test_a_ready_single_model_engine_has_its_models_resident(engine: str) -> None:
    with EmulatorThread(EmulatorConfig(engine=engine, model="tiny")) as emu:
        async with httpx.AsyncClient(timeout=5) as http:
            res = await ADAPTERS[engine](info()).probe(EmulatorProbeClient(emu.url, http))
    assert res.state == "ready" and res.models
    assert res.resident == dict.fromkeys(res.models, True)


REPO_CAPTURES = Path(__file__).resolve().parents[1] / "emulators" / "captures" / "llamacpp" / "http"


def router_models(name: str) -> tuple[int, bytes]:
    """Status and body of a real router-mode `/models` capture (`--models-dir` with res-x and res-y)."""
    text = (REPO_CAPTURES / name).read_bytes()
    head, _, body = text[text.index(b"HTTP/1.1 ") :].partition(b"\r\n\r\n")
    return int(head.split()[1]), body.strip()


ROUTER_UNLOADED = router_models("61_router_models_unloaded.txt")
ROUTER_LOADED = router_models("62_router_models_loaded.txt")  # res-x loaded, res-y not


def router(models: tuple[int, bytes]) -> FakeClient:
    # the router's own /health is 200 with nothing loaded; /props, /slots, /metrics want ?model= (400)
    bad = (400, b'{"error":{"code":400,"message":"model name is missing from the request"}}')
    return FakeClient({"/health": (200, b'{"status":"ok"}'), "/v1/models": models, "/props": bad, "/slots": bad})


async def test_llama_router_with_nothing_loaded_is_ready_and_every_model_cold_from_the_real_capture() -> None:
    client = router(ROUTER_UNLOADED)
    res = await LlamaServerAdapter(info()).probe(client)
    assert res.state == "ready"
    assert res.models == frozenset({"res-x", "res-y"})
    assert res.resident == {"res-x": False, "res-y": False}
    assert client.paths == ["/health", "/v1/models"]  # no per-model request the router would refuse
    assert res.load is None and res.context_lengths is None


async def test_llama_router_the_loaded_model_is_resident_and_the_other_cold_from_the_real_capture() -> None:
    res = await LlamaServerAdapter(info()).probe(router(ROUTER_LOADED))
    assert res.resident == {"res-x": True, "res-y": False}


def with_status(value: str, extra: bytes = b"") -> tuple[int, bytes]:
    status, body = ROUTER_LOADED
    assert body.count(b'"status":{"value":"loaded"') == 1
    return status, body.replace(b'"status":{"value":"loaded"', b'"status":{"value":"' + value.encode() + b'"' + extra)


@pytest.mark.parametrize(
    ("value", "extra"),
    [("loading", b""), ("sleeping", b""), ("unloaded", b',"exit_code":1,"failed":true'), ("downloading", b"")],
)
async def test_llama_router_a_model_not_loaded_yet_or_any_more_is_not_resident(value: str, extra: bytes) -> None:
    res = await LlamaServerAdapter(info()).probe(router(with_status(value, extra)))
    assert res.state == "ready" and res.models == frozenset({"res-x", "res-y"})
    assert res.resident == {"res-x": False, "res-y": False}


async def test_llama_single_model_server_is_probed_as_before_and_has_its_model_resident() -> None:
    # its cards carry no status: the same requests as without router support (/props for the window)
    client = FakeClient(
        {
            "/health": captured("llamacpp/http/01_health.txt"),
            "/v1/models": captured("llamacpp/http/02_v1_models.txt"),
            "/props": captured("llamacpp/http/03_props.txt"),
            "/slots": captured("llamacpp/http/04_slots_idle.txt"),
        }
    )
    res = await LlamaServerAdapter(info()).probe(client)
    assert client.paths == ["/health", "/v1/models", "/props", "/metrics", "/slots"]
    assert res.resident == {"tiny-llama": True}
    assert res.context_lengths == {"tiny-llama": 2048} and res.load is not None


async def test_llama_router_then_single_model_on_the_same_adapter_forgets_the_router() -> None:
    adapter = LlamaServerAdapter(info())
    await adapter.probe(router(ROUTER_LOADED))
    single = {"/health": (200, b"{}"), "/v1/models": captured("llamacpp/http/02_v1_models.txt")}
    res = await adapter.probe(FakeClient(single))
    assert res.resident == {"tiny-llama": True}
    await adapter.probe(router(ROUTER_LOADED))
    res = await adapter.probe(FakeClient({"/health": (200, b"{}"), "/v1/models": (500, b"")}))
    assert res.state == "ready" and res.models is None and res.resident is None  # no stale router answer


# -- through the gateway: selection, /v1/models, the gauge ---------------------------------------------

CONFIG = """
auth: {mode: none}
routing: {retries: 0}
backends:
  - {name: warm, engine: ollama, url: "http://warm.test:11434"}
  - {name: cold, engine: ollama, url: "http://cold.test:11434"}
  - {name: blind, engine: openai, url: "http://blind.test"}
models:
  - name: tiny
    deployments:
      - {backend: cold, model: tiny, format: gguf}
      - {backend: warm, model: tiny, format: gguf}
  - name: cold-only
    deployments: [{backend: cold, model: tiny, format: gguf}]
  - name: blind
    deployments: [{backend: blind, model: m, format: gguf}]
"""

HI = [{"role": "user", "content": "hi"}]
PS_TINY = {"name": "tiny:latest", "model": "tiny:latest", "size": 6537216, "expires_at": "2026-11-30T03:04:31Z"}


def engines() -> FakeUpstream:
    routes: dict[tuple[str, str], Any] = {}
    tags = {"models": [{"name": "tiny:latest", "model": "tiny:latest"}]}
    answer = {
        "model": "tiny",
        "created_at": "2026-11-30T02:59:45Z",
        "message": {"role": "assistant", "content": "ok"},
        "done": True,
        "done_reason": "stop",
        "prompt_eval_count": 5,
        "eval_count": 1,
    }
    for name, loaded in (("warm", [PS_TINY]), ("cold", [])):
        url = f"http://{name}.test:11434"
        routes[("GET", url + "/api/version")] = FakeAnswer.json({"version": "0.13.5"})
        routes[("GET", url + "/api/tags")] = FakeAnswer.json(tags)
        routes[("GET", url + "/api/ps")] = FakeAnswer.json({"models": loaded})
        routes[("POST", url + "/api/chat")] = FakeAnswer.json(answer)
    routes[("GET", "http://blind.test/v1/models")] = FakeAnswer.json({"data": [{"id": "m"}]})
    return FakeUpstream(routes, default=FakeAnswer.json({"error": "not found"}, status=404))


async def backends_chosen(client: httpx.AsyncClient, n: int) -> list[str]:
    """The backend the gateway chose for each of `n` chat requests to "tiny", sent one after another."""
    chosen = []
    for _ in range(n):
        r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": HI})
        assert r.status_code == 200, r.text
        chosen.append(r.headers["x-gateway-backend"])
    return chosen


async def test_the_resident_deployment_is_chosen_over_a_cold_one_whatever_the_rotation() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        chosen = await backends_chosen(client, 4)
    assert chosen == ["warm"] * 4


async def test_models_say_resident_where_known_and_the_gauge_exports_it() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        before = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        await probed(app, up)
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        one = (await client.get("/v1/models/cold-only")).json()
        metrics = (await client.get("/metrics")).text
    assert "resident" not in before["tiny"]  # not probed yet: unknown
    assert listed["tiny"]["resident"] is True  # one of its deployments has it loaded
    assert one["resident"] is False and one["ready"] is True  # live, but the next request loads it cold
    assert "resident" not in listed["blind"]
    assert 'gateway_deployment_resident{backend="warm",model="tiny",upstream_model="tiny"} 1.0' in metrics
    assert 'gateway_deployment_resident{backend="cold",model="tiny",upstream_model="tiny"} 0.0' in metrics
    assert 'gateway_deployment_resident{backend="blind"' not in metrics


async def test_prefer_resident_false_leaves_residency_out_of_the_choice() -> None:
    # the baseline bench/residency.py compares with: least load alone, so equal loads take turns
    up = engines()
    cfg = make_config(
        CONFIG.replace("routing: {retries: 0}", "routing: {retries: 0, prefer_resident: false}").replace(
            "  - name: tiny\n",
            "  - name: tiny\n    strategy: least_load\n",  # the baseline's strategy, named
        )
    )
    assert cfg.routing.prefer_resident is False and cfg.models[0].strategy == "least_load"
    async with gateway_client(cfg, upstream=up) as (client, app):
        await probed(app, up)
        chosen = await backends_chosen(client, 4)
        cold = (await client.get("/v1/models/cold-only")).json()
    assert sorted(chosen) == ["cold", "cold", "warm", "warm"]
    assert cold["resident"] is False  # what the probes learn is still reported
