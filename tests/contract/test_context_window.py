"""The context window, against the real llama-server (the suite's: `-c 16384 -np 1`) through the gateway
as a process: `/v1/models` shows the engine's own `n_ctx`, and a request whose prompt cannot fit is
refused by the gateway (400 `context_length_exceeded`, its estimate) without reaching the engine."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine
from tests.support.waiting import wait_until

pytestmark = pytest.mark.real_engine

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: llama, engine: llama-server, url: "{url}", api_key: "{key}", probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments: [{{backend: llama, model: "{model}", format: gguf}}]
"""
#: 200,000 bytes of non-blank text: at least 25,000 tokens by the gateway's floor, over 16,384
TOO_LONG = [{"role": "user", "content": "the " * 50_000}]


@pytest.fixture(scope="module")
def gw(llama_server: RealEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(url=llama_server.url, key=llama_server.api_key, model=llama_server.model)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-ctx")) as g:
        yield g


def _card(gw: GatewayProcess) -> dict[str, object]:
    card: dict[str, object] = httpx.get(gw.url + "/v1/models/tiny", timeout=5).json()
    return card


def _log_size(engine: RealEngine) -> int:
    return engine.log_path.stat().st_size


def test_models_show_the_engines_n_ctx_and_an_over_long_prompt_never_reaches_it(
    gw: GatewayProcess, llama_server: RealEngine
) -> None:
    props = httpx.get(llama_server.url + "/props", headers=llama_server.headers, timeout=10).json()
    n_ctx = props["default_generation_settings"]["n_ctx"]
    assert n_ctx == 16384  # one slot: the whole context
    wait_until(lambda: _card(gw).get("context_length") is not None, timeout=30, what="a probe learned the window")
    card = _card(gw)
    assert card["context_length"] == n_ctx and card["ready"] is True
    listed = httpx.get(gw.url + "/v1/models", timeout=5).json()["data"]
    assert [m["context_length"] for m in listed if m["id"] == "tiny"] == [n_ctx]

    # sent straight to the engine, the request shows in its log (so the log can tell an arrival)
    before = _log_size(llama_server)
    direct = httpx.post(
        llama_server.url + "/v1/chat/completions",
        headers=llama_server.headers,
        json={"model": llama_server.model, "messages": TOO_LONG, "max_tokens": 4},
        timeout=60,
    )
    assert direct.status_code == 400 and direct.json()["error"]["type"] == "exceed_context_size_error"
    wait_until(lambda: _log_size(llama_server) > before, timeout=10, what="the engine logged the direct request")

    # through the gateway: refused with its own estimate, and the engine hears nothing
    settled = _log_size(llama_server)
    r = httpx.post(
        gw.url + "/v1/chat/completions", json={"model": "tiny", "messages": TOO_LONG, "max_tokens": 4}, timeout=60
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded"
    assert f"{n_ctx} tokens" in err["message"] and "gateway's estimate" in err["message"]
    assert "x-gateway-backend" not in r.headers
    # a request that fits still goes through (and the engine logs it): the log would have shown ours
    ok = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        timeout=60,
    )
    assert ok.status_code == 200
    wait_until(
        lambda: b"stop processing" in llama_server.log_path.read_bytes()[settled:], timeout=10, what="the engine's log"
    )
    log = llama_server.log_path.read_bytes()[settled:]  # each request the engine takes launches one task
    assert log.count(b"processing task") == 1 and b"exceeds the available context size" not in log, log[-2000:]
