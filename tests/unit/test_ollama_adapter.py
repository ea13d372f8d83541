"""Ollama over its native API: request mapping, response translation, NDJSON -> SSE, errors, Host."""

from __future__ import annotations

import base64
import copy
import itertools
import struct
from collections.abc import Iterable
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import llm_gateway.adapters.ollama as ollama_mod
import llm_gateway.adapters.ollama_stream as ollama_stream
import llm_gateway.adapters.relay_base as relay_base
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.ollama_stream import OllamaRelay, finish_reason, tool_calls_to_openai
from llm_gateway.adapters.sse_relay import has_output
from llm_gateway.errors import EngineErrorAnswer, InvalidRequest, StreamInterrupted, UpstreamProtocolError
from llm_gateway.types import BackendInfo, CallContext, Usage

NOW = 1796000000


@pytest.fixture(autouse=True)
def fixed_time(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = SimpleNamespace(time=lambda: float(NOW))
    monkeypatch.setattr(ollama_stream, "time", fake)
    monkeypatch.setattr(ollama_mod, "time", fake)


def adapter(url: str = "http://127.0.0.1:11434", key: str | None = None) -> OllamaAdapter:
    return OllamaAdapter(BackendInfo("ol", url, key))


def ctx(
    endpoint: str = "chat",
    stream: bool = False,
    wants_usage: bool = False,
    reasoning_field: str = "reasoning_content",
    b64: bool = False,
) -> CallContext:
    return CallContext(
        endpoint, "public-model", "qwen3:8b", stream, wants_usage, "req-0123456789abcdef", reasoning_field, b64
    )


def built(body: dict, endpoint: str = "chat", stream: bool = False, a: OllamaAdapter | None = None) -> dict:
    req = (a or adapter()).build(endpoint, body, ctx(endpoint, stream))
    assert req.body is not None
    return orjson.loads(req.body)


HI = [{"role": "user", "content": "hi"}]


# -- request mapping ---------------------------------------------------------------------------------


def test_minimal_chat_request_maps_to_api_chat():
    req = adapter().build("chat", {"model": "public-model", "messages": HI}, ctx(stream=True))
    assert (req.method, req.path) == ("POST", "/api/chat")
    assert orjson.loads(req.body) == {
        "model": "qwen3:8b",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "truncate": False,  # Ollama must refuse a prompt beyond its window, not cut it
    }


def test_sampling_fields_go_into_options():
    body = {
        "messages": HI,
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 7,
        "num_ctx": 8192,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repeat_penalty": 1.1,
    }
    assert built(body)["options"] == {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "seed": 7,
        "num_ctx": 8192,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "repeat_penalty": 1.1,
    }


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_token_limit_becomes_num_predict(field: str):
    assert built({"messages": HI, field: 64})["options"] == {"num_predict": 64}


def test_max_completion_tokens_takes_precedence_over_max_tokens():
    assert built({"messages": HI, "max_completion_tokens": 100, "max_tokens": 50})["options"]["num_predict"] == 100


def test_repetition_penalty_is_ollamas_repeat_penalty():
    assert built({"messages": HI, "repetition_penalty": 1.2})["options"] == {"repeat_penalty": 1.2}


def test_null_sampling_values_are_not_sent():
    out = built({"messages": HI, "temperature": None, "max_tokens": None, "top_k": None})
    assert "options" not in out


@pytest.mark.parametrize(("stop", "expected"), [("\n\n", ["\n\n"]), (["END", "###"], ["END", "###"])])
def test_stop_is_always_a_list_in_options(stop, expected):
    assert built({"messages": HI, "stop": stop})["options"] == {"stop": expected}
    assert "stop" not in built({"messages": HI, "stop": stop})


def test_native_fields_and_unknown_fields_pass_through_at_top_level():
    out = built({"messages": HI, "keep_alive": "10m", "truncate": False, "frobnicate": {"x": 1}})
    assert (out["keep_alive"], out["truncate"], out["frobnicate"]) == ("10m", False, {"x": 1})


def test_openai_only_fields_are_not_forwarded():
    body = {
        "messages": HI,
        "n": 1,
        "user": "u-1",
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "logit_bias": {},  # an empty one: a non-empty one is refused (Ollama has no logit bias)
        "stream_options": {"include_usage": True},
        "service_tier": "auto",
        "store": False,
        "metadata": {"a": "b"},
    }
    assert built(body, stream=True) == {
        "model": "qwen3:8b",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
        "truncate": False,
    }


def test_more_than_one_choice_is_refused():
    with pytest.raises(InvalidRequest) as ei:
        built({"messages": HI, "n": 2})
    assert (ei.value.status, ei.value.param) == (400, "n")


def test_native_options_object_overrides_mapped_fields():
    out = built({"messages": HI, "max_tokens": 10, "temperature": 0.5, "options": {"num_predict": 20, "num_gpu": 1}})
    assert out["options"] == {"num_predict": 20, "temperature": 0.5, "num_gpu": 1}


def test_response_format_json_object_becomes_format_json():
    assert built({"messages": HI, "response_format": {"type": "json_object"}})["format"] == "json"


def test_response_format_json_schema_becomes_the_schema_itself():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    out = built({"messages": HI, "response_format": rf})
    assert out["format"] == schema
    assert "response_format" not in out


def test_response_format_text_sets_no_format():
    assert "format" not in built({"messages": HI, "response_format": {"type": "text"}})


def test_json_schema_without_a_schema_object_is_refused():
    with pytest.raises(InvalidRequest) as ei:
        built({"messages": HI, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})
    assert ei.value.param == "response_format"


def test_unsupported_response_format_type_is_refused():
    with pytest.raises(InvalidRequest, match="'structural_tag' is not supported"):
        built({"messages": HI, "response_format": {"type": "structural_tag"}})


def test_a_native_format_wins_over_response_format():
    out = built({"messages": HI, "format": "json", "response_format": {"type": "json_schema"}})
    assert out["format"] == "json"


@pytest.mark.parametrize(
    ("effort", "think"), [("none", False), ("minimal", "low"), ("low", "low"), ("medium", "medium"), ("high", "high")]
)
def test_reasoning_effort_becomes_think(effort: str, think):
    out = built({"messages": HI, "reasoning_effort": effort})
    assert out["think"] == think
    assert "reasoning_effort" not in out


def test_unknown_reasoning_effort_is_refused():
    with pytest.raises(InvalidRequest) as ei:
        built({"messages": HI, "reasoning_effort": "extreme"})
    assert ei.value.param == "reasoning_effort"


def test_native_think_wins_over_reasoning_effort():
    assert built({"messages": HI, "think": True, "reasoning_effort": "none"})["think"] is True


def test_image_data_urls_become_ollama_images():
    png = base64.b64encode(b"\x89PNG fake").decode()
    msg = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
            {"type": "text", "text": "be brief"},
        ],
    }
    assert built({"messages": [msg]})["messages"] == [
        {"role": "user", "content": "what is this?\nbe brief", "images": [png]}
    ]


