"""SSERelay: an engine's OpenAI-style SSE stream relayed to the client as clean OpenAI SSE."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import llm_gateway.adapters.relay_base as relay_base
import llm_gateway.adapters.sse_relay as sse_relay
import llm_gateway.adapters.sse_translated as sse_translated
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.sse_relay import DONE, SSERelay, has_output, usage_from
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.errors import EngineErrorAnswer, StreamInterrupted, UpstreamProtocolError
from llm_gateway.types import BackendInfo, CallContext, Usage
from llm_gateway.wire.sse_bytes import text_bytes


def ctx(public: str = "tiny-llama", upstream: str = "tiny-llama", wants_usage: bool = False) -> CallContext:
    return CallContext("chat", public, upstream, True, wants_usage, "req-123")


def plain_relay(c: CallContext | None = None, **kw) -> SSERelay:
    return SSERelay(c or ctx(), lambda obj: EngineErrorAnswer(f"frame: {obj['error']}", status=502, code="x"), **kw)


def run(relay, chunks: Iterable[bytes]) -> bytes:
    out = b"".join(relay.feed(c) for c in chunks)
    return out + relay.finish()


def events(out: bytes) -> list[bytes]:
    return [e for e in out.split(b"\n\n") if e]


def chunk(content: str | None = None, finish: str | None = None, model: str = "tiny-llama", **extra) -> bytes:
    delta = {} if content is None else {"content": content}
    obj = {
        "id": "chatcmpl-953a9c2d42d54ebb",
        "object": "chat.completion.chunk",
        "created": 1796007492,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def usage_chunk(p: int = 14, c: int = 8, model: str = "tiny-llama") -> bytes:
    obj = {
        "id": "chatcmpl-953a9c2d42d54ebb",
        "object": "chat.completion.chunk",
        "created": 1796007492,
        "model": model,
        "choices": [],
        "usage": {"prompt_tokens": p, "total_tokens": p + c, "completion_tokens": c},
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


ROLE = (
    b'data: {"id":"chatcmpl-953a9c2d42d54ebb","object":"chat.completion.chunk","created":1796007492,'
    b'"model":"tiny-llama","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
)
VLLM_STREAM = ROLE + chunk("J") + chunk("KL") + chunk("re", "length") + usage_chunk() + DONE


# -- fast path ---------------------------------------------------------------------------------------


def test_plain_content_events_pass_through_byte_for_byte():
    block = ROLE + chunk("Hello") + chunk(" world")
    relay = plain_relay()
    assert relay.feed(block) == block
    assert relay.content_events == 3


def test_a_partial_event_is_held_back_until_complete():
    relay = plain_relay()
    ev = chunk("Hi")
    assert relay.feed(ev[:20]) == b""
    assert relay.feed(ev[20:-1]) == b""
    assert relay.feed(ev[-1:]) == ev


def test_model_name_is_rewritten_to_the_public_name():
    relay = plain_relay(ctx(public="public-model", upstream="tiny-llama"))
    out = run(relay, [VLLM_STREAM])
    assert b'"model":"tiny-llama"' not in out
    assert out.count(b'"model":"public-model"') == 4  # role, 2 content, finish (usage chunk stripped)


def test_model_rewrite_handles_names_that_need_json_escaping():
    up = 'weird"name\\x'
    relay = plain_relay(ctx(public="pub", upstream=up))
    ev = chunk("a", model=up)
    assert orjson.loads(relay.feed(ev)[6:])["model"] == "pub"


def test_same_public_and_upstream_name_leaves_the_model_alone():
    relay = plain_relay(ctx(public="tiny-llama", upstream="tiny-llama"))
    assert relay.feed(chunk("a")) == chunk("a")


# -- usage -------------------------------------------------------------------------------------------


def test_usage_chunk_is_captured_and_stripped_when_the_client_did_not_ask():
    relay = plain_relay(ctx(wants_usage=False))
    out = run(relay, [VLLM_STREAM])
    assert relay.usage == Usage(14, 8)
    assert b'"usage"' not in out
    assert out == ROLE + chunk("J") + chunk("KL") + chunk("re", "length") + DONE


def test_usage_chunk_is_kept_when_the_client_asked_for_it():
    relay = plain_relay(ctx(wants_usage=True))
    out = run(relay, [VLLM_STREAM])
    assert relay.usage == Usage(14, 8)
    assert out == VLLM_STREAM


def test_usage_riding_on_a_content_chunk_is_captured_and_hidden_from_a_client_that_did_not_ask():
    ev = chunk("x", "stop", usage={"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4})
    relay = plain_relay(ctx(public="public-model", upstream="tiny-llama", wants_usage=False))
    out = relay.feed(ev)
    assert orjson.loads(out[6:]) == orjson.loads(chunk("x", "stop", model="public-model")[6:])
    assert out.endswith(b"\n\n")
    assert (relay.usage, relay.content_events) == (Usage(3, 1), 1)


def test_usage_riding_on_a_finish_chunk_is_split_into_openais_shape_for_a_client_that_asked():
    u = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    relay = plain_relay(ctx(public="public-model", upstream="tiny-llama", wants_usage=True))
    out = relay.feed(chunk("x", "stop", usage=u))
    first, second = (orjson.loads(e[6:]) for e in events(out))
    assert first == orjson.loads(chunk("x", "stop", model="public-model")[6:])
    assert second == {**orjson.loads(chunk("x", "stop", model="public-model")[6:]), "choices": [], "usage": u}
    assert (relay.usage, relay.content_events) == (Usage(3, 1), 1)


def test_tabby_spaced_json_finish_on_the_usage_chunk_relays_cleanly():
    # TabbyAPI: json.dumps style (a space after ':'), CRLF framing, finish reason riding on the usage chunk
    tabby = TabbyAPIAdapter(BackendInfo("tb", "http://tb:5000"))
    relay = tabby.relay(ctx(public="public-model", upstream="Qwen3-8B-exl3", wants_usage=False))
    content = (
        b'data: {"id": "chatcmpl-1", "model": "Qwen3-8B-exl3", "choices": [{"index": 0, '
        b'"delta": {"content": "Hi"}, "finish_reason": null}]}'
    )
    last = (
        b'data: {"id": "chatcmpl-1", "model": "Qwen3-8B-exl3", "choices": [{"index": 0, "delta": {}, '
        b'"finish_reason": "stop"}], "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}'
    )
    out = run(relay, [content + b"\r\n\r\n" + b": ping\r\n\r\n" + last + b"\r\n\r\n"])
    evs = events(out)
    assert [orjson.loads(e[6:])["model"] for e in evs[:-1]] == ["public-model", "public-model"]
    assert orjson.loads(evs[1][6:])["choices"][0]["finish_reason"] == "stop"
    assert b'"usage"' not in out and evs[-1] == b"data: [DONE]"
    assert (relay.usage, relay.error) == (Usage(5, 1), None)


def test_renames_still_apply_to_a_chunk_that_carries_usage():
    u = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    ev = b'data: {"model":"m","choices":[{"index":0,"delta":{"reasoning":"hm"},"finish_reason":null}],'
    relay = vllm_relay()
    out = relay.feed(ev + b'"usage":' + orjson.dumps(u) + b"}\n\n")
    assert orjson.loads(out[6:])["choices"][0]["delta"] == {"reasoning_content": "hm"}


def test_finish_renames_still_apply_to_a_chunk_that_carries_usage():
    relay = LMDeployAdapter(BackendInfo("lm", "http://lm:23333")).relay(ctx())
    out = relay.feed(chunk(None, "parse_error", usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}))
    assert orjson.loads(out[6:])["choices"][0]["finish_reason"] == "stop"


def test_vllm_continuous_usage_stats_are_hidden_from_a_client_that_did_not_ask():
    usage = {"prompt_tokens": 14, "total_tokens": 15, "completion_tokens": 1}
    stream = chunk("a", usage=usage) + chunk("b", "length", usage={**usage, "completion_tokens": 2}) + DONE
    relay = plain_relay(ctx(wants_usage=False))
    out = run(relay, [stream])
    assert b'"usage"' not in out
    assert [orjson.loads(e[6:])["choices"][0]["delta"] for e in events(out)[:-1]] == [
        {"content": "a"},
        {"content": "b"},
    ]
    assert relay.usage == Usage(14, 2)


def test_usage_null_on_content_chunks_is_not_usage():
    ev = chunk("x", usage=None)
    relay = plain_relay()
    assert relay.feed(ev) == ev
    assert relay.usage is None
    assert relay.content_events == 1


def test_the_last_usage_reported_wins():
    relay = plain_relay()
    run(relay, [usage_chunk(1, 1), usage_chunk(10, 20), DONE])
    assert relay.usage == Usage(10, 20)


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({"usage": {"prompt_tokens": 5, "completion_tokens": 7}}, Usage(5, 7)),
        ({"usage": {"prompt_tokens": 5}}, None),
        ({"usage": {"prompt_tokens": "5", "completion_tokens": 7}}, None),
        ({"usage": None}, None),
        ({}, None),
    ],
)
def test_usage_from_reads_only_integer_prompt_and_completion_counts(obj, expected):
    assert usage_from(obj) == expected


def test_usage_total_is_the_sum():
    assert Usage(14, 8).total_tokens == 22


# -- [DONE] and the end of the stream ----------------------------------------------------------------


def test_done_is_forwarded_once_and_anything_after_it_is_dropped():
    relay = plain_relay()
    out = relay.feed(chunk("a", "stop") + DONE + chunk("late"))
    assert out == chunk("a", "stop") + DONE
    assert relay.feed(chunk("later")) == b""
    assert relay.finish() == b""
    assert relay.done is True


def test_stream_with_a_finish_reason_but_no_done_gets_done_at_the_end():
    relay = plain_relay()
    out = run(relay, [chunk("a"), chunk(None, "stop")])
    assert out == chunk("a") + chunk(None, "stop") + DONE
    assert relay.error is None


def test_stream_cut_before_any_finish_reason_ends_with_an_error_event():
    relay = plain_relay()
    out = run(relay, [ROLE, chunk("partial answ")])
    evs = events(out)
    assert evs[:2] == [ROLE[:-2], chunk("partial answ")[:-2]]
    err = orjson.loads(evs[2][6:])
    assert err == {
        "error": {
            "message": "the engine's stream ended before the answer was complete",
            "type": "upstream_error",
            "param": None,
            "code": "stream_interrupted",
        }
    }
    assert evs[3] == b"data: [DONE]"
    assert isinstance(relay.error, StreamInterrupted)


def test_empty_stream_is_an_interrupted_stream():
    relay = plain_relay()
    out = run(relay, [])
    assert out == StreamInterrupted("the engine's stream ended before the answer was complete").sse_event() + DONE


def test_truncated_last_event_is_never_forwarded():
    relay = plain_relay()
    cut = chunk("b", "stop")[:-15]
    out = run(relay, [chunk("a"), cut])
    assert (
        out == chunk("a") + StreamInterrupted("the engine's stream ended in the middle of an event").sse_event() + DONE
    )


def test_done_without_its_trailing_blank_line_still_ends_the_stream():
    relay = plain_relay()
    assert run(relay, [chunk("a"), b"data: [DONE]"]) == chunk("a") + DONE
    assert relay.done is True and relay.error is None


def test_complete_last_event_without_blank_line_is_forwarded_then_the_cut_is_reported():
    relay = plain_relay()
    out = run(relay, [chunk("a") + chunk("b")[:-2]])
    cut = StreamInterrupted("the engine's stream ended before the answer was complete").sse_event()
    assert out == chunk("a") + chunk("b") + cut + DONE


def test_unterminated_final_finish_chunk_ends_cleanly_with_done():
    relay = plain_relay()
    out = run(relay, [chunk("a"), chunk(None, "stop")[:-2]])
    assert out == chunk("a") + chunk(None, "stop") + DONE
    assert relay.error is None


def test_trailing_whitespace_after_the_last_event_is_harmless():
    relay = plain_relay()
    assert run(relay, [chunk("a", "stop") + DONE + b"\n\n\n"]) == chunk("a", "stop") + DONE


def test_a_finish_reason_written_with_a_space_after_the_colon_also_counts_as_finished():
    relay = plain_relay()
    spaced = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
    assert run(relay, [chunk("a"), spaced]) == chunk("a") + spaced + DONE
    assert relay.error is None


# -- framing: CRLF, comments, multi-line data ----------------------------------------------------------


def test_crlf_framing_is_relayed_as_lf():
    crlf = (chunk("a") + chunk(None, "stop") + DONE).replace(b"\n", b"\r\n")
    relay = plain_relay()
    assert run(relay, [crlf]) == chunk("a") + chunk(None, "stop") + DONE


def test_ping_comments_are_dropped():
    stream = b": ping - 2026-11-30 03:00:00\r\n\r\n" + chunk("a").replace(b"\n", b"\r\n")
    stream += b": ping\r\n\r\n" + chunk(None, "stop").replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n"
    relay = plain_relay()
    out = run(relay, [stream])
    assert out == chunk("a") + chunk(None, "stop") + DONE
    assert relay.content_events == 2


def test_an_event_split_over_several_data_lines_is_joined():
    relay = plain_relay()
    out = relay.feed(b'data: {"choices":[{"index":0,"delta":{"content":"a"},\ndata: "finish_reason":null}]}\n\n')
    assert out == b'data: {"choices":[{"index":0,"delta":{"content":"a"},\n"finish_reason":null}]}\n\n'
    assert orjson.loads(out[6:-2])["choices"][0]["delta"] == {"content": "a"}


def test_data_field_without_a_space_is_accepted():
    relay = plain_relay()
    assert relay.feed(b'data:{"choices":[]}\n\n') == b'data: {"choices":[]}\n\n'


def test_events_with_extra_fields_keep_only_their_data():
    relay = plain_relay()
    out = relay.feed(b'event: message\nid: 7\ndata: {"choices":[]}\n\n')
    assert out == b'data: {"choices":[]}\n\n'


@pytest.mark.parametrize("bad", [b'data: {"a":1} trailing\n\n', b'data: {"a":1\n\n'])
def test_a_lone_event_that_opens_like_an_object_but_does_not_close_like_one_is_parsed_not_passed(bad: bytes):
    # the one-event block's shape test: it starts with `data: {` and must end with `}`
    relay = plain_relay()
    assert relay.feed(ROLE) == ROLE
    out = relay.feed(bad)
    assert out == UpstreamProtocolError("the engine sent an SSE event that is not valid JSON").sse_event() + DONE


def test_an_event_without_data_is_dropped():
    relay = plain_relay()
    assert relay.feed(b"event: keepalive\n\n") == b""
    assert relay.error is None


def test_an_event_that_is_not_json_ends_the_stream_with_a_protocol_error():
    relay = plain_relay()
    out = relay.feed(b"data: {not json\n\n" + chunk("after"))
    assert out == UpstreamProtocolError("the engine sent an SSE event that is not valid JSON").sse_event() + DONE
    assert isinstance(relay.error, UpstreamProtocolError)
    assert relay.feed(chunk("more")) == b""


def test_an_event_that_is_json_but_not_an_object_is_a_protocol_error():
    relay = plain_relay()
    out = relay.feed(b"data: [1, 2]\n\n")
    assert out == UpstreamProtocolError("the engine sent an SSE event that is not a JSON object").sse_event() + DONE


def test_an_oversized_event_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(relay_base, "MAX_EVENT_BYTES", 64)
    relay = plain_relay()
    out = relay.feed(b"data: " + b"x" * 100)
    assert out == UpstreamProtocolError("the engine sent an SSE event over 64 bytes").sse_event() + DONE


# -- in-band errors ----------------------------------------------------------------------------------


def vllm_relay(c: CallContext | None = None) -> SSERelay:
    return VLLMAdapter(BackendInfo("gpu-1", "http://gpu-1:8000")).relay(c or ctx())


def test_in_band_error_frame_becomes_one_openai_error_event_and_done():
    relay = vllm_relay()
    frame = (
        b'data: {"error":{"message":"EngineCore encountered an issue.","type":"InternalServerError",'
        b'"param":null,"code":500}}\n\n'
    )
    out = run(relay, [chunk("a"), frame, DONE])
    assert events(out) == [
        chunk("a")[:-2],
        b'data: {"error":{"message":"backend \'gpu-1\' (vllm) failed mid-stream: EngineCore encountered an issue.",'
        b'"type":"upstream_error","param":null,"code":"upstream_stream_error"}}',
        b"data: [DONE]",
    ]
    assert isinstance(relay.error, EngineErrorAnswer)
    assert relay.error.code == "upstream_stream_error"


def test_events_before_an_error_in_the_same_block_are_still_forwarded():
    relay = plain_relay()
    out = relay.feed(chunk("a") + b'data: {"error":"boom"}\n\n' + chunk("b"))
    evs = events(out)
    assert evs[0] == chunk("a")[:-2]
    assert orjson.loads(evs[1][6:])["error"]["message"] == "frame: boom"
    assert evs[2:] == [b"data: [DONE]"]


def test_error_frame_without_done_from_llama_server_gets_exactly_one_done():
    relay = plain_relay()
    out = run(relay, [chunk("a"), b'data: {"error":{"code":500,"message":"oops","type":"server_error"}}\n\n'])
    assert out.count(b"[DONE]") == 1
    assert out.endswith(DONE)


def test_a_chunk_with_both_choices_and_an_error_key_is_content_not_an_error():
    relay = plain_relay()
    ev = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}],"error":null}\n\n'
    assert relay.feed(ev) == ev
    assert relay.error is None


def test_sglang_client_error_frame_keeps_its_400_status():
    relay = SGLangAdapter(BackendInfo("sg", "http://sg:30000")).relay(ctx())
    frame = (
        b'data: {"error":{"object":"error","message":"max_tokens is too large","type":"BadRequestError",'
        b'"param":null,"code":400}}\n\n'
    )
    relay.feed(frame)
    assert relay.error is not None
    assert (relay.error.status, relay.error.type) == (400, "invalid_request_error")


def test_tabby_abort_frame_is_a_mid_stream_failure():
    relay = TabbyAPIAdapter(BackendInfo("tb", "http://tb:5000")).relay(ctx())
    frame = b'data: {"error":{"message":"Chat completion aborted. Please check the server console.","trace":null}}'
    out = run(relay, [chunk("a").replace(b"\n", b"\r\n"), frame + b"\r\n\r\n"])
    assert relay.error is not None and relay.error.status == 502
    assert out.endswith(DONE) and out.count(b"[DONE]") == 1
    assert b"Chat completion aborted" in out


# -- finish reasons ----------------------------------------------------------------------------------


def test_error_finish_reason_fails_the_stream():
    relay = SGLangAdapter(BackendInfo("sg", "http://sg:30000")).relay(ctx())
    out = run(relay, [chunk("a"), chunk(None, "abort")])
    assert out == chunk("a") + (
        StreamInterrupted("the engine ended the generation with finish_reason 'abort'").sse_event() + DONE
    )
    assert isinstance(relay.error, StreamInterrupted)


def test_error_finish_reason_arriving_after_a_normal_finish_in_another_choice_still_fails():
    relay = LMDeployAdapter(BackendInfo("lm", "http://lm:23333")).relay(ctx())
    out = run(relay, [chunk("a", "stop"), chunk(None, "error"), DONE])
    assert b"finish_reason 'error'" in out
    assert out.count(b"[DONE]") == 1


def test_normal_finish_reasons_are_unaffected_by_error_reasons():
    relay = SGLangAdapter(BackendInfo("sg", "http://sg:30000")).relay(ctx())
    assert run(relay, [chunk("a"), chunk(None, "stop"), DONE]) == chunk("a") + chunk(None, "stop") + DONE


def test_non_openai_finish_reason_is_renamed():
    relay = LMDeployAdapter(BackendInfo("lm", "http://lm:23333")).relay(ctx())
    out = run(relay, [chunk("a"), chunk(None, "parse_error"), DONE])
    assert out == chunk("a") + chunk(None, "stop") + DONE


def test_reasoning_field_is_renamed_to_the_configured_one():
    relay = vllm_relay()
    ev = b'data: {"choices":[{"index":0,"delta":{"reasoning":"hmm"},"finish_reason":null}]}\n\n'
    assert relay.feed(ev) == ev.replace(b'"reasoning":', b'"reasoning_content":')


# -- output_started: the first generated output (the service's time to first token) --------------------

SPACED_ROLE = b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
SPACED_HI = b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]}\n\n'


def delta_event(delta: bytes) -> bytes:
    return b'data: {"choices":[{"index":0,"delta":' + delta + b',"finish_reason":null}]}\n\n'


def test_role_only_and_empty_chunks_do_not_start_the_output():
    relay = plain_relay()
    for ev in (ROLE, chunk(""), chunk(None), SPACED_ROLE, delta_event(b'{"tool_calls":[]}'), b": ping\n\n"):
        relay.feed(ev)
        assert relay.output_started is False
    assert relay.error is None
    assert relay.feed(chunk("J")) == chunk("J")
    assert relay.output_started is True


@pytest.mark.parametrize(
    "ev",
    [
        chunk("J"),
        chunk("]"),  # a value that happens to start like an empty list is still text
        chunk('"'),
        SPACED_HI,
        delta_event(b'{"reasoning_content":"hmm"}'),
        delta_event(b'{"reasoning_content": "hmm"}'),
        delta_event(b'{"reasoning":"hmm"}'),
        delta_event(b'{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}'),
        delta_event(b'{"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}'),
        b'data: {"choices":[{"index":0,"text":"once","finish_reason":null}]}\n\n',
        b'data: {"choices": [{"index": 0, "text": "once", "finish_reason": null}]}\n\n',
    ],
)
def test_the_first_text_reasoning_or_tool_call_starts_the_output(ev: bytes):
    relay = plain_relay()
    relay.feed(ROLE)
    assert relay.output_started is False
    assert relay.feed(ev)
    assert relay.output_started is True


def test_output_started_in_both_json_spacing_styles_and_stays_set():
    relay = make_relay(CASES["tabby_spaced"][1])
    assert relay.feed(SPACED_ROLE.replace(b"\n", b"\r\n")) and relay.output_started is False
    relay.feed(SPACED_HI.replace(b"\n", b"\r\n"))
    assert relay.output_started is True
    relay.feed(chunk(None, "stop"))
    assert relay.output_started is True


def test_renamed_reasoning_starts_the_output():
    relay = vllm_relay()  # "reasoning" -> the configured "reasoning_content" on the way out
    relay.feed(b'data: {"choices":[{"index":0,"delta":{"reasoning":"hmm"},"finish_reason":null}]}\n\n')
    assert relay.output_started is True


def test_output_on_the_slow_path_and_in_an_unterminated_last_event_counts():
    relay = plain_relay(ctx(wants_usage=True))
    relay.feed(ROLE + chunk("a", usage={"prompt_tokens": 1, "completion_tokens": 1}))  # parsed event by event
    assert relay.output_started is True
    last = plain_relay()
    assert last.feed(ROLE + chunk("a")[:-2]) == ROLE
    assert last.output_started is False
    assert last.finish().startswith(chunk("a"))
    assert last.output_started is True


def test_a_stream_that_fails_before_any_output_never_starts_it():
    relay = plain_relay()
    run(relay, [ROLE, b'data: {"error":{"message":"\\"content\\":\\"x","code":500}}\n\n'])
    assert relay.error is not None and relay.output_started is False
    cut = plain_relay()
    run(cut, [ROLE])
    assert cut.error is not None and cut.output_started is False


# -- split invariance --------------------------------------------------------------------------------

TABBY_CRLF = (
    b": ping - 2026-11-30 03:00:00.000000\r\n\r\n"
    + (ROLE + chunk("He") + chunk("llo")).replace(b"\n", b"\r\n")
    + b": ping\r\n\r\n"
    + (chunk(None, "stop") + usage_chunk(5, 2) + DONE).replace(b"\n", b"\r\n")
)
ERROR_MID = chunk("a") + chunk("b") + b'data: {"error":{"message":"boom","code":500}}\n\n' + DONE
NO_DONE_CUT = ROLE + chunk("a") + chunk("b")[:-9]
NO_DONE_FINISHED = ROLE + chunk("a") + chunk(None, "length")
MULTILINE = b'data: {"choices":[{"index":0,\ndata: "delta":{"content":"z"},"finish_reason":"stop"}]}\n\n' + DONE
LMDEPLOY = chunk("x") + chunk(None, "parse_error") + DONE
SGLANG_ABORT = chunk("x") + chunk(None, "abort") + chunk("never") + DONE
_U = {"prompt_tokens": 14, "total_tokens": 15, "completion_tokens": 1}
TABBY_SPACED = (
    b": ping\r\n\r\n"
    b'data: {"id": "c1", "model": "Qwen3-8B-exl3", "choices": [{"index": 0, "delta": {"content": "Hi"}, '
    b'"finish_reason": null}]}\r\n\r\n'
    b'data: {"id": "c1", "model": "Qwen3-8B-exl3", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], '
    b'"usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}\r\n\r\n'
    b"data: [DONE]\r\n\r\n"
)
CONTINUOUS_USAGE = chunk("a", usage=_U) + chunk("b") + chunk(None, "stop", usage=_U) + usage_chunk(14, 2) + DONE

CASES = {
    "vllm": (VLLM_STREAM, dict(upstream="tiny-llama", public="public-model")),
    "vllm_usage": (VLLM_STREAM, dict(wants_usage=True)),
    "tabby_crlf": (TABBY_CRLF, {}),
    "error_mid": (ERROR_MID, {}),
    "no_done_cut": (NO_DONE_CUT, {}),
    "no_done_finished": (NO_DONE_FINISHED, {}),
    "multiline": (MULTILINE, {}),
    "lmdeploy": (LMDEPLOY, {"adapter": "lmdeploy"}),
    "sglang_abort": (SGLANG_ABORT, {"adapter": "sglang"}),
    "tabby_spaced": (TABBY_SPACED, {"adapter": "tabbyapi", "upstream": "Qwen3-8B-exl3", "public": "pm"}),
    "tabby_spaced_usage": (TABBY_SPACED, {"adapter": "tabbyapi", "wants_usage": True}),
    "continuous_usage": (CONTINUOUS_USAGE, dict(upstream="tiny-llama", public="public-model")),
}


def make_relay(opts: dict) -> SSERelay:
    opts = dict(opts)
    adapter = opts.pop("adapter", "vllm")
    cls = {"vllm": VLLMAdapter, "lmdeploy": LMDeployAdapter, "sglang": SGLangAdapter, "tabbyapi": TabbyAPIAdapter}[
        adapter
    ]
    return cls(BackendInfo("b", "http://b")).relay(ctx(**opts))


def outcome(relay: SSERelay, chunks: Iterable[bytes]) -> tuple:
    out = run(relay, chunks)
    err = relay.error.code if relay.error else None
    return out, relay.usage, relay.content_events, err


def split_at(data: bytes, points: Iterable[int]) -> list[bytes]:
    cuts = [0, *sorted(points), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(cuts)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_single_split_point_gives_the_same_output_as_feeding_whole(name: str):
    data, opts = CASES[name]
    whole = outcome(make_relay(opts), [data])
    for i in range(len(data) + 1):
        assert outcome(make_relay(opts), [data[:i], data[i:]]) == whole, f"split at {i}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_byte_by_byte_feeding_gives_the_same_output_as_feeding_whole(name: str):
    data, opts = CASES[name]
    whole = outcome(make_relay(opts), [data])
    assert outcome(make_relay(opts), [data[i : i + 1] for i in range(len(data))]) == whole


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(CASES)), data=st.data())
def test_any_set_of_split_points_gives_the_same_output(name: str, data: st.DataObject):
    stream, opts = CASES[name]
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    whole = outcome(make_relay(opts), [stream])
    assert outcome(make_relay(opts), split_at(stream, points)) == whole


def test_whole_stream_outcomes_are_what_each_case_means():
    # guards the split tests against comparing two equally wrong outputs
    assert outcome(make_relay(CASES["vllm"][1]), [VLLM_STREAM])[1:] == (Usage(14, 8), 4, None)
    assert outcome(make_relay({}), [TABBY_CRLF])[1:] == (Usage(5, 2), 4, None)
    assert outcome(make_relay({}), [ERROR_MID])[3] == "upstream_stream_error"
    assert outcome(make_relay({}), [NO_DONE_CUT])[3] == "stream_interrupted"
    assert outcome(make_relay({}), [NO_DONE_FINISHED])[0].endswith(chunk(None, "length") + DONE)
    assert outcome(make_relay({"adapter": "sglang"}), [SGLANG_ABORT])[3] == "stream_interrupted"
    assert b"never" not in outcome(make_relay({"adapter": "sglang"}), [SGLANG_ABORT])[0]
    tabby = outcome(make_relay(CASES["tabby_spaced"][1]), [TABBY_SPACED])
    assert (tabby[0].count(b'"pm"'), b"Qwen3" in tabby[0], tabby[1:]) == (2, False, (Usage(5, 1), 2, None))
    tabby_u = outcome(make_relay(CASES["tabby_spaced_usage"][1]), [TABBY_SPACED])
    assert (tabby_u[0].count(b'"usage"'), tabby_u[0].count(b"data: "), tabby_u[3]) == (1, 4, None)
    cont = outcome(make_relay({}), [CONTINUOUS_USAGE])
    assert (b'"usage"' in cont[0], cont[1], cont[2]) == (False, Usage(14, 2), 3)


@pytest.mark.parametrize("name", sorted(CASES))
def test_output_started_is_set_by_the_feed_that_first_relays_output(name: str):
    data, opts = CASES[name]
    whole = make_relay(opts)
    run(whole, [data])
    relay, seen = make_relay(opts), b""
    for i in range(len(data)):
        out = relay.feed(data[i : i + 1])
        if relay.output_started and not has_output(seen):
            assert has_output(out)  # set on the very feed that passed the first output on
        seen += out
        assert relay.output_started is has_output(seen)
    relay.finish()
    assert relay.output_started is whole.output_started


# -- the learnt envelope (one token's event, the commonest block) ---------------------------------------


def no_envelope(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sse_relay, "_MAX_LEARNS", 0)
    monkeypatch.setattr(sse_translated, "_MAX_LEARNS", 0)


def event_by_event(relay: SSERelay, stream: bytes) -> tuple:
    """Feed one event per call, as an engine's chunks arrive; everything the relay reports."""
    evs = [e + b"\n\n" for e in stream.split(b"\n\n") if e]
    out = b"".join(relay.feed(e) for e in evs) + relay.finish()
    err = relay.error.code if relay.error else None
    return out, relay.usage, relay.content_events, relay.text_bytes, relay.output_started, err


