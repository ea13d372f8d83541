"""Anthropic's Messages passed through to an engine that serves it itself (vLLM), in-process, the engines
played by a FakeUpstream: the relay of Anthropic's event stream (bytes untouched but the model name; usage,
first output, text bytes and in-band errors read on the way), and the seam in the service: per attempt
the deployment's adapter decides between its engine's /v1/messages and the chat translation, so a
failover before the first byte may cross from one to the other; limits settle with the native usage; an
engine without the route is translated from then on; count_tokens is the engine's own where it has it.
Event shapes are the real vLLM 0.32's (tests/contract/test_native_messages.py checks them against it)."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from llm_gateway.adapters.anthropic_native import MessagesRelay
from llm_gateway.adapters.relay_base import MAX_EVENT_BYTES
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.errors import EngineErrorAnswer, UpstreamTimeout
from llm_gateway.types import BackendInfo, CallContext
from tests.conftest import TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, Stall, cut, refused

VLLM = "http://vllm.test"
LLAMA = "http://llama.test"
MESSAGES = {"model": "public-model", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}


def sse(name: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def start(model: str = "upstream-model", usage: dict[str, int] | None = None) -> bytes:
    message = {
        "id": "chatcmpl-ae58",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 11, "output_tokens": 0},
    }
    return sse("message_start", {"type": "message_start", "message": message})


def text_delta(text: str, index: int = 0) -> bytes:
    return sse(
        "content_block_delta",
        {"type": "content_block_delta", "delta": {"type": "text_delta", "text": text}, "index": index},
    )


BLOCK_START = sse(
    "content_block_start", {"type": "content_block_start", "content_block": {"type": "text", "text": ""}, "index": 0}
)
BLOCK_STOP = sse("content_block_stop", {"type": "content_block_stop", "index": 0})
STOP = sse("message_stop", {"type": "message_stop"})


def message_delta(output: int, usage: dict[str, int] | None = None) -> bytes:
    u = {"input_tokens": 11, **(usage or {}), "output_tokens": output}
    return sse(
        "message_delta",
        {"type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None}, "usage": u},
    )


def native_stream(*texts: str, usage: dict[str, int] | None = None) -> list[bytes]:
    return [
        start(usage=usage),
        BLOCK_START,
        *(text_delta(t) for t in texts),
        BLOCK_STOP,
        message_delta(len(texts)),
        STOP,
    ]


def ctx() -> CallContext:
    return CallContext("chat", "public-model", "upstream-model", True, True, "rid-1", native_api="messages")


def relay() -> MessagesRelay:
    return VLLMAdapter(BackendInfo("vllm-a", VLLM)).native_relay("messages", ctx())


def events(body: bytes | str) -> list[tuple[str, dict[str, Any]]]:
    text = body.decode() if isinstance(body, bytes) else body
    out = []
    for frame in text.split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


# -- the relay ----------------------------------------------------------------------------------------------


def test_the_relay_passes_events_untouched_but_the_model_and_reads_usage_and_output() -> None:
    r = relay()
    chunks = [start(usage={"input_tokens": 4, "cache_read_input_tokens": 7, "output_tokens": 0}), BLOCK_START]
    out = b"".join(r.feed(c) for c in chunks)
    assert not r.output_started  # message_start and an empty text block are no output yet
    assert events(out)[0][1]["message"]["model"] == "public-model"
    assert out.endswith(BLOCK_START)
    first = r.feed(text_delta("Hel"))
    assert first == text_delta("Hel") and r.output_started  # the delta's bytes as the engine sent them
    tail = [text_delta('lo "x"'), BLOCK_STOP, message_delta(2, {"input_tokens": 4, "cache_read_input_tokens": 7}), STOP]
    rest = b"".join(r.feed(c) for c in tail)
    assert rest == b"".join(tail)
    assert r.finish() == b"" and r.done and r.error is None
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (11, 2)  # type: ignore[union-attr]  # cached ones count
    assert (r.content_events, r.text_bytes) == (2, 3 + 8)  # as sent, escapes included


def test_the_relay_gives_the_same_bytes_whatever_the_chunking() -> None:
    body = b"".join(native_stream("a", "bc", "d")).replace(b"\n", b"\r\n")  # CRLF framing too
    whole, r = relay(), relay()
    at_once = whole.feed(body) + whole.finish()
    byte_by_byte = b"".join(r.feed(body[i : i + 1]) for i in range(len(body))) + r.finish()
    assert at_once == byte_by_byte
    assert [n for n, _ in events(at_once)] == ["message_start", "content_block_start"] + ["content_block_delta"] * 3 + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert r.usage is not None and r.usage.completion_tokens == 3 and r.error is None


def test_a_message_delta_without_input_tokens_takes_message_starts() -> None:
    r = relay()
    r.feed(start(usage={"input_tokens": 9, "output_tokens": 0}))
    r.feed(
        sse(
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 5}},
        )
    )
    assert r.usage is not None and (r.usage.prompt_tokens, r.usage.completion_tokens) == (9, 5)


def test_thinking_passes_through_as_the_engines_own_blocks_and_counts_as_output() -> None:
    # vLLM's order: a thinking block, its signature, stopped before the text block starts
    thinking = {"type": "thinking", "thinking": ""}

    def block_delta(delta: dict[str, str]) -> bytes:
        return sse("content_block_delta", {"type": "content_block_delta", "delta": delta, "index": 0})

    events_in = [
        start(),
        sse("content_block_start", {"type": "content_block_start", "content_block": thinking, "index": 0}),
        block_delta({"type": "thinking_delta", "thinking": "hmm"}),
        block_delta({"type": "signature_delta", "signature": "5f1e"}),
        BLOCK_STOP,
    ]
    r = relay()
    out = b"".join(r.feed(e) for e in events_in)
    assert out.endswith(b"".join(events_in[1:])) and r.output_started
    assert (r.content_events, r.text_bytes) == (2, 3)  # the signature is no generated text


def test_a_tool_use_block_is_output() -> None:
    r = relay()
    r.feed(start())
    block = {"type": "tool_use", "id": "chatcmpl-tool-1", "name": "get_weather", "input": {}}
    r.feed(sse("content_block_start", {"type": "content_block_start", "content_block": block, "index": 0}))
    assert r.output_started


def test_an_in_band_error_event_ends_the_stream_with_anthropics_envelope_and_the_gateways_message() -> None:
    r = relay()
    r.feed(start() + BLOCK_START + text_delta("a"))
    err = sse("error", {"type": "error", "error": {"type": "internal_error", "message": "engine exploded"}})
    out = r.feed(err + text_delta("never"))
    ((name, body),) = events(out)
    assert name == "error" and body["type"] == "error" and body["error"]["type"] == "api_error"
    assert "engine exploded" in body["error"]["message"] and "vllm-a" in body["error"]["message"]
    assert isinstance(r.error, EngineErrorAnswer) and r.error.status == 502
    assert r.feed(text_delta("more")) == b"" and r.finish() == b""


def test_a_stream_cut_before_message_stop_ends_with_an_error_event() -> None:
    r = relay()
    r.feed(b"".join(native_stream("a")[:3]))
    out = r.finish()
    ((name, body),) = events(out)
    assert name == "error" and "before the answer was complete" in body["error"]["message"]
    assert r.error is not None and r.usage is None and r.completion_estimate() == 1


def test_a_failure_after_the_first_byte_is_an_anthropic_error_event_by_its_kind() -> None:
    out = relay().fail(UpstreamTimeout("the engine sent nothing between chunks of its response"))
    assert events(out) == [
        (
            "error",
            {
                "type": "error",
                "error": {"type": "timeout_error", "message": "the engine sent nothing between chunks of its response"},
            },
        )
    ]


def test_an_event_past_the_cap_fails_the_stream() -> None:
    r = relay()
    out = r.feed(b"event: content_block_delta\ndata: " + b"x" * (MAX_EVENT_BYTES + 1))
    assert events(out)[0][0] == "error" and r.error is not None


def test_an_unterminated_last_event_is_taken_when_whole() -> None:
    r = relay()
    r.feed(b"".join(native_stream("a")[:-1]))
    assert r.feed(STOP.rstrip(b"\n")) == b""
    assert r.finish() == STOP and r.done and r.error is None


# -- the seam: native or translated, per attempt ---------------------------------------------------------------

CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}", limits: {{tpm: 10000}}}}
routing: {{retries: 2, backoff_base_ms: 0}}
backends:
  - name: vllm-a
    engine: vllm
    url: http://vllm.test
    api_key: vllm-key
    timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 30, total_s: 60}}
  - name: llama-b
    engine: llama-server
    url: http://llama.test
    api_key: llama-key
    timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 30, total_s: 60}}
models:
  - name: public-model
    strategy: priority
    deployments:
      - {{backend: {first}, model: {first_model}, format: {first_format}, priority: 0}}
      - {{backend: {second}, model: {second_model}, format: {second_format}, priority: 1}}
"""
NATIVE_FIRST = {
    "first": "vllm-a",
    "first_model": "upstream-model",
    "first_format": "safetensors",
    "second": "llama-b",
    "second_model": "llama-model",
    "second_format": "gguf",
}
CHAT_FIRST = {
    "first": "llama-b",
    "first_model": "llama-model",
    "first_format": "gguf",
    "second": "vllm-a",
    "second_model": "upstream-model",
    "second_format": "safetensors",
}