def test_remote_image_urls_are_refused():
    msg = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x.test/cat.png"}}]}
    with pytest.raises(InvalidRequest, match="data: URLs"):
        built({"messages": [msg]})


def test_null_content_becomes_an_empty_string():
    assert built({"messages": [{"role": "assistant", "content": None}]})["messages"] == [
        {"role": "assistant", "content": ""}
    ]


def test_assistant_tool_calls_and_tool_results_map_to_ollamas_shapes():
    msgs = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "I should call the tool",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "unknown", "name": "other_tool", "content": "x"},
    ]
    assert built({"messages": msgs})["messages"] == [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            "thinking": "I should call the tool",
        },
        {"role": "tool", "content": "18C", "tool_name": "get_weather"},
        {"role": "tool", "content": "x", "tool_name": "other_tool"},
    ]


def test_tool_call_arguments_that_are_not_json_are_refused():
    msgs = [{"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]}]
    with pytest.raises(InvalidRequest, match="arguments are not JSON"):
        built({"messages": msgs})


def test_tools_definitions_pass_through():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert built({"messages": HI, "tools": tools})["tools"] == tools


@pytest.mark.parametrize("messages", ["hi", None, [1]])
def test_malformed_messages_are_refused(messages):
    with pytest.raises(InvalidRequest):
        built({"messages": messages})


def test_completions_map_to_api_generate_in_raw_mode():
    req = adapter().build("completions", {"prompt": "Once upon", "max_tokens": 5}, ctx("completions"))
    assert req.path == "/api/generate"
    assert orjson.loads(req.body) == {
        "model": "qwen3:8b",
        "stream": False,
        "options": {"num_predict": 5},
        "prompt": "Once upon",
        "raw": True,
        "truncate": False,
    }


def test_completions_accept_a_one_element_prompt_list_and_an_explicit_raw():
    out = built({"prompt": ["Once"], "raw": False}, "completions")
    assert (out["prompt"], out["raw"]) == ("Once", False)


@pytest.mark.parametrize("prompt", [["a", "b"], [1, 2, 3], None])
def test_completions_refuse_batched_or_token_prompts(prompt):
    with pytest.raises(InvalidRequest) as ei:
        built({"prompt": prompt}, "completions")
    assert ei.value.param == "prompt"


def test_embeddings_map_to_api_embed_without_stream():
    req = adapter().build("embeddings", {"input": ["a", "b"], "encoding_format": "base64"}, ctx("embeddings"))
    assert req.path == "/api/embed"
    assert orjson.loads(req.body) == {"model": "qwen3:8b", "truncate": False, "input": ["a", "b"]}


def test_embeddings_refuse_token_id_input():
    with pytest.raises(InvalidRequest):
        built({"input": [[1, 2, 3]]}, "embeddings")


def test_build_does_not_mutate_the_callers_body():
    body = {
        "model": "public-model",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}]},
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
        ],
        "stop": "END",
        "max_tokens": 3,
        "options": {"num_ctx": 4096},
        "response_format": {"type": "json_object"},
        "reasoning_effort": "low",
    }
    before = copy.deepcopy(body)
    built(body)
    assert body == before