def test_ordinary_token_events_go_through_the_envelope_unchanged():
    relay = make_relay({})
    for e in (ROLE, chunk("a"), chunk("b")):
        relay.feed(e)
    assert relay._env is not None  # learnt from the first ordinary event after the output started
    ev = chunk("the next token")
    out = relay.feed(ev)
    assert out is ev  # passed on as it came: no copy, no rewrite
    assert (relay.content_events, relay.text_bytes) == (4, 2 + len("the next token"))


@pytest.mark.parametrize("end", ["finish", "engine error", "done"])
def test_nothing_passes_the_envelope_once_the_relay_has_ended(end: str):
    # the envelope's path tests only that an envelope is set: ending the relay, however it ends, must unset it
    relay = make_relay({})
    for e in (ROLE, chunk("a"), chunk("b")):
        relay.feed(e)
    assert relay._env is not None
    if end == "finish":  # a clean end: the finish reason seen, then the engine's end of body
        relay.feed(chunk(finish="stop"))
        relay.finish()
    elif end == "engine error":
        relay._fail(StreamInterrupted("cut"))
    else:
        relay.feed(DONE)
    assert relay.feed(chunk("late")) == b"" and relay.finish() == b""
    assert relay.content_events == (4 if end == "finish" else 3)


def test_a_token_after_part_of_an_event_is_joined_to_it_not_passed_by_the_envelope():
    relay = make_relay({})
    for e in (ROLE, chunk("a"), chunk("b")):
        relay.feed(e)
    whole = chunk("c")
    assert relay.feed(whole[:10]) == b""  # held over
    assert relay.feed(whole[10:] + chunk("d")) == whole + chunk("d")
    assert relay._env is not None  # nothing held: the envelope again
    assert relay.feed(chunk("e")) == chunk("e")


