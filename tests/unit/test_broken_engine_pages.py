"""An engine's 5xx whose body is not an error of any known shape (a proxy's HTML page, an empty body, a
crashed server's text) is a broken engine: the documented 502, in the client's dialect, on every engine
kind (red-team L9: the generic `openai` adapter answered an HTML 500 with a gateway 500). A well-formed
engine error keeps its status, as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llm_gateway.adapters.error_bodies import EngineError, parse_error_body, upstream_error
from llm_gateway.settings import GatewayConfig
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

ENGINES = ("openai", "vllm", "llama-server", "sglang", "tabbyapi", "lmdeploy", "ollama")
NGINX_500 = (
    "<html>\r\n<head><title>500 Internal Server Error</title></head>\r\n<body>\r\n"
    "<center><h1>500 Internal Server Error</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)
PAGES = {
    "html 500": FakeAnswer.text(NGINX_500, 500, "text/html"),
    "html 503": FakeAnswer.text(
        NGINX_500.replace("500 Internal Server Error", "503 Service Unavailable"), 503, "text/html"
    ),
    "empty 500": FakeAnswer.text("", 500),
    "text 500": FakeAnswer.text("Internal Server Error", 500),
    "unknown json 500": FakeAnswer.json({"status": "crashed"}, 500),
}

CONFIG = """
server: {{access_log: false, data_dir: "{data_dir}"}}
auth: {{mode: keys, keys: [{{name: alice, sha256: "${{ALICE_SHA}}"}}]}}
backends:
  - name: gen
    engine: {engine}
    url: "http://engine.test"
    timeouts: {{connect_s: 1, first_byte_s: 2, idle_s: 2, total_s: 5}}
models:
  - name: m
    deployments: [{{backend: gen, model: tiny, format: {fmt}}}]
"""
FORMATS = {"ollama": "gguf", "llama-server": "gguf", "tabbyapi": "exl2"}


def config_for(engine: str, tmp_path: Path) -> GatewayConfig:
    return make_config(CONFIG.format(engine=engine, fmt=FORMATS.get(engine, "safetensors"), data_dir=tmp_path))


def chat(stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}


@pytest.mark.parametrize("page", list(PAGES))
@pytest.mark.parametrize("engine", ENGINES)
async def test_a_5xx_page_that_is_not_an_error_body_is_a_502_in_the_openai_dialect(
    engine: str, page: str, tmp_path: Path
):
    config = config_for(engine, tmp_path)
    async with gateway_client(config, upstream=FakeUpstream(default=PAGES[page])) as (client, _):
        for stream in (False, True):
            r = await client.post("/v1/chat/completions", json=chat(stream))
            assert r.status_code == 502, (engine, page, stream, r.status_code, r.text)
            err = r.json()["error"]
            assert err["type"] == "upstream_error" and "backend 'gen'" in err["message"]
            assert "<html>" not in err["message"]


@pytest.mark.parametrize("engine", ENGINES)
async def test_an_html_500_is_a_502_api_error_in_anthropics_dialect_and_on_responses(engine: str, tmp_path: Path):
    config = config_for(engine, tmp_path)
    async with gateway_client(config, upstream=FakeUpstream(default=PAGES["html 500"])) as (client, _):
        r = await client.post(
            "/v1/messages", json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 502, (engine, r.status_code, r.text)
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "api_error"
        r = await client.post("/v1/responses", json={"model": "m", "input": "hi", "max_output_tokens": 16})
        assert r.status_code == 502, (engine, r.status_code, r.text)
        assert r.json()["error"]["type"] == "upstream_error"


@pytest.mark.parametrize("engine", ENGINES)
async def test_a_well_formed_engine_500_keeps_its_status(engine: str, tmp_path: Path):
    """What the engines themselves answer for an internal failure (vLLM's `InternalServerError`, Ollama's
    `{"error": ...}`) is an error body: its status stays 500, as documented for engine errors."""
    body = (
        {"error": "llama runner process has terminated"}
        if engine == "ollama"
        else {"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError", "code": 500}}
    )
    config = config_for(engine, tmp_path)
    async with gateway_client(config, upstream=FakeUpstream(default=FakeAnswer.json(body, 500))) as (client, _):
        r = await client.post("/v1/chat/completions", json=chat())
        assert r.status_code == 500, (engine, r.text)


def test_parse_error_body_says_whether_the_body_was_an_error_body():
    assert parse_error_body(b'{"error":{"message":"x"}}').well_formed
    assert parse_error_body(b'{"detail":"x"}').well_formed
    assert parse_error_body(b'{"object":"error","message":"x"}').well_formed
    for body in (NGINX_500.encode(), b"", b"Internal Server Error", b'{"status":"crashed"}', b"[1]"):
        assert not parse_error_body(body).well_formed, body
    e = upstream_error("b", "openai", 500, EngineError("the engine answered with an HTML page", well_formed=False))
    assert (e.status, e.type, e.retryable) == (502, "upstream_error", False)
    e = upstream_error("b", "openai", 503, EngineError("an HTML page", well_formed=False))
    assert (e.status, e.retryable) == (502, True)  # still retried as the engine's 503 was