# -- headers / Host ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://127.0.0.1:11434", None),
        ("http://localhost:11434", None),
        ("http://[::1]:11434", None),
        ("http://10.0.0.5:11434", None),
        ("http://192.168.1.20:11434", None),
        ("http://0.0.0.0:11434", None),
        ("http://gpu-box.local:11434", None),
        ("http://ollama.internal:11434", None),
        ("http://ollama:11434", "localhost:11434"),
        ("http://gpu.example.com:8080", "localhost:8080"),
        ("https://ollama.example.com", "localhost"),
        ("http://8.8.8.8:11434", "localhost:11434"),
    ],
)
def test_a_local_host_header_is_sent_only_when_the_url_host_would_trip_ollamas_guard(url: str, host: str | None):
    headers = adapter(url).build("chat", {"messages": HI}, ctx()).headers
    assert headers.get("Host") == host


def test_request_headers_carry_content_type_request_id_and_optional_bearer():
    h = adapter().build("chat", {"messages": HI}, ctx()).headers
    assert h == {"Content-Type": "application/json", "X-Request-Id": "req-0123456789abcdef"}
    h2 = adapter(key="proxy-secret").build("chat", {"messages": HI}, ctx()).headers
    assert h2["Authorization"] == "Bearer proxy-secret"


def test_stream_content_types_are_ndjson_or_json():
    assert adapter().stream_content_types() == ("application/x-ndjson", "application/json")


# -- non-streamed responses --------------------------------------------------------------------------

CHAT_NONSTREAM = (
    b'{"model":"tiny","created_at":"2026-11-30T02:59:45.757231325Z","message":{"role":"assistant",'
    b'"content":" llama is great by me llamaW0 can555"},"done_reason":"length","done":true,'
    b'"total_duration":216037893,"load_duration":1016173,"prompt_eval_count":34,'
    b'"prompt_eval_duration":103000000,"eval_count":12,"eval_duration":110000000}'
)


