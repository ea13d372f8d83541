"""Residency: which models an engine has loaded, as its probe reads it (Ollama `/api/ps`, vLLM's sleep
state, the others loaded when ready), the deployment's view of it, selection preferring a loaded model
to a cold load, the `gateway_deployment_resident` gauge and `/v1/models` `resident`.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

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


async def test_the_resident_deployment_is_chosen_over_a_cold_one_whatever_the_rotation() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        chosen = []
        for _ in range(4):
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": HI})
            assert r.status_code == 200, r.text
            chosen.append(r.headers["x-gateway-backend"])
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
    cfg = make_config(CONFIG.replace("routing: {retries: 0}", "routing: {retries: 0, prefer_resident: false}"))
    assert cfg.routing.prefer_resident is False
    async with gateway_client(cfg, upstream=up) as (client, app):
        await probed(app, up)
        chosen = []
        for _ in range(4):
            r = await client.post("/v1/chat/completions", json={"model": "tiny", "messages": HI})
            assert r.status_code == 200, r.text
            chosen.append(r.headers["x-gateway-backend"])
        cold = (await client.get("/v1/models/cold-only")).json()
    assert sorted(chosen) == ["cold", "cold", "warm", "warm"]
    assert cold["resident"] is False  # what the probes learn is still reported