def test_the_envelope_swaps_the_public_model_name_and_field_names():
    relay = make_relay(dict(upstream="tiny-llama", public="public-model"))
    for e in (ROLE, chunk("a"), chunk("b")):
        relay.feed(e)
    assert relay._env is not None and relay._env[2] is not None
    assert relay.feed(chunk("c")) == chunk("c", model="public-model")


def test_an_event_that_hides_a_member_in_its_text_leaves_the_envelope():
    relay = make_relay({})
    for e in (ROLE, chunk("a"), chunk("b")):
        relay.feed(e)
    # valid JSON whose "text" runs from the content string through a top-level usage to a string after it
    sneaky = chunk("x").replace(
        b'"content":"x"', b'"content":"x"}}],"usage":{"prompt_tokens":3,"completion_tokens":4},"w":[{"d":{"c":"y"'
    )
    orjson.loads(sneaky[6:])
    relay.feed(sneaky)
    assert relay.usage == Usage(3, 4)  # parsed, not passed over as text


@pytest.mark.parametrize(
    "text",
    [b"a\nb", b"a\r\nb", b"a\rb", b"ab\\", b'a\\"b', b"a\\nb"],
    ids=["raw-lf", "raw-crlf", "raw-cr", "trailing-backslash", "escaped-quote", "escaped-lf"],
)
def test_text_with_line_breaks_quotes_or_a_trailing_backslash_is_relayed_as_without_the_envelope(text: bytes):
    # the envelope passes an event over only when reading it could not tell anything else: raw line
    # breaks (SSE splits there, CRLF is normalised), a quote or a trailing backslash (the string would end
    # or run on) must be read as the relay without an envelope reads them
    bad = chunk("x").replace(b'"content":"x"', b'"content":"' + text + b'"')
    stream = ROLE + chunk("a") + chunk("b") + bad + chunk("c") + chunk(None, "stop") + DONE
    fast = event_by_event(make_relay({}), stream)
    with pytest.MonkeyPatch.context() as mp:
        no_envelope(mp)
        assert fast == event_by_event(make_relay({}), stream)