def test_chat_response_is_translated_to_an_openai_chat_completion():
    body, usage = adapter().response_body(CHAT_NONSTREAM, ctx())
    assert usage == Usage(34, 12)
    assert orjson.loads(body) == {
        "id": "chatcmpl-req-0123456789abcdef",
        "object": "chat.completion",
        "created": NOW,
        "model": "public-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": " llama is great by me llamaW0 can555"},
                "logprobs": None,
                "finish_reason": "length",
            }
        ],
        "usage": {"prompt_tokens": 34, "completion_tokens": 12, "total_tokens": 46},
    }


def test_thinking_goes_to_the_configured_reasoning_field():
    raw = b'{"message":{"role":"assistant","content":"4","thinking":"2+2"},"done":true,"done_reason":"stop"}'
    msg = orjson.loads(adapter().response_body(raw, ctx(reasoning_field="reasoning"))[0])["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "4", "reasoning": "2+2"}


def test_tool_calls_become_openai_tool_calls_with_finish_reason_tool_calls():
    raw = (
        b'{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"get_weather",'
        b'"arguments":{"city":"Paris"}}}]},"done":true,"done_reason":"stop","prompt_eval_count":9,"eval_count":4}'
    )
    choice = orjson.loads(adapter().response_body(raw, ctx())[0])["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"] == [
        {
            "index": 0,
            "id": "call_req-01234567_0",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
        }
    ]


def test_generate_response_is_translated_to_a_text_completion():
    raw = (
        b'{"model":"tiny","response":" llamaW055","done":true,"done_reason":"length","context":[3,261],'
        b'"prompt_eval_count":28,"eval_count":5}'
    )
    body, usage = adapter().response_body(raw, ctx("completions"))
    assert usage == Usage(28, 5)
    assert orjson.loads(body) == {
        "id": "cmpl-req-0123456789abcdef",
        "object": "text_completion",
        "created": NOW,
        "model": "public-model",
        "choices": [{"index": 0, "text": " llamaW055", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 28, "completion_tokens": 5, "total_tokens": 33},
    }


def test_embeddings_response_as_float_lists():
    raw = b'{"model":"emb","embeddings":[[0.5,-1.0],[0.25,2.0]],"prompt_eval_count":6}'
    body, usage = adapter().response_body(raw, ctx("embeddings"))
    assert usage == Usage(6, 0)
    assert orjson.loads(body) == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": [0.5, -1.0]},
            {"object": "embedding", "index": 1, "embedding": [0.25, 2.0]},
        ],
        "model": "public-model",
        "usage": {"prompt_tokens": 6, "total_tokens": 6},
    }


def test_embeddings_response_as_base64_little_endian_float32():
    raw = b'{"embeddings":[[0.5,-1.0,3.0]],"prompt_eval_count":2}'
    data = orjson.loads(adapter().response_body(raw, ctx("embeddings", b64=True))[0])["data"]
    assert struct.unpack("<3f", base64.b64decode(data[0]["embedding"])) == (0.5, -1.0, 3.0)


def test_an_error_in_a_2xx_body_raises_an_upstream_error():
    with pytest.raises(EngineErrorAnswer) as ei:
        adapter().response_body(b'{"error":"model runner crashed"}', ctx())
    assert (ei.value.status, ei.value.code) == (502, "upstream_stream_error")
    assert "model runner crashed" in ei.value.message


@pytest.mark.parametrize("raw", [b"not json", b"[1,2]"])
def test_a_2xx_body_that_is_not_a_json_object_is_a_protocol_error(raw: bytes):
    with pytest.raises(UpstreamProtocolError):
        adapter().response_body(raw, ctx())


@pytest.mark.parametrize(
    ("obj", "tools", "expected"),
    [
        ({"done_reason": "stop"}, False, "stop"),
        ({"done_reason": "length"}, False, "length"),
        ({"done_reason": "load"}, False, "stop"),
        ({}, False, "stop"),
        ({"done_reason": "length"}, True, "tool_calls"),
    ],
)
def test_finish_reason_mapping(obj, tools, expected):
    assert finish_reason(obj, tools) == expected


