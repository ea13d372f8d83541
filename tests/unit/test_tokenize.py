"""`/tokenize` and `/detokenize` through the gateway (engines played by a FakeUpstream): vLLM gets the body in its
own shape with its model name, llama-server's shapes are translated both ways (a chat rendered by its template
first), keys and models are checked, and a config may give the capability only to engines that serve it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llm_gateway.settings.loader import ConfigError
from tests.conftest import OTHER_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
    - {name: bob, sha256: "${BOB_SHA}", models: [chat-only]}
backends:
  - {name: v, engine: vllm, url: "http://vllm.test"}
  - {name: l, engine: llama-server, url: "http://llama.test"}
models:
  - name: on-vllm
    deployments: [{backend: v, model: up-v, format: safetensors, capabilities: [chat, tokenize]}]
  - name: on-llama
    deployments: [{backend: l, model: up-l, format: gguf, capabilities: [chat, tokenize], context_length: 4096}]
  - name: chat-only
    deployments: [{backend: v, model: up-c, format: safetensors}]
"""


async def post(up: FakeUpstream, path: str, body: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, _):
        r = await client.post(path, json=body, **kw)
    return r.status_code, r.json()


async def test_vllm_gets_its_own_shape_with_its_model_name() -> None:
    answer = {"count": 2, "max_model_len": 2048, "tokens": [5, 6], "token_strs": None}
    up = FakeUpstream({("POST", "http://vllm.test/tokenize"): FakeAnswer.json(answer)})
    status, got = await post(up, "/tokenize", {"model": "on-vllm", "prompt": "hi there", "add_special_tokens": False})
    assert (status, got) == (200, answer)
    assert up.calls[0].json() == {"model": "up-v", "prompt": "hi there", "add_special_tokens": False}
    up = FakeUpstream({("POST", "http://vllm.test/detokenize"): FakeAnswer.json({"prompt": "hi"})})
    assert await post(up, "/detokenize", {"model": "on-vllm", "tokens": [5, 6]}) == (200, {"prompt": "hi"})
    assert up.calls[0].json() == {"model": "up-v", "tokens": [5, 6]}


async def test_llama_server_is_translated_both_ways() -> None:
    pieces = {"tokens": [{"id": 1, "piece": "<s>"}, {"id": 7, "piece": "hi"}]}
    up = FakeUpstream({("POST", "http://llama.test/tokenize"): FakeAnswer.json(pieces)})
    status, got = await post(up, "/tokenize", {"model": "on-llama", "prompt": "hi", "return_token_strs": True})
    assert status == 200
    assert got == {"count": 2, "max_model_len": 4096, "tokens": [1, 7], "token_strs": ["<s>", "hi"]}
    assert up.calls[0].json() == {"content": "hi", "add_special": True, "with_pieces": True}

    up = FakeUpstream(
        {
            ("POST", "http://llama.test/apply-template"): FakeAnswer.json({"prompt": "<user>hi</user>"}),
            ("POST", "http://llama.test/tokenize"): FakeAnswer.json({"tokens": [1, 2, 3]}),
        }
    )
    chat = {"model": "on-llama", "messages": [{"role": "user", "content": "hi"}]}
    status, got = await post(up, "/tokenize", chat)
    assert (status, got["count"], got["tokens"], got["token_strs"]) == (200, 3, [1, 2, 3], None)
    assert up.calls[0].json() == {"messages": [{"role": "user", "content": "hi"}]}
    assert orjson.loads(up.calls[1].body or b"")["content"] == "<user>hi</user>"

    up = FakeUpstream({("POST", "http://llama.test/detokenize"): FakeAnswer.json({"content": "hi"})})
    assert await post(up, "/detokenize", {"model": "on-llama", "tokens": [7]}) == (200, {"prompt": "hi"})
    assert up.calls[0].json() == {"tokens": [7]}


async def test_keys_models_and_bodies_are_checked() -> None:
    up = FakeUpstream()
    status, got = await post(
        up, "/tokenize", {"model": "on-vllm", "prompt": "x"}, headers={"authorization": f"Bearer {OTHER_KEY}"}
    )
    assert status == 403
    assert (await post(up, "/tokenize", {"model": "nope", "prompt": "x"}))[0] == 404
    status, got = await post(up, "/tokenize", {"model": "chat-only", "prompt": "x"})
    assert status == 400 and got["error"]["code"] == "capability_unavailable"
    assert (await post(up, "/tokenize", {"model": "on-vllm"}))[0] == 400
    assert (await post(up, "/detokenize", {"model": "on-vllm", "tokens": ["a"]}))[0] == 400
    assert (await post(up, "/tokenize", {"model": "on-vllm", "prompt": "x"}, headers={"authorization": ""}))[0] == 401
    assert up.calls == []


async def test_an_engine_refusal_is_its_answer() -> None:
    refusal = {"error": {"message": "token id 99999 out of range", "type": "BadRequestError", "code": 400}}
    up = FakeUpstream({("POST", "http://vllm.test/detokenize"): FakeAnswer.json(refusal, 400)})
    status, got = await post(up, "/detokenize", {"model": "on-vllm", "tokens": [99999]})
    assert status == 400 and "out of range" in got["error"]["message"]


@pytest.mark.parametrize("engine", ["ollama", "sglang"])
def test_only_engines_that_serve_the_routes_may_have_the_capability(engine: str) -> None:
    text = CONFIG.replace("engine: vllm", f"engine: {engine}").replace(
        "safetensors", "gguf" if engine == "ollama" else "safetensors"
    )
    with pytest.raises(ConfigError, match="cannot serve tokenize"):
        make_config(text)
