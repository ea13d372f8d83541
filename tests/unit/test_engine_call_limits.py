"""The key's limits on the routes that ask an engine for something other than a generation (service/engine_call.py;
engines played by a FakeUpstream): tokenize, detokenize, rerank, score and audio are each one request against the
key's requests per minute (the one past it is a 429 that never reaches the engine), counted in the metrics as its
endpoint; rerank and score are also charged the prompt tokens the engine reports against the key's tokens per
minute and token budget, reserved at an estimate first, and counted as the request's prompt tokens in the metrics."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}", {limits}}}
backends:
  - {{name: v, engine: vllm, url: "http://vllm.test"}}
models:
  - name: m
    deployments: [{{backend: v, model: up, format: safetensors, capabilities: [tokenize, rerank, score, audio]}}]
usage: {{ledger: true}}
"""
RANKED = {"id": "r", "model": "up", "usage": {"prompt_tokens": 9, "total_tokens": 9}, "results": []}
SCORED = {"id": "s", "object": "list", "model": "up", "data": [], "usage": {"prompt_tokens": 9, "total_tokens": 9}}
AUDIO_FORM = httpx.Request("POST", "http://x/", data={"model": "m"}, files={"file": ("a.wav", bytes(256), "audio/wav")})
#: route -> (the engine's path, its answer, the request: json or (form bytes, content type))
ROUTES: dict[str, tuple[str, dict[str, Any], Any]] = {
    "/tokenize": ("/tokenize", {"count": 1, "max_model_len": 8, "tokens": [5]}, {"model": "m", "prompt": "hi"}),
    "/detokenize": ("/detokenize", {"prompt": "hi"}, {"model": "m", "tokens": [5]}),
    "/v1/rerank": ("/rerank", RANKED, {"model": "m", "query": "what is a panda?", "documents": ["a bear", "hello"]}),
    "/v1/score": ("/score", SCORED, {"model": "m", "queries": "what is a panda?", "documents": ["a bear", "hello"]}),
    "/v1/audio/transcriptions": (
        "/v1/audio/transcriptions",
        {"text": "hi", "usage": {"type": "duration", "seconds": 1}},
        (AUDIO_FORM.read(), AUDIO_FORM.headers["content-type"]),
    ),
}


async def send(client: httpx.AsyncClient, path: str, request: Any) -> httpx.Response:
    if isinstance(request, tuple):
        return await client.post(path, content=request[0], headers={"content-type": request[1]})
    return await client.post(path, json=request)


@pytest.mark.parametrize("path", list(ROUTES))
async def test_each_call_is_one_request_against_the_keys_rpm(path: str) -> None:
    engine_path, answer, request = ROUTES[path]
    up = FakeUpstream({("POST", "http://vllm.test" + engine_path): FakeAnswer.json(answer)})
    async with gateway_client(make_config(CONFIG.format(limits="limits: {rpm: 2}")), upstream=up) as (client, _):
        first = await send(client, path, request)
        second = await send(client, path, request)
        third = await send(client, path, request)
        metrics = (await client.get("/metrics")).text
    assert (first.status_code, second.status_code) == (200, 200), first.text
    assert third.status_code == 429 and third.json()["error"]["type"] == "requests", third.text
    assert len(up.calls) == 2  # the refused one never reached the engine
    endpoint = path.rsplit("/", 1)[1]  # the metrics count each call as its route's endpoint
    served = f'backend="v",endpoint="{endpoint}",engine="vllm",model="m",outcome="success",status_class="2xx"}} 2.0'
    refused = f'endpoint="{endpoint}",engine="none",model="m",outcome="rate_limited",status_class="4xx"}} 1.0'
    assert served in metrics and refused in metrics, [x for x in metrics.splitlines() if endpoint in x]


# the body's estimate: ("what is a panda?" x 2 + "a bear" + "hello") = 43 characters -> 43 // 4 + 1 = 11 tokens
@pytest.mark.parametrize("path", ["/v1/rerank", "/v1/score"])
@pytest.mark.parametrize(
    ("limits", "refusal"),
    [("limits: {tpm: 20}", "tokens"), ("budget: {tokens: 20, period: day}", "insufficient_quota")],
)
async def test_rerank_and_score_are_charged_the_prompt_tokens_the_engine_reports(
    path: str, limits: str, refusal: str
) -> None:
    engine_path, answer, request = ROUTES[path]
    up = FakeUpstream({("POST", "http://vllm.test" + engine_path): FakeAnswer.json(answer)})
    async with gateway_client(make_config(CONFIG.format(limits=limits)), upstream=up) as (client, _):
        # 9 reported: the 11 reserved become 9; then 9 + 11 fit in 20 (settled to 18); then 18 + 11 do not
        first = await send(client, path, request)
        second = await send(client, path, request)
        third = await send(client, path, request)
        metrics = (await client.get("/metrics")).text
    assert (first.status_code, second.status_code) == (200, 200), first.text
    assert third.status_code == 429 and third.json()["error"]["type"] == refusal, third.text
    assert len(up.calls) == 2
    assert 'gateway_prompt_tokens_total{backend="v",model="m"} 18.0' in metrics


async def test_an_answer_without_usage_is_charged_the_estimate() -> None:
    engine_path, answer, request = ROUTES["/v1/rerank"]
    unreported = {k: v for k, v in answer.items() if k != "usage"}
    up = FakeUpstream({("POST", "http://vllm.test" + engine_path): FakeAnswer.json(unreported)})
    async with gateway_client(make_config(CONFIG.format(limits="limits: {tpm: 22}")), upstream=up) as (client, _):
        statuses = [(await send(client, "/v1/rerank", request)).status_code for _ in range(3)]
        metrics = (await client.get("/metrics")).text
    assert statuses == [200, 200, 429]  # 11 each, as estimated: 22 fit in 22, 33 do not
    assert 'gateway_prompt_tokens_total{backend="v",model="m"} 22.0' in metrics