def test_tool_calls_to_openai_numbers_from_start_and_keeps_string_arguments():
    calls = [{"function": {"name": "a", "arguments": '{"x":1}'}}, {"function": {"name": "b"}}]
    out = tool_calls_to_openai(calls, "abcdefghijklmnop", 3)
    assert [(c["index"], c["id"], c["function"]["arguments"]) for c in out] == [
        (3, "call_abcdefghijkl_3", '{"x":1}'),
        (4, "call_abcdefghijkl_4", "{}"),
    ]
    assert tool_calls_to_openai(None, "r", 0) == []


# -- errors ------------------------------------------------------------------------------------------


def test_404_model_not_found_is_retryable_elsewhere():
    e = adapter().error(404, b'{"error":"model \\"nope\\" not found, try pulling it first"}', "application/json")
    assert (e.status, e.code, e.retryable) == (502, "upstream_model_not_found", True)
    assert 'model "nope" not found' in e.message


def test_empty_403_is_the_host_guard():
    e = adapter().error(403, b"", "")
    assert (e.status, e.code, e.retryable) == (502, "upstream_forbidden", False)


def test_non_empty_403_is_a_credentials_problem():
    e = adapter().error(403, b'{"error":"forbidden"}', "application/json")
    assert (e.status, e.code) == (502, "upstream_auth_failed")


def test_full_queue_503_is_busy_and_retryable():
    body = b'{"error":"server busy, please try again.  maximum pending requests exceeded"}'
    e = adapter().error(503, body, "application/json")
    assert (e.status, e.busy, e.retryable) == (503, True, True)


def test_other_503_is_retryable_but_not_busy():
    e = adapter().error(503, b'{"error":"model is loading"}', "application/json")
    assert (e.busy, e.retryable) == (False, True)


def test_400_is_a_client_error_with_the_engines_message():
    e = adapter().error(400, b'{"error":"model is required"}', "application/json")
    assert (e.status, e.type, e.retryable) == (400, "invalid_request_error", False)
    assert e.message == "model is required (backend 'ol' (ollama))"


def test_499_cancelled_is_a_client_error_that_is_not_retried():
    e = adapter().error(499, b'{"error":"request canceled"}', "application/json")
    assert (e.status, e.retryable) == (499, False)


def test_500_is_a_server_error_that_is_not_retried():
    e = adapter().error(500, b'{"error":"llama runner process has terminated"}', "application/json")
    assert (e.status, e.type, e.retryable) == (500, "upstream_error", False)


# -- NDJSON -> SSE stream ----------------------------------------------------------------------------

STREAM = (
    b'{"model":"tiny","created_at":"2026-11-30T02:59:45.76792715Z",'
    b'"message":{"role":"assistant","content":" llama"},"done":false}\n'
    b'{"model":"tiny","created_at":"2026-11-30T02:59:45.771184706Z",'
    b'"message":{"role":"assistant","content":" is"},"done":false}\n'
    b'{"model":"tiny","created_at":"2026-11-30T02:59:45.773200032Z",'
    b'"message":{"role":"assistant","content":""},"done_reason":"length","done":true,'
    b'"total_duration":8268442,"load_duration":1129764,"prompt_eval_count":34,"eval_count":5,'
    b'"eval_duration":5000000}\n'
)


def relay(endpoint: str = "chat", wants_usage: bool = False, reasoning_field: str = "reasoning_content") -> OllamaRelay:
    return adapter().relay(ctx(endpoint, True, wants_usage, reasoning_field))


def run(r: OllamaRelay, chunks: Iterable[bytes]) -> bytes:
    return b"".join(r.feed(c) for c in chunks) + r.finish()


def parsed(out: bytes) -> list:
    evs = [e for e in out.split(b"\n\n") if e]
    assert all(e.startswith(b"data: ") for e in evs)
    return [e[6:].decode() if e == b"data: [DONE]" else orjson.loads(e[6:]) for e in evs]


