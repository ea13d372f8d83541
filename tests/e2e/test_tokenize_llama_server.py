"""`/tokenize` and `/detokenize` through the gateway as a real process to the real `llama-server` with the tiny
model: the ids are llama-server's own (asked directly for comparison), with its special tokens as a generation
adds them, and detokenizing them gives the text back."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

pytestmark = pytest.mark.real_engine

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: llama, engine: llama-server, url: "{url}", api_key: {key}, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments: [{{backend: llama, model: {model}, format: gguf, capabilities: [chat, tokenize]}}]
"""


def test_tokenize_and_detokenize_against_real_llama_server(llama_server: RealEngine, tmp_path: Path) -> None:
    text = "hello world, tokenized"
    own = httpx.post(
        llama_server.url + "/tokenize", json={"content": text, "add_special": True}, headers=llama_server.headers
    ).json()["tokens"]
    cfg = CONFIG.format(url=llama_server.url, key=llama_server.api_key, model=llama_server.model)
    with GatewayProcess(cfg, tmp_path) as gw:
        r = httpx.post(gw.url + "/tokenize", json={"model": "tiny", "prompt": text, "return_token_strs": True})
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["tokens"] == own and got["count"] == len(own)
        assert got["max_model_len"] is not None and got["max_model_len"] > 0  # the window llama-server reports
        assert len(got["token_strs"]) == len(own)
        back = httpx.post(gw.url + "/detokenize", json={"model": "tiny", "tokens": own})
        assert back.status_code == 200 and text in back.json()["prompt"]
        chat = httpx.post(gw.url + "/tokenize", json={"model": "tiny", "messages": [{"role": "user", "content": text}]})
        assert chat.status_code == 200 and chat.json()["count"] > len(own)  # the chat template's tokens too
