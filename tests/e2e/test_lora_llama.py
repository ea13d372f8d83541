"""LoRA adapters as models on a REAL llama-server (issue 38 item 5): the engine is started with a tiny GGUF LoRA
adapter (`--lora FILE --lora-init-without-apply`, scripts/make_tiny_lora.py), the gateway serves it as the model
`tiny:styled` and asks for it per request with the body's `lora: [{id, scale}]` (adapters/lora.py; the id found
in the engine's `GET /lora-adapters`). At temperature 0 the adapter's reply differs from the base model's, and
the base model's stays the engine's own (no adapter applied); an adapter the engine was not started with is a
502 `adapter_load_failed`, an unknown one a 404 `model_not_found`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import engines_started
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import LlamaServer, RealEngine, tiny_lora
from tests.support.waiting import sample, scrape

pytestmark = pytest.mark.real_engine

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0}}
backends:
  - {{name: ls, engine: llama-server, url: "{url}", capacity: 1, queue_timeout_s: 60}}
models:
  - name: tiny
    deployments: [{{backend: ls, model: tiny-llama, format: gguf, capabilities: [chat]}}]
    adapters:
      - {{name: styled, path: "{lora}", aliases: [tiny-styled]}}
      - {{name: missing, path: /nowhere/missing.gguf}}
"""


@pytest.fixture(scope="module")
def llama_lora(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RealEngine, Path]]:
    servers: list[RealEngine] = []
    with engines_started(servers):
        lora = tiny_lora("gguf")
        eng = LlamaServer(
            parallel=1, ctx_size=512, workdir=tmp_path_factory.mktemp("llama-lora"),
            extra_args=("--lora", str(lora), "--lora-init-without-apply"),
        )  # fmt: skip
        servers.append(eng)
        eng.start()
        yield eng, lora


def chat(url: str, model: str, **extra: object) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "temperature": 0}
    return httpx.post(url + "/v1/chat/completions", json={**body, **extra}, timeout=60)


def reply(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_llama_server_serves_its_start_up_adapter_as_a_model(
    llama_lora: tuple[RealEngine, Path], tmp_path: Path
) -> None:
    eng, lora = llama_lora
    listing = httpx.get(eng.url + "/lora-adapters", timeout=10).json()
    assert [(e["id"], Path(e["path"]).name) for e in listing] == [(0, lora.name)]
    with GatewayProcess(CONFIG.format(url=eng.url, lora=lora), tmp_path) as gw:
        base = chat(gw.url, "tiny")
        styled = chat(gw.url, "tiny:styled")
        again = chat(gw.url, "tiny-styled")
        assert base.status_code == styled.status_code == again.status_code == 200, (base.text, styled.text)
        text = [r.json()["choices"][0]["message"]["content"] for r in (base, styled, again)]
        assert text[1] == text[2] != text[0]  # the adapter applied, the same at temperature 0
        assert styled.json()["model"] == "tiny:styled"
        # the engine itself: with the adapter at scale 0 it gives the gateway's base reply; asked with no `lora`
        # field, this build applies its start-up adapter (despite --lora-init-without-apply): hence the gateway's
        # explicit "none" for the model itself (adapters/lora.py)
        assert reply(chat(eng.url, "tiny-llama", lora=[{"id": 0, "scale": 0.0}])) == text[0]
        assert reply(chat(eng.url, "tiny-llama", lora=[{"id": 0, "scale": 1.0}])) == text[1]
        assert reply(chat(eng.url, "tiny-llama")) == text[1]

        missing = chat(gw.url, "tiny:missing")
        assert missing.status_code == 502 and missing.json()["error"]["code"] == "adapter_load_failed"
        unknown = chat(gw.url, "tiny:nope")
        assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "model_not_found"

        m = scrape(gw.url)
        assert sample(m, "gateway_lora_loads_total", backend="ls", adapter="styled") == 1
        assert sample(m, "gateway_lora_load_failures_total", backend="ls", adapter="missing") == 1
        assert sample(m, "gateway_lora_resident", backend="ls", adapter="styled") == 1
        ready = httpx.get(gw.url + "/readyz", timeout=10).json()["backends"]["ls"]["lora"]
        assert ready["adapters"] == {"styled": {"state": "ready", "in_flight": 0}}