def chat_chunk(delta: dict, finish: str | None = None) -> dict:
    return {
        "id": "chatcmpl-req-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "public-model",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def test_chat_stream_is_role_chunk_content_chunks_finish_chunk_done():
    r = relay()
    assert parsed(run(r, [STREAM])) == [
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": " llama"}),
        chat_chunk({"content": " is"}),
        chat_chunk({}, "length"),
        "[DONE]",
    ]
    assert (r.usage, r.content_events, r.done, r.error) == (Usage(34, 5), 2, True, None)


def test_usage_chunk_is_sent_only_when_the_client_asked():
    out = parsed(run(relay(wants_usage=True), [STREAM]))
    assert out[-2] == {
        "id": "chatcmpl-req-0123456789abcdef",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "public-model",
        "choices": [],
        "usage": {"prompt_tokens": 34, "completion_tokens": 5, "total_tokens": 39},
    }
    assert out[-3] == chat_chunk({}, "length")
    assert out[-1] == "[DONE]"
    assert all("usage" not in e for e in parsed(run(relay(wants_usage=False), [STREAM]))[:-1])


def test_thinking_deltas_use_the_configured_reasoning_field():
    lines = (
        b'{"message":{"role":"assistant","content":"","thinking":"let me see"},"done":false}\n'
        b'{"message":{"role":"assistant","content":"4"},"done":false}\n'
        b'{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}\n'
    )
    out = parsed(run(relay(reasoning_field="reasoning"), [lines]))
    assert [e["choices"][0]["delta"] for e in out[:-1]] == [
        {"role": "assistant", "content": ""},
        {"reasoning": "let me see"},
        {"content": "4"},
        {},
    ]


def test_streamed_tool_calls_are_numbered_across_chunks_and_finish_as_tool_calls():
    lines = (
        b'{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"a","arguments":{"x":1}}}]},"done":false}\n'
        b'{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"b","arguments":{}}}]},"done":false}\n'
        b'{"message":{"role":"assistant","content":""},"done":true,"done_reason":"stop"}\n'
    )
    out = parsed(run(relay(), [lines]))
    calls = [e["choices"][0]["delta"]["tool_calls"][0] for e in out[1:3]]
    assert [(c["index"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        (0, "a", '{"x":1}'),
        (1, "b", "{}"),
    ]
    assert out[3]["choices"][0]["finish_reason"] == "tool_calls"


def test_generate_stream_becomes_text_completion_chunks_without_a_role_chunk():
    lines = (
        b'{"model":"tiny","response":" llama","done":false}\n'
        b'{"model":"tiny","response":"","done":true,"done_reason":"stop","prompt_eval_count":3,"eval_count":1}\n'
    )
    r = relay("completions")
    out = parsed(run(r, [lines]))
    head = {"id": "cmpl-req-0123456789abcdef", "object": "text_completion", "created": NOW, "model": "public-model"}
    assert out == [
        {**head, "choices": [{"index": 0, "text": " llama", "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]},
        "[DONE]",
    ]
    assert r.usage == Usage(3, 1)


def test_an_error_line_becomes_one_error_event_and_done():
    r = relay()
    out = run(r, [STREAM.split(b"\n", 1)[0] + b"\n", b'{"error":"an error was encountered while running the model"}\n'])
    evs = parsed(out)
    assert evs[-2] == {
        "error": {
            "message": "backend 'ol' (ollama) failed mid-stream: an error was encountered while running the model",
            "type": "upstream_error",
            "param": None,
            "code": "upstream_stream_error",
        }
    }
    assert evs[-1] == "[DONE]"
    assert out.count(b"[DONE]") == 1
    assert r.error is not None and r.feed(STREAM) == b""


def test_stream_that_stops_without_done_ends_with_an_error_event():
    r = relay()
    cut = b'{"message":{"role":"assistant","content":" after"},"done":false}\n' * 3
    out = parsed(run(r, [cut]))
    assert out[-2]["error"]["code"] == "stream_interrupted"
    assert "without finishing" in out[-2]["error"]["message"]
    assert out[-1] == "[DONE]"
    assert isinstance(r.error, StreamInterrupted)
    assert r.usage is None


def test_a_final_done_line_without_newline_is_still_handled():
    r = relay()
    out = run(r, [STREAM[:-1]])
    assert out == run(relay(), [STREAM])
    assert r.done is True


def test_content_in_an_unterminated_last_line_is_not_lost_when_the_stream_is_cut():
    r = relay()
    out = run(
        r, [b'{"message":{"role":"assistant","content":"A"},"done":false}\n{"message":{"content":"B"},"done":false}']
    )
    deltas = [e["choices"][0]["delta"] for e in parsed(out)[:-2]]
    assert deltas == [{"role": "assistant", "content": ""}, {"content": "A"}, {"content": "B"}]


def test_a_line_that_is_not_json_is_a_protocol_error():
    r = relay()
    out = run(r, [b"<html>oops</html>\n"])
    assert parsed(out)[0]["error"]["code"] == "upstream_bad_response"
    assert isinstance(r.error, UpstreamProtocolError)


def test_blank_lines_between_ndjson_objects_are_ignored():
    with_blanks = STREAM.replace(b"\n", b"\n\n")
    assert run(relay(), [with_blanks]) == run(relay(), [STREAM])


def test_an_overlong_line_is_refused(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(relay_base, "MAX_EVENT_BYTES", 32)
    out = run(relay(), [b'{"message":{"content":"' + b"x" * 64])
    assert parsed(out)[0]["error"]["code"] == "upstream_bad_response"


# -- output_started: the first generated output (the service's time to first token) --------------------

ROLE_ONLY = b'{"message":{"role":"assistant","content":""},"done":false}\n'


@pytest.mark.parametrize(
    "line",
    [
        b'{"message":{"role":"assistant","content":"4"},"done":false}\n',
        b'{"message":{"role":"assistant","content":"","thinking":"let me see"},"done":false}\n',
        b'{"message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"a","arguments":{}}}]},'
        b'"done":false}\n',
    ],
)
def test_the_first_content_reasoning_or_tool_call_delta_starts_the_output(line: bytes):
    r = relay()
    assert r.feed(ROLE_ONLY) and r.output_started is False  # the role chunk is no output
    assert r.feed(line) and r.output_started is True
    r.feed(ROLE_ONLY)
    assert r.output_started is True


def test_empty_lines_and_a_bare_done_line_do_not_start_the_output():
    r = relay()
    run(r, [ROLE_ONLY, b'{"message":{"content":"","tool_calls":[]},"done":false}\n', STREAM.split(b"\n")[2] + b"\n"])
    assert (r.done, r.output_started) == (True, False)


def test_generate_output_starts_with_the_first_non_empty_response():
    r = relay("completions")
    r.feed(b'{"response":"","done":false}\n')
    assert r.output_started is False
    r.feed(b'{"response":" llama","done":false}\n')
    assert r.output_started is True


def test_ollama_output_started_agrees_with_the_sse_scan_of_what_it_relayed():
    lines = b'{"message":{"role":"assistant","content":"","thinking":"hm"},"done":false}\n' + STREAM
    r, seen = relay(), b""
    for i in range(len(lines)):
        seen += r.feed(lines[i : i + 1])
        assert r.output_started is has_output(seen)
    assert r.output_started is True


def test_splitting_the_ndjson_stream_at_every_byte_gives_the_same_sse():
    whole = run(relay(wants_usage=True), [STREAM])
    for i in range(len(STREAM) + 1):
        assert run(relay(wants_usage=True), [STREAM[:i], STREAM[i:]]) == whole, f"split at {i}"
    assert run(relay(wants_usage=True), [STREAM[i : i + 1] for i in range(len(STREAM))]) == whole


@settings(max_examples=100, deadline=None)
@given(points=st.lists(st.integers(0, len(STREAM)), max_size=10))
def test_splitting_the_ndjson_stream_at_many_points_gives_the_same_sse(points: list[int]):
    cuts = [0, *sorted(points), len(STREAM)]
    parts = [STREAM[a:b] for a, b in itertools.pairwise(cuts)]
    assert run(relay(), parts) == run(relay(), [STREAM])