def config(order: dict[str, str] = NATIVE_FIRST) -> Any:
    return make_config(CONFIG.format(**order))


def native_message(**extra: Any) -> FakeAnswer:
    """vLLM's whole answer (it leaves out a null stop_sequence)."""
    return FakeAnswer.json(
        {
            "id": "chatcmpl-8c05",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "thinking", "thinking": "hmm", "signature": "5f1e"}, {"type": "text", "text": "hi"}],
            "model": "upstream-model",
            "stop_reason": "max_tokens",
            "usage": {"input_tokens": 11, "cache_read_input_tokens": 3, "output_tokens": 8},
            **extra,
        }
    )


def chat_whole() -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-7",
            "object": "chat.completion",
            "model": "llama-model",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "translated"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


def chat_stream() -> FakeAnswer:
    head = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "model": "llama-model"}

    def ev(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    return FakeAnswer.sse(
        ev([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]),
        ev([{"index": 0, "delta": {"content": "translated"}, "finish_reason": None}]),
        ev([{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        ev([], usage={"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}),
        b"data: [DONE]\n\n",
    )


async def test_a_whole_message_passes_through_to_the_engines_own_messages_api() -> None:
    up = FakeUpstream({("POST", f"{VLLM}/v1/messages"): native_message()})
    body = {
        **MESSAGES,
        "system": [{"type": "text", "text": "Be brief."}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json=body, headers={"x-request-id": "req-9"})
    assert r.status_code == 200, r.text
    assert r.json() == {
        "id": "msg_8c05",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "thinking", "thinking": "hmm", "signature": "5f1e"}, {"type": "text", "text": "hi"}],
        "model": "public-model",
        "stop_reason": "max_tokens",
        "usage": {"input_tokens": 11, "cache_read_input_tokens": 3, "output_tokens": 8},
        "stop_sequence": None,
    }
    assert r.headers["request-id"] == r.headers["x-request-id"] == "req-9"
    assert (r.headers["x-gateway-backend"], r.headers["x-gateway-engine"]) == ("vllm-a", "vllm")
    assert "x-gateway-overhead-ms" in r.headers
    (call,) = up.calls
    assert call.json() == {**body, "model": "upstream-model"}  # the client's own body; only the model rewritten
    assert call.headers["authorization"] == "Bearer vllm-key" and call.headers["x-request-id"] == "req-9"


async def test_a_stream_passes_through_and_settles_the_limits_with_the_engines_usage() -> None:
    # reserved: the estimate (16 + 5) // 4 + 1 = 6 plus max_tokens 100; settled with 11 + 3 cached + 2
    up = FakeUpstream(
        {
            ("POST", f"{VLLM}/v1/messages"): [
                FakeAnswer.sse(
                    *native_stream(
                        "Hel", "lo", usage={"input_tokens": 11, "cache_read_input_tokens": 3, "output_tokens": 0}
                    )
                ),
                native_message(),
            ]
        }
    )
    async with gateway_client(config(), upstream=up) as (client, _):
        r1 = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
        r2 = await client.post("/v1/messages", json=MESSAGES)
        metrics = (await client.get("/metrics")).text
    assert r1.status_code == 200 and r1.headers["content-type"].startswith("text/event-stream")
    evs = events(r1.text)
    assert (evs[0][1]["message"]["model"], evs[0][1]["message"]["id"]) == ("public-model", "msg_ae58")
    assert r1.content.endswith(b"".join(native_stream("Hel", "lo")[1:]))  # every later event byte for byte
    assert r1.headers["x-ratelimit-remaining-tokens"] == str(10000 - 106)
    assert r2.headers["x-ratelimit-remaining-tokens"] == str(10000 - 16 - 106)
    assert up.calls[0].json() == {**MESSAGES, "stream": True, "model": "upstream-model"}  # no stream_options added
    assert 'gateway_completion_tokens_total{backend="vllm-a",model="public-model"} 10.0' in metrics
    assert 'endpoint="messages",engine="vllm",model="public-model",outcome="success"' in metrics
    assert "gateway_time_to_first_token_seconds_count" in metrics


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_failover_before_the_first_byte_crosses_from_a_native_deployment_to_a_translating_one(
    stream: bool,
) -> None:
    up = FakeUpstream(
        {
            ("POST", f"{VLLM}/v1/messages"): refused(),
            ("POST", f"{LLAMA}/v1/chat/completions"): chat_stream() if stream else chat_whole(),
        }
    )
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "stream": stream})
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-backend"] == "llama-b"
    assert [c.url for c in up.calls] == [f"{VLLM}/v1/messages", f"{LLAMA}/v1/chat/completions"]
    assert up.calls[1].json()["messages"] == [{"role": "user", "content": "hello"}]  # the chat translation
    if stream:  # translated into Anthropic's events by the gateway (its ping, its msg_ id)
        evs = events(r.text)
        assert [n for n, _ in evs][:2] == ["message_start", "ping"]
        assert evs[0][1]["message"]["id"] == "msg_s" and evs[0][1]["message"]["model"] == "public-model"
        assert [e["delta"]["text"] for n, e in evs if n == "content_block_delta"] == ["translated"]
        assert evs[-2][1]["usage"]["output_tokens"] == 2
    else:
        assert r.json()["id"] == "msg_7" and r.json()["content"] == [{"type": "text", "text": "translated"}]
        assert r.json()["model"] == "public-model"


async def test_a_failover_from_a_translating_deployment_to_a_native_one_passes_the_answer_through() -> None:
    up = FakeUpstream(
        {
            ("POST", f"{LLAMA}/v1/chat/completions"): FakeAnswer.json({"error": {"message": "busy"}}, 503),
            ("POST", f"{VLLM}/v1/messages"): FakeAnswer.sse(*native_stream("x")),
        }
    )
    async with gateway_client(config(CHAT_FIRST), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
    assert r.status_code == 200 and r.headers["x-gateway-backend"] == "vllm-a"
    assert [n for n, _ in events(r.text)] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


async def test_an_engine_error_on_the_native_path_is_anthropics_envelope_with_its_status() -> None:
    vllm_400 = {
        "type": "error",
        "error": {"type": "BadRequestError", "message": "This model's maximum context length is 4096 tokens."},
    }
    up = FakeUpstream({("POST", f"{VLLM}/v1/messages"): FakeAnswer.json(vllm_400, 400)})
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json=MESSAGES)
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "maximum context length" in body["error"]["message"] and "vllm-a" in body["error"]["message"]
    assert len(up.calls) == 1  # a client error is not retried elsewhere


async def test_an_error_event_mid_stream_is_one_anthropic_error_event() -> None:
    err = sse("error", {"type": "error", "error": {"type": "internal_error", "message": "engine exploded"}})
    up = FakeUpstream({("POST", f"{VLLM}/v1/messages"): FakeAnswer.sse(start(), BLOCK_START, text_delta("a"), err)})
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
        metrics = (await client.get("/metrics")).text
    evs = events(r.text)
    assert [n for n, _ in evs] == ["message_start", "content_block_start", "content_block_delta", "error"]
    assert evs[-1][1]["error"]["type"] == "api_error" and "engine exploded" in evs[-1][1]["error"]["message"]
    assert 'outcome="stream_error"' in metrics


async def test_an_engine_that_drops_the_native_stream_gives_the_client_anthropics_error_event() -> None:
    up = FakeUpstream({("POST", f"{VLLM}/v1/messages"): FakeAnswer.sse(start(), BLOCK_START, text_delta("a"), cut())})
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
    evs = events(r.text)  # Anthropic's frames only: no OpenAI `data: {"error": ...}` nor `[DONE]`
    assert [n for n, _ in evs][-2:] == ["content_block_delta", "error"]
    assert evs[-1][1]["error"]["type"] == "api_error" and "closed the connection" in evs[-1][1]["error"]["message"]


async def test_an_engine_version_without_the_route_is_translated_from_then_on() -> None:
    up = FakeUpstream(
        {
            ("POST", f"{VLLM}/v1/messages"): FakeAnswer.json({"detail": "Not Found"}, 404),
            ("POST", f"{VLLM}/v1/chat/completions"): [chat_whole(), chat_whole()],
        }
    )
    async with gateway_client(config(), upstream=up) as (client, _):
        r1 = await client.post("/v1/messages", json=MESSAGES)
        r2 = await client.post("/v1/messages", json=MESSAGES)
    assert (r1.status_code, r2.status_code) == (200, 200)
    assert r1.json()["content"] == r2.json()["content"] == [{"type": "text", "text": "translated"}]
    assert r1.headers["x-gateway-backend"] == "vllm-a"  # the same deployment, asked again in chat
    assert [c.path for c in up.calls] == ["/v1/messages", "/v1/chat/completions", "/v1/chat/completions"]


async def test_a_block_the_engine_refuses_is_translated_instead() -> None:
    up = FakeUpstream({("POST", f"{VLLM}/v1/chat/completions"): chat_whole()})
    doc = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}
    body = {**MESSAGES, "messages": [{"role": "user", "content": [doc, {"type": "text", "text": "sum up"}]}]}
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert [c.path for c in up.calls] == ["/v1/chat/completions"]


async def test_count_tokens_is_the_engines_own_count_of_the_clients_body() -> None:
    up = FakeUpstream(
        {
            ("POST", f"{VLLM}/v1/messages/count_tokens"): FakeAnswer.json(
                {"input_tokens": 42, "context_management": {"original_input_tokens": 42}}
            )
        }
    )
    body = {"model": "public-model", "system": "Be brief.", "messages": [{"role": "user", "content": "hello"}]}
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200 and r.json() == {"input_tokens": 42}
    assert r.headers["x-gateway-token-count"] == "engine" and r.headers["x-gateway-backend"] == "vllm-a"
    (call,) = up.calls
    assert call.json() == {**body, "model": "upstream-model"} and call.headers["authorization"] == "Bearer vllm-key"


async def test_count_tokens_without_the_route_counts_the_chat_translation() -> None:
    up = FakeUpstream(
        {
            ("POST", f"{VLLM}/v1/messages/count_tokens"): FakeAnswer.json({"detail": "Not Found"}, 404),
            ("POST", f"{VLLM}/tokenize"): [FakeAnswer.json({"count": 9}), FakeAnswer.json({"count": 9})],
        }
    )
    body = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}]}
    async with gateway_client(config(), upstream=up) as (client, _):
        r1 = await client.post("/v1/messages/count_tokens", json=body)
        r2 = await client.post("/v1/messages/count_tokens", json=body)
    assert r1.json() == r2.json() == {"input_tokens": 9}
    assert [c.path for c in up.calls] == ["/v1/messages/count_tokens", "/tokenize", "/tokenize"]


