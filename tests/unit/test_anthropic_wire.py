"""Anthropic's wire facts, written once (llm_gateway/wire/anthropic.py) and read by both of their users: the
translation of the gateway's OpenAI answers (dialects/anthropic/) and the pass-through of an engine that serves
Messages itself (adapters/anthropic_native.py). Each test puts the two users side by side on the same input, so
a copy of a fact that drifts on one side fails here: the error type of a failure (before the answer, after its
first byte translated or native, or read back from the service's own OpenAI error event), the `msg_` id, and the
usage (what the translation writes, the pass-through bills)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llm_gateway import errors
from llm_gateway.adapters.anthropic_native import MessagesRelay
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.dialects.anthropic.response import to_message
from llm_gateway.dialects.anthropic.stream import StreamTranslator
from llm_gateway.errors import EngineErrorAnswer, GatewayError, StreamInterrupted, UpstreamTimeout
from llm_gateway.types import BackendInfo, CallContext, Usage
from llm_gateway.wire.anthropic import error_answer, error_status, error_type_of, message_id


def native_adapter() -> VLLMAdapter:
    return VLLMAdapter(BackendInfo("vllm-a", "http://vllm.test"))


def native_relay() -> MessagesRelay:
    ctx = CallContext("chat", "public-model", "upstream-model", True, True, "rid-1", native_api="messages")
    return native_adapter().native_relay("messages", ctx)


def _errors_of_the_tree() -> list[GatewayError]:
    """One instance of every error class errors.py defines, with its own status and code."""
    out: list[GatewayError] = []
    todo: list[type[GatewayError]] = [GatewayError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__ == errors.__name__:
            out.append(cls(f"{cls.__name__} happened"))
    return out


FAILURES: list[GatewayError] = [
    *_errors_of_the_tree(),
    EngineErrorAnswer("the engine failed", status=502),
    EngineErrorAnswer("the engine is busy", status=503, busy=True),
    EngineErrorAnswer("bad tool schema", status=400, code="engine_said_so"),
    StreamInterrupted("the engine's stream ended before the answer was complete"),
    UpstreamTimeout("the engine sent nothing between chunks of its response"),
]


def _one_event(raw: bytes) -> tuple[str, dict[str, Any]]:
    (frame,) = [f for f in raw.split(b"\n\n") if f]
    name, data = frame.split(b"\n", 1)
    return name.decode().removeprefix("event: "), orjson.loads(data.removeprefix(b"data: "))


@pytest.mark.parametrize("err", FAILURES, ids=lambda e: f"{type(e).__name__}-{e.status}")
def test_a_failure_has_one_anthropic_type_before_and_after_the_first_byte_translated_or_native(
    err: GatewayError,
) -> None:
    status, body = error_answer(err, "rid-1")
    before = orjson.loads(body)["error"]["type"]
    translated = _one_event(StreamTranslator((), 3).fail(err))
    native = _one_event(native_relay().fail(err))
    assert translated == native == ("error", {"type": "error", "error": {"type": before, "message": err.message}})
    assert (status, before) == error_status(err)


@pytest.mark.parametrize("err", _errors_of_the_tree(), ids=lambda e: type(e).__name__)
def test_the_services_own_error_event_reads_back_as_the_type_of_the_error_it_came_from(err: GatewayError) -> None:
    # a queued stream's failure reaches the translation as OpenAI's error event (service/queue_progress.py):
    # no status is left in it, its code finds it in the error tree
    assert error_type_of(err.envelope()["error"]) == error_status(err)[1]
    streamed = StreamTranslator((), 3).feed(err.sse_event() + errors.DONE)
    assert _one_event(streamed) == _one_event(StreamTranslator((), 3).fail(err))


@pytest.mark.parametrize(
    ("engine_id", "expected"),
    [
        ("chatcmpl-ae58", "msg_ae58"),
        ("ae58", "msg_ae58"),
        ("msg_01XY", "msg_01XY"),
        ("", None),
        (None, None),
        (7, None),
    ],
)
def test_the_translation_and_the_pass_through_give_one_message_id(engine_id: Any, expected: str | None) -> None:
    translated = to_message({"id": engine_id, "choices": []}, ())["id"]
    streamed = _one_event(
        StreamTranslator((), 3).event({"id": engine_id, "model": "m", "choices": []}).split(b"\n\n")[0]
    )
    answer = {"id": engine_id, "type": "message", "role": "assistant", "content": [], "usage": {"output_tokens": 1}}
    ctx = CallContext("chat", "public-model", "upstream-model", False, False, "rid-1", native_api="messages")
    native = orjson.loads(native_adapter().native_response_body("messages", orjson.dumps(answer), ctx)[0])["id"]
    engine_start = {"type": "message_start", "message": {**answer, "usage": {"input_tokens": 1, "output_tokens": 0}}}
    relayed = _one_event(native_relay().feed(b"event: message_start\ndata: " + orjson.dumps(engine_start) + b"\n\n"))
    ids = {translated, streamed[1]["message"]["id"], native, relayed[1]["message"]["id"]}
    if expected is not None:
        assert ids == {expected} == {message_id(engine_id)}
    else:  # none from the engine: a fresh one each time, always Anthropic's shape
        assert all(isinstance(i, str) and i.startswith("msg_") and len(i) == 28 for i in ids)


@pytest.mark.parametrize(
    "openai_usage",
    [
        {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        {"prompt_tokens": 10, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}},
        {"prompt_tokens": 3, "completion_tokens": 0, "prompt_tokens_details": {"cached_tokens": 9}},
    ],
)
def test_what_the_translation_writes_as_usage_the_pass_through_bills_as_the_engine_counted(
    openai_usage: dict[str, Any],
) -> None:
    billed = Usage(openai_usage["prompt_tokens"], openai_usage["completion_tokens"])
    written = to_message({"id": "c", "choices": [], "usage": openai_usage}, ())["usage"]
    answer = {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "usage": written}
    ctx = CallContext("chat", "public-model", "upstream-model", False, False, "rid-1", native_api="messages")
    assert native_adapter().native_response_body("messages", orjson.dumps(answer), ctx)[1] == billed
    # streamed: the translation's message_delta usage, as the native relay reads an engine's
    t = StreamTranslator((), 3)
    t.event({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]})
    t.event({"id": "c", "model": "m", "choices": [], "usage": openai_usage})
    frames = [f for f in t.end().split(b"\n\n") if f]
    delta = next(f for f in frames if f.startswith(b"event: message_delta"))
    r = native_relay()
    r.feed(b"event: message_start\ndata: " + orjson.dumps({"type": "message_start", "message": answer}) + b"\n\n")
    r.feed(delta + b"\n\n")
    assert r.usage == billed