def test_two_events_in_one_block_never_pass_as_one_envelope():
    relay = make_relay({})
    for e in (ROLE, chunk("a"), chunk("b")):
        relay.feed(e)
    relay.feed(chunk("c") + chunk(None, "stop"))
    assert relay.content_events == 5 and relay.finish() == DONE  # the finish in the second event was seen


@pytest.mark.parametrize(
    ("old", "straddles"),
    [
        (b'"reasoning":', False),  # needs a quote right after "reasoning": the text has none
        (b'"model":"tiny"', False),
        (b"plain", True),  # no quote: could be inside the text
        (b'ab"},"logprobs"', True),  # begins in the text, ends in the suffix
        (b'"content":"ab"}', True),  # begins in the prefix, runs through the text into the suffix
        (b'"content":"ab', True),  # begins in the prefix, ends in the text
    ],
)
def test_a_swap_that_could_reach_into_the_text_is_found(old: bytes, straddles: bool):
    pre = b'data: {"model":"tiny","choices":[{"delta":{"content":"'
    suf = b'"},"logprobs":null}]}\n\n'
    assert sse_translated._straddles(old, pre, suf) is straddles
    assert sse_translated._straddles_near(old, pre[-len(old) :], suf[: len(old)]) is straddles


def test_a_swap_reaching_from_the_prefix_into_the_text_keeps_the_relay_off_the_learnt_envelope():
    # '"content":"ab' ends in the text: an envelope learnt around it would pass a later "ab..." unswapped
    relay = plain_relay(replacements=((b'"content":"ab', b'"content":"XY'),))
    out = run(relay, [ROLE, chunk("zz"), chunk("zz"), chunk("abc"), chunk("zab"), chunk(None, "stop")])
    assert b'"content":"XYc"' in out and b'"content":"zab"' in out and b'"content":"abc"' not in out