async def test_a_client_that_leaves_mid_stream_closes_the_engines_native_stream() -> None:
    up = FakeUpstream(
        {("POST", f"{VLLM}/v1/messages"): FakeAnswer.sse(start(), BLOCK_START, text_delta("a"), Stall(60), STOP)}
    )
    async with gateway_client(config(), upstream=up) as (_, app):
        body = orjson.dumps({**MESSAGES, "stream": True})
        inbox = [{"type": "http.request", "body": body, "more_body": False}]
        gone = asyncio.Event()
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if inbox:
                return inbox.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(dict(message))

        headers = [
            (b"host", b"gateway.test"),
            (b"authorization", f"Bearer {TEST_KEY}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": "/v1/messages",
            "raw_path": b"/v1/messages",
            "query_string": b"",
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 1234),
            "server": ("gateway.test", 80),
        }
        task = asyncio.create_task(app(scope, receive, send))
        async with asyncio.timeout(10):
            while not any(b"text_delta" in m.get("body", b"") for m in sent):
                await asyncio.sleep(0.005)
        assert not up.responses[0].closed  # mid-generation: the engine's stream is open
        gone.set()  # the client leaves
        await asyncio.wait_for(task, 10)
    assert up.responses[0].dropped  # closed before its end: the engine sees its client go away
    assert not any(b"message_stop" in m.get("body", b"") for m in sent)


def test_only_the_adapters_that_declare_it_pass_messages_through() -> None:
    from llm_gateway.adapters.llama_server import LlamaServerAdapter
    from llm_gateway.adapters.sglang import SGLangAdapter

    info = BackendInfo("b", "http://b.test")
    assert VLLMAdapter(info).speaks_natively("messages") and VLLMAdapter(info).speaks_natively("count_tokens")
    for refused_by in (LlamaServerAdapter(info), SGLangAdapter(info)):
        assert not refused_by.speaks_natively("messages") and not refused_by.speaks_natively("count_tokens")
    with pytest.raises(NotImplementedError):
        LlamaServerAdapter(info).build_native("messages", MESSAGES, ctx())


async def test_the_openai_routes_never_go_native() -> None:
    up = FakeUpstream({("POST", f"{VLLM}/v1/chat/completions"): chat_whole()})
    chat = {"model": "public-model", "messages": [{"role": "user", "content": "hi"}]}
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert [c.path for c in up.calls] == ["/v1/chat/completions"]
