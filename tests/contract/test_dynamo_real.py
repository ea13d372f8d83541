"""The real NVIDIA Dynamo frontend (ai-dynamo 1.6.1) with its simulated worker (`dynamo.mocker`), through the
`dynamo` adapter and a gateway process: readiness, the served model, load metrics, usage in whole and streamed
answers, and its error body for a model it does not serve. The mocker's tokens decode to no text, so the text
cases of the contract suite (content, stop strings) run against the Dynamo emulator instead
(tests/contract/test_contract.py); everything here is the real frontend's own answer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import orjson
import pytest

from llm_gateway.adapters.registry import adapter_for
from llm_gateway.routing.prober import BackendProbeClient
from llm_gateway.types import BackendInfo, ProbeResult
from llm_gateway.upstream.aiohttp_client import AiohttpUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
  - {{name: dyn, engine: dynamo, url: "{url}", probe: {{interval_s: 0.5}}}}
models:
  - {{name: m, deployments: [{{backend: dyn, model: "{model}", format: safetensors}}]}}
  - {{name: m-missing, deployments: [{{backend: dyn, model: "no-such-model", format: safetensors}}]}}
"""
MSG = [{"role": "user", "content": "Tell me about llamas."}]


@pytest.fixture(scope="module")
def gateway(dynamo_server: RealEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(url=dynamo_server.url, model=dynamo_server.model)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-dynamo"), startup_timeout=60) as gw:
        yield gw


def test_probe_reads_readiness_model_and_load(dynamo_server: RealEngine) -> None:
    async def probe() -> ProbeResult:
        from llm_gateway.routing.table import Backend
        from llm_gateway.settings import BackendConfig, ProbeConfig
        from llm_gateway.upstream.base import UpstreamTimeouts

        up = AiohttpUpstream()
        try:
            cfg = BackendConfig(name="b", engine="dynamo", url=dynamo_server.url, probe=ProbeConfig(timeout_s=30))
            adapter = adapter_for("dynamo", BackendInfo("b", dynamo_server.url, None))
            return await adapter.probe(BackendProbeClient(up, Backend(cfg, adapter, UpstreamTimeouts(30, 30, 30, 30))))
        finally:
            await up.aclose()

    first = asyncio.run(probe())
    assert first.state == "ready" and first.models is not None and dynamo_server.model in first.models
    assert first.context_lengths is None  # the mocker's cards say context_window 0: not a window
    # its dynamo_frontend_* gauges exist per model once the frontend has served that model: unknown before
    assert first.load is not None and first.load.running is None
    body = {"model": dynamo_server.model, "messages": MSG, "max_tokens": 2}
    assert httpx.post(dynamo_server.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
    r = asyncio.run(probe())
    assert r.load is not None and r.load.running == 0 and r.load.waiting == 0


def test_whole_and_streamed_answers_carry_the_engines_usage(gateway: GatewayProcess) -> None:
    body = {"model": "m", "messages": MSG, "max_tokens": 8}
    r = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["model"] == "m" and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 8 and r.headers["x-gateway-engine"] == "dynamo"
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    with httpx.Client(timeout=60) as c, c.stream("POST", gateway.url + "/v1/chat/completions", json=body) as s:
        assert s.status_code == 200
        events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = orjson.loads(events[-2])
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8


def test_a_model_it_does_not_serve_is_the_gateways_model_not_found(
    dynamo_server: RealEngine, gateway: GatewayProcess
) -> None:
    direct = httpx.post(dynamo_server.url + "/v1/chat/completions", json={"model": "x", "messages": MSG}, timeout=30)
    assert direct.status_code == 404 and direct.json() == {
        "message": "Model not found",
        "type": "Not Found",
        "code": 404,
    }
    r = httpx.post(gateway.url + "/v1/chat/completions", json={"model": "m-missing", "messages": MSG}, timeout=30)
    assert r.status_code in (502, 503), r.text  # the probe may already have taken the deployment out
    err = r.json()["error"]
    assert err["code"] in ("upstream_model_not_found", "no_healthy_backend"), err
    assert "no-such-model" in err["message"] or "dyn" in err["message"]