_SWAP_BYTES = st.lists(st.sampled_from([b'"', b"a", b":", b"}", b"{"]), max_size=14).map(b"".join)


@settings(max_examples=400, deadline=None)
@given(old=_SWAP_BYTES.filter(bool), pre=_SWAP_BYTES, suf=_SWAP_BYTES)
def test_whether_a_swap_straddles_depends_only_on_the_ends_as_long_as_it(old: bytes, pre: bytes, suf: bytes):
    # what `_learn` relies on to ask the memo with the ends alone: a stream's ids lie beyond them
    pre, suf = b'x"' + pre + b'"', b'"' + suf
    n = len(old)
    assert sse_translated._straddles_near(old, pre[-n:], suf[:n]) is sse_translated._straddles(old, pre, suf)


_TEXTS = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    texts=st.lists(_TEXTS, min_size=1, max_size=12),
    created_changes=st.sets(st.integers(0, 11)),
    renamed=st.booleans(),
    reasoning_at=st.sets(st.integers(0, 11)),
    end=st.sampled_from(["stop", "abort", "cut", "error"]),
)
def test_event_by_event_feeding_is_the_same_with_and_without_the_envelope(
    texts, created_changes, renamed, reasoning_at, end
):
    stream = ROLE
    for i, t in enumerate(texts):
        ev = chunk(t)
        if i in created_changes:
            ev = ev.replace(b"1796007492", b"1796007493")
        if i in reasoning_at:
            ev = ev.replace(b'"content":', b'"reasoning":')
        stream += ev
    stream += {
        "stop": chunk(None, "stop") + usage_chunk() + DONE,
        "abort": chunk(None, "abort") + DONE,
        "cut": b"",
        "error": b'data: {"error":{"message":"boom","code":500}}\n\n',
    }[end]
    opts = dict(upstream="tiny-llama", public="public-model") if renamed else {}
    fast = event_by_event(make_relay(opts), stream)
    with pytest.MonkeyPatch.context() as mp:
        no_envelope(mp)
        assert fast == event_by_event(make_relay(opts), stream)


_TEXT_KEYS = ("content", "text", "reasoning_content", "reasoning", "arguments")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.sampled_from((*_TEXT_KEYS, "role", "id", "contents", "text_x", "reasoning_contentx")),
            st.text(alphabet=st.sampled_from('ab "\\\n\t/é{}:,\x01'), max_size=30),
        ),
        max_size=6,
    ),
    st.booleans(),
)
def test_text_bytes_counts_each_text_string_as_encoded(fields: list[tuple[str, str]], spaced: bool) -> None:
    """The text counted is every content/text/reasoning/arguments string, escapes as sent, and nothing else:
    the count equals the encoded length of those strings whatever quotes, backslashes or look-alike keys they
    hold, in orjson's compact form and in json.dumps' spaced one."""

    def encode(v: object) -> bytes:
        return json.dumps(v, ensure_ascii=False).encode() if spaced else orjson.dumps(v)

    data = encode([{key: value} for key, value in fields])
    assert text_bytes(data) == sum(len(encode(v)) - 2 for k, v in fields if k in _TEXT_KEYS)
