"""Rerank and score through the gateway (engines played by a FakeUpstream): every rerank path reaches vLLM's
`/rerank` and llama-server's `/v1/rerank` with the engine's model name, the answer names the public model, score
reaches vLLM's `/score`, keys/models/bodies are checked before an engine is asked, refusals come back in OpenAI's
envelope, an unreachable engine is passed over, and a config may give the capabilities only to engines that serve
the routes."""

from __future__ import annotations

from typing import Any

import pytest

from llm_gateway.settings.loader import ConfigError
from tests.conftest import OTHER_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, refused

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
  - name: ranker
    deployments:
      - {backend: l, model: up-l, format: gguf, capabilities: [rerank]}
      - {backend: v, model: up-v, format: safetensors, capabilities: [rerank, score]}
  - name: on-vllm
    deployments: [{backend: v, model: up-v, format: safetensors, capabilities: [rerank, score]}]
  - name: chat-only
    deployments: [{backend: v, model: up-c, format: safetensors}]
"""

RERANK = {"query": "what is a panda?", "documents": ["a bear", "hello"], "top_n": 1}
RANKED = {
    "id": "rerank-1",
    "model": "up-v",
    "usage": {"prompt_tokens": 9, "total_tokens": 9},
    "results": [{"index": 0, "document": {"text": "a bear"}, "relevance_score": 0.9}],
}


async def post(up: FakeUpstream, path: str, body: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, _):
        r = await client.post(path, json=body, **kw)
    return r.status_code, r.json()


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_every_rerank_path_reaches_vllm_with_its_model_name(path: str) -> None:
    up = FakeUpstream({("POST", "http://vllm.test/rerank"): FakeAnswer.json(RANKED)})
    status, got = await post(up, path, {"model": "on-vllm", **RERANK})
    assert status == 200
    assert got == {**RANKED, "model": "on-vllm"}  # the engine's name for the weights stays behind
    assert up.calls[0].json() == {"model": "up-v", **RERANK}


async def test_llama_server_is_asked_on_its_v1_path() -> None:
    ranked = {"model": "up-l", "object": "list", "usage": {"prompt_tokens": 5, "total_tokens": 5}, "results": []}
    up = FakeUpstream({("POST", "http://llama.test/v1/rerank"): FakeAnswer.json(ranked)})
    status, got = await post(up, "/rerank", {"model": "ranker", **RERANK})
    assert (status, got["model"], got["object"]) == (200, "ranker", "list")
    assert up.calls[0].json() == {"model": "up-l", **RERANK}


async def test_an_unreachable_engine_is_passed_over() -> None:
    up = FakeUpstream(
        {
            ("POST", "http://llama.test/v1/rerank"): refused(),
            ("POST", "http://vllm.test/rerank"): FakeAnswer.json(RANKED),
        }
    )
    status, got = await post(up, "/v1/rerank", {"model": "ranker", **RERANK})
    assert (status, got["model"]) == (200, "ranker")
    assert [c.url for c in up.calls] == ["http://llama.test/v1/rerank", "http://vllm.test/rerank"]


@pytest.mark.parametrize("path", ["/score", "/v1/score"])
async def test_score_reaches_vllm(path: str) -> None:
    scored = {"id": "score-1", "object": "list", "created": 1, "model": "up-v", "data": [], "usage": {}}
    up = FakeUpstream({("POST", "http://vllm.test/score"): FakeAnswer.json(scored)})
    body = {"model": "on-vllm", "queries": "q", "documents": ["a", "b"]}
    status, got = await post(up, path, body)
    assert (status, got["model"]) == (200, "on-vllm")
    assert up.calls[0].json() == {**body, "model": "up-v"}


async def test_score_goes_only_to_a_deployment_with_the_capability() -> None:
    scored = {"object": "list", "model": "up-v", "data": [{"index": 0, "object": "score", "score": 0.5}]}
    up = FakeUpstream({("POST", "http://vllm.test/score"): FakeAnswer.json(scored)})
    status, _ = await post(up, "/score", {"model": "ranker", "text_1": "q", "text_2": "d"})
    assert status == 200
    assert [c.url for c in up.calls] == ["http://vllm.test/score"]  # llama-server's deployment has no `score`


async def test_keys_models_and_bodies_are_checked_before_an_engine() -> None:
    up = FakeUpstream()
    bob = {"authorization": f"Bearer {OTHER_KEY}"}
    assert (await post(up, "/rerank", {"model": "on-vllm", **RERANK}, headers=bob))[0] == 403
    status, got = await post(up, "/rerank", {"model": "nope", **RERANK})
    assert status == 404 and got["error"]["param"] == "model"
    status, got = await post(up, "/rerank", {"model": "chat-only", **RERANK})
    assert status == 400 and got["error"]["code"] == "capability_unavailable"
    status, got = await post(up, "/rerank", {"model": "on-vllm", "query": "q", "documents": []})
    assert status == 400 and got["error"]["param"] == "documents"
    status, got = await post(up, "/rerank", {"model": "on-vllm", **RERANK, "top_n": -1})
    assert status == 400 and got["error"]["param"] == "top_n"
    status, got = await post(up, "/score", {"model": "on-vllm", "queries": "q"})
    assert status == 400 and set(got["error"]) == {"message", "type", "param", "code"}
    assert (
        await post(up, "/score", {"model": "on-vllm", "text_1": "q", "text_2": "d"}, headers={"authorization": ""})
    )[0] == 401
    assert up.calls == []


async def test_an_engine_refusal_is_its_answer_in_openais_envelope() -> None:
    refusal = {"error": {"message": "The model does not support Rerank (Score) API", "type": "BadRequestError"}}
    up = FakeUpstream({("POST", "http://vllm.test/rerank"): FakeAnswer.json(refusal, 400)})
    status, got = await post(up, "/rerank", {"model": "on-vllm", **RERANK})
    assert status == 400 and "Rerank" in got["error"]["message"]
    assert set(got["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(("engine", "cap"), [("ollama", "rerank"), ("ollama", "score"), ("llama-server", "score")])
def test_only_engines_that_serve_the_routes_may_have_the_capability(engine: str, cap: str) -> None:
    text = f"""
    backends: [{{name: e, engine: {engine}, url: "http://e.test"}}]
    models:
      - name: m
        deployments: [{{backend: e, model: x, format: gguf, capabilities: [{cap}]}}]
    """
    with pytest.raises(ConfigError, match=f"cannot serve {cap}"):
        make_config(text)
