"""What the gateway asks of an engine's connection after a stream: `Connection: close` exactly where the engine's
adapter says the engine closes it after a streamed answer anyway (llama-server: tests/contract/test_keep_alive.py
checks that on the real server), so that the upstream client never pools a connection the engine is closing; a
whole answer, and every other engine's stream, keep their connection."""

from __future__ import annotations

import pytest

from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

CONFIG = """
server: {access_log: false}
auth: {mode: keys, keys: [{name: alice, sha256: "${ALICE_SHA}"}]}
backends:
  - {name: e, engine: ENGINE, url: "http://engine.test"}
models:
  - name: m
    deployments: [{backend: e, model: up, format: FORMAT}]
"""
CHUNK = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up",'
    b'"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
)
WHOLE = {
    "id": "c",
    "object": "chat.completion",
    "model": "up",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}


@pytest.mark.parametrize(
    ("engine", "fmt", "closes"),
    [("llama-server", "gguf", True), ("vllm", "safetensors", False), ("sglang", "safetensors", False)],
)
@pytest.mark.parametrize("stream", [True, False])
async def test_a_stream_asks_for_connection_close_only_where_the_engine_closes_after_one(
    engine: str, fmt: str, closes: bool, stream: bool
) -> None:
    up = FakeUpstream(default=FakeAnswer.sse(CHUNK) if stream else FakeAnswer.json(WHOLE))
    async with gateway_client(make_config(CONFIG.replace("ENGINE", engine).replace("FORMAT", fmt)), upstream=up) as (
        client,
        _,
    ):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
    (call,) = up.calls_to("http://engine.test/v1/chat/completions")
    assert call.headers.get("connection") == ("close" if closes and stream else None)
