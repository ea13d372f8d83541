"""The Anthropic Messages dialect, translation only (llm_gateway/dialects/anthropic): requests into OpenAI chat bodies,
whole OpenAI answers into Anthropic messages, OpenAI SSE into Anthropic's event sequence, and errors into
Anthropic's envelope and statuses. Exact JSON and exact events throughout."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gateway.dialects.anthropic.request import to_chat
from llm_gateway.dialects.anthropic.response import message_bytes, to_message
from llm_gateway.dialects.anthropic.stream import StreamTranslator
from llm_gateway.errors import (
    AuthenticationFailed,
    EngineErrorAnswer,
    GatewayError,
    InvalidRequest,
    ModelNotFound,
    NoHealthyBackend,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    RateLimited,
    ServiceUnavailable,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from llm_gateway.wire.anthropic import error_answer, error_type_of

# -- requests ----------------------------------------------------------------------------------------------


def test_a_plain_request_becomes_a_chat_body() -> None:
    req = to_chat({"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]})
    assert req.body == {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
    assert req.stream is False and req.stop_sequences == ()
    assert req.prompt_estimate == (16 + 2) // 4 + 1


def test_every_supported_field_maps() -> None:
    req = to_chat(
        {
            "model": "m@gguf",
            "max_tokens": 100.0,
            "system": [
                {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "Answer in English."},
            ],
            "messages": [{"role": "user", "content": "Hi"}],
            "stop_sequences": ["END", "\n\nHuman:"],
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "metadata": {"user_id": "user-7"},
            "stream": True,
            "service_tier": "auto",
            "tools": [
                {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
                    "cache_control": {"type": "ephemeral"},
                }
            ],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "output_config": {"effort": "high"},
        }
    )
    assert req.body == {
        "model": "m@gguf",
        "messages": [
            {"role": "system", "content": "You are terse.\n\nAnswer in English."},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 100,
        "stream": True,
        "stream_options": {"include_usage": True},
        "stop": ["END", "\n\nHuman:"],
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "user": "user-7",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                    "description": "Weather for a city",
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "parallel_tool_calls": False,
        "chat_template_kwargs": {"enable_thinking": True},
    }
    assert type(req.body["max_tokens"]) is int
    assert req.stream is True and req.stop_sequences == ("END", "\n\nHuman:")


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: dict[str, Any]) -> None:
    body = to_chat(
        {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": choice}
    )
    assert {k: body.body[k] for k in expected} == expected


def test_a_system_message_between_the_turns() -> None:
    req = to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "system": "First.",
            "messages": [
                {"role": "user", "content": "a"},
                {"role": "system", "content": [{"type": "text", "text": "Now in French."}]},
                {"role": "user", "content": "b"},
            ],
        }
    )
    assert req.body["messages"] == [
        {"role": "system", "content": "First."},
        {"role": "user", "content": "a"},
        {"role": "system", "content": "Now in French."},
        {"role": "user", "content": "b"},
    ]


def test_thinking_disabled_turns_the_template_switch_off() -> None:
    body = to_chat(
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "x"}],
            "thinking": {"type": "disabled"},
        }
    ).body
    assert body["chat_template_kwargs"] == {"enable_thinking": False}


def test_output_config_format_is_a_json_schema_response_format() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = to_chat(
        {
            "model": "m",
            "max_tokens": 9,
            "messages": [{"role": "user", "content": "x"}],
            "output_config": {"format": {"type": "json_schema", "schema": schema}},
        }
    ).body
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def test_a_tool_use_round_trip_becomes_tool_calls_and_tool_messages() -> None:
    req = to_chat(
        {
            "model": "m",
            "max_tokens": 50,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Weather in Paris and Rome?"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "Two calls.", "signature": "sig"},
                        {"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "weather", "input": {"city": "Rome"}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "toolu_2",
                            "is_error": True,
                            "content": [
                                {"type": "text", "text": "timeout"},
                                {"type": "image", "source": {"type": "url", "url": "https://example.com/e.png"}},
                            ],
                        },
                        {"type": "text", "text": "Summarise."},
                    ],
                },
            ],
        }
    )
    assert req.body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Weather in Paris and Rome?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Rome"}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: timeout"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/e.png"}}]},
        {"role": "user", "content": "Summarise."},
    ]


def test_an_assistant_turn_of_only_tool_use_has_null_content_and_a_text_document_is_text() -> None:
    req = to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "abc"}},
                        {"type": "text", "text": "?"},
                    ],
                },
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
            ],
        }
    )
    assert req.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "abc"}, {"type": "text", "text": "?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]


def test_count_tokens_takes_no_max_tokens_and_drops_the_sampling_fields_it_checks() -> None:
    req = to_chat(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "x"}],
            "temperature": 0.5,
            "max_tokens": 9,
            "stream": True,
            "stop_sequences": ["s"],
        },
        count_only=True,
    )
    assert req.body == {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    assert (req.stream, req.stop_sequences) == (False, ())
    with pytest.raises(InvalidRequest, match="temperature"):
        to_chat({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 7}, count_only=True)


def test_hints_are_checked_for_their_type_then_ignored() -> None:
    base = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    hints = {
        "service_tier": "standard_only",
        "speed": "fast",
        "inference_geo": "us",
        "cache_control": {"type": "ephemeral"},
        "diagnostics": {"previous_message_id": "msg_1"},
        "user_profile_id": "p",
        "workspace_id": "w",
        "output_config": {"effort": "xhigh"},
        "thinking": {"type": "adaptive", "display": "omitted"},
        "tools": [{"name": "f", "input_schema": {}, "defer_loading": True, "eager_input_streaming": None}],
    }
    body = to_chat({**base, **hints}).body
    assert set(body) == {"model", "messages", "max_tokens", "tools", "chat_template_kwargs"}
    for bad, param in [
        ({"speed": "turbo"}, "speed"),
        ({"service_tier": 1}, "service_tier"),
        ({"cache_control": "yes"}, "cache_control"),
        ({"output_config": {"effort": "huge"}}, "output_config.effort"),
        ({"tools": [{"name": "f", "input_schema": {}, "defer_loading": "no"}]}, "tools.0.defer_loading"),
        ({"tool_choice": {"type": "auto", "name": "f"}}, "tool_choice.name"),
    ]:
        with pytest.raises(InvalidRequest) as ei:
            to_chat({**base, **bad})
        assert ei.value.param == param


MSG = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"model": "m", "messages": MSG}, "max_tokens", "max_tokens: Field required"),
        ({"model": "m", "max_tokens": 0, "messages": MSG}, "max_tokens", "greater than or equal to 1"),
        ({"model": "m", "max_tokens": 1.5, "messages": MSG}, "max_tokens", "valid integer"),
        ({"model": "m", "max_tokens": 1e30, "messages": MSG}, "max_tokens", "64-bit"),
        ({"model": "m", "max_tokens": 5}, "messages", "messages: Field required"),
        ({"max_tokens": 5, "messages": MSG}, "model", "model: Field required"),
        ({"model": "", "max_tokens": 5, "messages": MSG}, "model", "at least 1 character"),
        ({"model": "m", "max_tokens": 5, "messages": []}, "messages", "at least one message"),
        ({"model": "m", "max_tokens": 5, "messages": MSG, "frequency_penalty": 1}, "frequency_penalty", "Extra inputs"),
        ({"model": "m", "max_tokens": 5, "messages": MSG, "temperature": 1.5}, "temperature", "between 0 and 1"),
        ({"model": "m", "max_tokens": 5, "messages": MSG, "metadata": {"x": 1}}, "metadata.x", "Extra inputs"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
            "'user'",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": [{"type": "image"}]}]},
            "messages.0.content.0.type",
            "'text'",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": []}]},
            "messages.0.content",
            "1 item",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": MSG, "thinking": {"type": "enabled", "budget_tokens": 10}},
            "thinking.budget_tokens",
            "greater than or equal to 1024",
        ),
        (
            {"model": "m", "max_tokens": 5, "messages": MSG, "tool_choice": {"type": "tool"}},
            "tool_choice.name",
            "valid string",
        ),
    ],
)
def test_invalid_requests_are_refused_as_anthropic_does(body: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as ei:
        to_chat(body)
    assert ei.value.param == param
    assert message in ei.value.message
    assert ei.value.status == 400


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"mcp_servers": []}, "mcp_servers", "MCP connector"),
        ({"container": "c"}, "container", "containers"),
        (
            {"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}},
            "context_management.edits.0.type",
            "only clear_thinking edits",
        ),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools.0.type", "server or built-in tool"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "document",
                                "source": {"type": "base64", "media_type": "application/pdf", "data": "x"},
                            }
                        ],
                    }
                ]
            },
            "messages.0.content.0.source.type",
            "only text documents",
        ),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}
                ]
            },
            "messages.0.content.0.source.type",
            "image source 'file'",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "search_result", "source": "s"}]}]},
            "messages.0.content.0.type",
            "'search_result' blocks in a user message",
        ),
    ],
)
def test_what_the_gateway_cannot_honour_is_a_clear_400_never_dropped(
    extra: dict[str, Any], param: str, message: str
) -> None:
    with pytest.raises(InvalidRequest) as ei:
        to_chat({"model": "m", "max_tokens": 5, "messages": MSG, **extra})
    assert ei.value.param == param and message in ei.value.message
    assert "not supported by this gateway" in ei.value.message or "does not provide" in ei.value.message


# -- whole answers -----------------------------------------------------------------------------------------


def chat_answer(message: dict[str, Any], finish: str, **choice: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-abc123",
        "object": "chat.completion",
        "created": 1,
        "model": "public",
        "choices": [{"index": 0, "message": message, "finish_reason": finish, **choice}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27},
    }


def test_a_text_answer() -> None:
    out = orjson.loads(message_bytes(orjson.dumps(chat_answer({"role": "assistant", "content": "Hi!"}, "stop")), ()))
    assert out == {
        "id": "msg_abc123",
        "type": "message",
        "role": "assistant",
        "model": "public",
        "content": [{"type": "text", "text": "Hi!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 20,
            "output_tokens": 7,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def test_reasoning_text_and_tool_calls_become_thinking_text_and_tool_use_blocks() -> None:
    msg = {
        "role": "assistant",
        "reasoning_content": "Need the weather.",
        "content": "Let me check.",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_2", "type": "function", "function": {"name": "clock", "arguments": "{not json"}},
        ],
    }
    out = to_message(chat_answer(msg, "tool_calls"), ())
    assert out["content"] == [
        {"type": "thinking", "thinking": "Need the weather.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "call_2", "name": "clock", "input": {"_raw_arguments": "{not json"}},
    ]
    assert out["stop_reason"] == "tool_use"


@pytest.mark.parametrize(
    ("finish", "choice", "stops", "reason", "seq"),
    [
        ("stop", {}, (), "end_turn", None),
        ("length", {}, (), "max_tokens", None),
        ("stop", {"stop_reason": "END"}, ("END",), "stop_sequence", "END"),  # vLLM says which
        ("stop", {"matched_stop": "END"}, ("END",), "stop_sequence", "END"),  # SGLang says which
        ("stop", {"stop_reason": 128009}, ("END",), "end_turn", None),  # an EOS token id
        ("content_filter", {}, (), "refusal", None),
    ],
)
def test_stop_reasons(
    finish: str, choice: dict[str, Any], stops: tuple[str, ...], reason: str, seq: str | None
) -> None:
    out = to_message(chat_answer({"role": "assistant", "content": "x"}, finish, **choice), stops)
    assert (out["stop_reason"], out["stop_sequence"]) == (reason, seq)


def test_cached_prompt_tokens_are_cache_reads() -> None:
    obj = chat_answer({"role": "assistant", "content": "x"}, "stop")
    obj["usage"]["prompt_tokens_details"] = {"cached_tokens": 15}
    assert to_message(obj, ())["usage"] == {
        "input_tokens": 5,
        "output_tokens": 7,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 15,
    }


# -- streams -----------------------------------------------------------------------------------------------


def sse(*chunks: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (c.encode() if isinstance(c, str) else orjson.dumps(c)) + b"\n\n" for c in chunks)


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, **extra}]
    return {"id": "chatcmpl-s1", "object": "chat.completion.chunk", "model": "public", "choices": choices}


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in raw.decode().split("\n\n"):
        if not frame:
            continue
        name_line, data_line = frame.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), frame
        data = orjson.loads(data_line[6:])
        assert data["type"] == name_line[7:]
        out.append((name_line[7:], data))
    return out


USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
START = (
    "message_start",
    {
        "type": "message_start",
        "message": {
            "id": "msg_s1",
            "type": "message",
            "role": "assistant",
            "model": "public",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 9,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
    },
)
PING = ("ping", {"type": "ping"})


def end(reason: str, seq: str | None = None, output: int = 3) -> list[tuple[str, dict[str, Any]]]:
    usage = {
        "input_tokens": 12,
        "output_tokens": output,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    return [
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_a_text_stream_is_anthropics_event_sequence() -> None:
    t = StreamTranslator((), 9)
    out = t.feed(sse(chunk({"role": "assistant", "content": ""})))
    out += t.feed(sse(chunk({"content": "Hel"}), chunk({"content": "lo"})))
    out += t.feed(sse(chunk({}, "stop"), chunk(None) | {"usage": USAGE}, "[DONE]"))
    out += t.finish()
    assert events(out) == [
        START,
        PING,
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo"}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        *end("end_turn"),
    ]


def test_reasoning_then_text_then_a_tool_call_are_three_blocks() -> None:
    t = StreamTranslator((), 9)
    call0 = {"index": 0, "id": "call_9", "type": "function", "function": {"name": "weather", "arguments": ""}}
    raw = sse(
        chunk({"role": "assistant", "reasoning_content": "Think"}),
        chunk({"reasoning_content": "ing."}),
        chunk({"content": "Sure."}),
        chunk({"tool_calls": [call0]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]}),
        chunk({}, "tool_calls"),
        chunk(None) | {"usage": USAGE},
        "[DONE]",
    )
    # split mid-event: the translator holds the partial event until the rest comes
    out = t.feed(raw[:37]) + t.feed(raw[37:]) + t.finish()

    def delta(i: int, d: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": i, "delta": d})

    def start(i: int, block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_start", {"type": "content_block_start", "index": i, "content_block": block})

    def stop(i: int) -> tuple[str, dict[str, Any]]:
        return ("content_block_stop", {"type": "content_block_stop", "index": i})

    assert events(out) == [
        START,
        PING,
        start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Think"}),
        delta(0, {"type": "thinking_delta", "thinking": "ing."}),
        stop(0),
        start(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "Sure."}),
        stop(1),
        start(2, {"type": "tool_use", "id": "call_9", "name": "weather", "input": {}}),
        delta(2, {"type": "input_json_delta", "partial_json": '{"city":'}),
        delta(2, {"type": "input_json_delta", "partial_json": ' "Paris"}'}),
        stop(2),
        *end("tool_use"),
    ]


def test_a_matched_stop_sequence_and_a_length_stop() -> None:
    t = StreamTranslator(("END",), 9)
    out = t.feed(sse(chunk({"content": "a"}), chunk({}, "stop", stop_reason="END"), chunk(None) | {"usage": USAGE}))
    out += t.feed(sse("[DONE]"))
    assert events(out)[-2:] == end("stop_sequence", "END")
    t = StreamTranslator((), 9)
    out = t.feed(sse(chunk({"content": "a"}, "length"), "[DONE]"))
    # no usage chunk came: the estimates (the input estimate, one event per content delta)
    assert events(out)[-2] == (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": {"input_tokens": 9, "output_tokens": 1},
        },
    )


def test_an_error_after_the_first_byte_is_anthropics_error_event_and_nothing_follows() -> None:
    t = StreamTranslator((), 9)
    out = t.feed(sse(chunk({"content": "a"})))
    err = GatewayError("backend 'a' failed mid-stream: boom", type_="upstream_error", code="upstream_stream_error")
    out += t.feed(err.sse_event() + b"data: [DONE]\n\n")
    out += t.feed(sse(chunk({"content": "late"}))) + t.finish()
    evs = events(out)
    assert [name for name, _ in evs] == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert evs[-1][1] == {
        "type": "error",
        "error": {"type": "api_error", "message": "backend 'a' failed mid-stream: boom"},
    }


def test_a_stream_that_ends_without_done_still_ends_in_anthropics_way() -> None:
    t = StreamTranslator((), 4)
    out = t.feed(sse(chunk({"content": "a"}, "stop"))) + t.finish()
    assert [n for n, _ in events(out)][-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert t.finish() == b""


# -- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "etype"),
    [
        (InvalidRequest("bad"), 400, "invalid_request_error"),
        (AuthenticationFailed("no key"), 401, "authentication_error"),
        (PermissionDenied("not yours"), 403, "permission_error"),
        (ModelNotFound("no model"), 404, "not_found_error"),
        (PayloadTooLarge("big"), 413, "request_too_large"),
        (RateLimited("slow down"), 429, "rate_limit_error"),
        (Overloaded("queue full"), 529, "overloaded_error"),
        (NoHealthyBackend("none"), 529, "overloaded_error"),
        (ServiceUnavailable("store down"), 529, "overloaded_error"),
        (EngineErrorAnswer("busy", status=429, busy=True), 529, "overloaded_error"),
        (GatewayError("internal"), 500, "api_error"),
        (UpstreamUnreachable("refused"), 502, "api_error"),
        (UpstreamTimeout("slow engine"), 504, "timeout_error"),
    ],
)
def test_errors_have_anthropics_envelope_and_status(error: GatewayError, status: int, etype: str) -> None:
    got_status, body = error_answer(error, "rid-1")
    assert got_status == status
    assert orjson.loads(body) == {
        "type": "error",
        "error": {"type": etype, "message": error.message},
        "request_id": "rid-1",
    }


@pytest.mark.parametrize(
    ("err", "etype"),
    [
        ({"type": "server_overloaded", "code": "queue_full"}, "overloaded_error"),
        ({"type": "invalid_request_error", "code": "context_length_exceeded"}, "invalid_request_error"),
        ({"type": "invalid_request_error", "code": "model_not_found"}, "not_found_error"),
        ({"type": "tokens", "code": "rate_limit_exceeded"}, "rate_limit_error"),
        ({"type": "upstream_error", "code": "upstream_timeout"}, "timeout_error"),
        ({"type": "upstream_error", "code": "stream_interrupted"}, "api_error"),
    ],
)
def test_stream_error_types_from_the_openai_envelope(err: dict[str, Any], etype: str) -> None:
    assert error_type_of(err) == etype


# -- robustness: whatever a client or an engine sends, a 400 or an answer, never a crash --------------------

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
KEYS = st.sampled_from(
    [
        *("model", "messages", "max_tokens", "system", "tools", "tool_choice", "thinking", "stream", "metadata"),
        *("role", "content", "type", "text", "source", "input", "id", "name", "tool_use_id", "stop_sequences"),
    ]
)
SHAPED = st.recursive(
    JSON, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=6), max_leaves=30
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(KEYS, SHAPED, max_size=8), st.booleans())
def test_any_request_is_translated_or_refused_with_a_400(req: dict[str, Any], count_only: bool) -> None:
    try:
        out = to_chat(req, count_only=count_only)
    except InvalidRequest as e:
        assert e.status == 400
        return
    orjson.dumps(out.body)  # what goes to the service serialises


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.sampled_from(["id", "model", "choices", "usage"]), SHAPED, max_size=4))
def test_any_answer_object_translates(obj: dict[str, Any]) -> None:
    orjson.dumps(to_message(obj, ("x",)))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=64) | st.builds(lambda o: b"data: " + orjson.dumps(o) + b"\n\n", SHAPED), max_size=8)
)
def test_any_stream_bytes_translate(chunks: list[bytes]) -> None:
    t = StreamTranslator(("x",), 3)
    out = b"".join(t.feed(c) for c in chunks) + t.finish()
    assert out.endswith(b'"type":"message_stop"}\n\n') or b"event: error" in out


def test_clearing_thinking_is_accepted_and_the_billing_line_never_reaches_the_engine() -> None:
    """What Claude Code sends by default: context edits that only clear earlier thinking (which the
    translation drops anyway), and a first system block with its billing attribution."""
    req = to_chat(
        {
            "model": "m",
            "max_tokens": 5,
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.1c9; cc_entrypoint=sdk-cli;"},
                {"type": "text", "text": "You are a coding agent."},
            ],
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    assert req.body["messages"][0] == {"role": "system", "content": "You are a coding agent."}


_FIRST = {"role": "user", "content": "hi"}
_TEXT = {"type": "text", "text": "a"}
_USE = {"type": "tool_use", "id": "x", "name": "n", "input": {}}
_RESULT = {"type": "tool_result", "tool_use_id": "t", "content": "x"}


@pytest.mark.parametrize(
    ("msg", "param"),
    [
        ({"role": "assistant", "content": [_TEXT, {**_USE, "input": []}]}, "1.input"),
        ({"role": "assistant", "content": [_TEXT, {**_USE, "id": 1}]}, "1.id"),
        ({"role": "assistant", "content": [_TEXT, {**_USE, "name": 2}]}, "1.name"),
        ({"role": "assistant", "content": [_TEXT, _TEXT, {"type": "text", "text": 2}]}, "2.text"),
        ({"role": "assistant", "content": [_TEXT, "x"]}, "1"),
        ({"role": "assistant", "content": [_TEXT, {"type": "image"}]}, "1.type"),
        ({"role": "user", "content": [_TEXT, {**_RESULT, "tool_use_id": 3}]}, "1.tool_use_id"),
        ({"role": "user", "content": [_TEXT, {**_RESULT, "is_error": 1}]}, "1.is_error"),
        ({"role": "user", "content": [_TEXT, {**_RESULT, "content": 5}]}, "1.content"),
        ({"role": "user", "content": [_TEXT, _TEXT, {"type": "text", "text": None}]}, "2.text"),
        ({"role": "user", "content": [_TEXT, {"type": "bogus"}]}, "1.type"),
    ],
)
def test_a_bad_block_is_named_by_its_path(msg: dict[str, Any], param: str) -> None:
    """Blocks are read without their paths (an agent's history is hundreds of them); an error still names the
    block it is about (`messages.1.content.J...`), found only then."""
    with pytest.raises(GatewayError) as e:
        to_chat({"model": "m", "max_tokens": 5, "messages": [_FIRST, msg]})
    assert e.value.param == f"messages.1.content.{param}"
