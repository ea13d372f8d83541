"""The Responses API translation, checked against the `openai` SDK's own models of every object and event:
requests to chat bodies (every mapped field, every refusal), whole chat answers to Response objects, and
chat SSE to the typed event stream (order, sequence numbers, the final object equal to the whole one)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from llm_gateway.dialects.responses.items import item_references
from llm_gateway.dialects.responses.request import parse
from llm_gateway.dialects.responses.response import to_response
from llm_gateway.dialects.responses.stream import ResponsesStream
from llm_gateway.errors import GatewayError, InvalidRequest

EVENT = TypeAdapter(ResponseStreamEvent)
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


# -- requests ----------------------------------------------------------------------------------------------


def test_a_string_input_with_instructions_and_sampling() -> None:
    req = parse(
        {
            "model": "m",
            "input": "Hello",
            "instructions": "Be brief.",
            "max_output_tokens": 20,
            "temperature": 0.5,
            "top_p": 0.9,
            "user": "u-1",
            "stream": True,
            "store": False,
            "metadata": {"team": "a"},
        }
    )
    assert req.chat_body([]) == {
        "model": "m",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
        "max_tokens": 20,
        "temperature": 0.5,
        "top_p": 0.9,
        "user": "u-1",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert (req.stream, req.store) == (True, False)
    assert req.echo["metadata"] == {"team": "a"} and req.echo["instructions"] == "Be brief."
    assert req.items == []  # items are built for a stored response only (their one use)
    stored = parse({"model": "m", "input": "Hello", "store": True})
    assert [it["type"] for it in stored.items] == ["message"] and stored.items[0]["id"].startswith("msg_")


def test_items_become_chat_turns_with_tool_calls_outputs_and_reasoning() -> None:
    req = parse(
        {
            "model": "m",
            "input": [
                {"role": "developer", "content": "Use tools."},
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Weather in "},
                        {"type": "input_text", "text": "Paris?"},
                    ],
                },
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "Call it."}],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
                {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
                {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA", "detail": "low"}],
                },
            ],
            "tools": [TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False,
        }
    )
    body = req.chat_body([{"role": "user", "content": "earlier"}, {"role": "assistant", "content": "ok"}])
    assert body["messages"] == [
        {"role": "user", "content": "earlier"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call it.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA", "detail": "low"}}],
        },
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": TOOL["parameters"],
                "strict": True,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["parallel_tool_calls"] is False
    assert [it["id"] for it in req.items][2] == "rs_1"  # ids the client gave are kept
    assert all(isinstance(it["id"], str) for it in req.items)


def test_item_references_are_the_stored_items_they_name() -> None:
    """What `item_reference` stands for is the item the gateway stored (the handler finds them, in one
    query); the request then reads as if the client had sent those items themselves."""
    stored = {
        "msg_u": {"id": "msg_u", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        "rs_1": {
            "id": "rs_1",
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "Call it."}],
            "status": "completed",
        },
        "msg_a": {
            "id": "msg_a",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}],
        },
        "fc_1": {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": "{}",
        },
        "fco_1": {"id": "fco_1", "type": "function_call_output", "call_id": "call_1", "output": "18C"},
    }
    refs: list[dict[str, Any]] = [{"type": "item_reference", "id": k} for k in stored]
    refs[2] = {"id": "msg_a"}  # OpenAI's ItemReference: `type` may be left out
    req = parse({"model": "m", "input": [*refs, {"role": "user", "content": "And now?"}]}, stored)
    sent = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Call it."},
    ]
    sent[1]["tool_calls"] = [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    ]
    assert req.chat_body([])["messages"] == [
        *sent,
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
        {"role": "user", "content": "And now?"},
    ]
    assert req.items[:5] == list(stored.values())  # listed back as the items they stand for
    assert req.referenced == frozenset(stored)  # not stored again as new items
    with pytest.raises(GatewayError) as e:  # a reference the store does not hold for this key
        parse({"model": "m", "input": [{"type": "item_reference", "id": "msg_nope"}]}, stored)
    assert e.value.envelope() == {
        "error": {
            "message": "Item with id 'msg_nope' not found.",
            "type": "invalid_request_error",
            "param": "input",
            "code": None,
        }
    }
    assert e.value.status == 404  # OpenAI's answer to it (vercel/ai#10290 shows its body)
    with pytest.raises(GatewayError):  # nothing resolved at all
        parse({"model": "m", "input": [{"type": "item_reference", "id": "msg_u"}]})


def test_references_are_found_without_reading_the_rest() -> None:
    assert item_references("just text") == []
    assert item_references([{"role": "user", "content": "x"}, {"type": "message"}]) == []
    assert item_references([{"type": "item_reference", "id": "a"}, {"id": "b"}, {"id": "c", "role": "user"}]) == [
        "a",
        "b",
    ]


def test_text_format_reasoning_and_logprobs() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    body = parse(
        {
            "model": "m",
            "input": "x",
            "text": {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}},
            "reasoning": {"effort": "low", "summary": "auto"},
            "top_logprobs": 2,
        }
    ).chat_body([])
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "out", "schema": schema, "strict": True},
    }
    assert body["reasoning_effort"] == "low"
    assert (body["logprobs"], body["top_logprobs"]) == (True, 2)
    off = parse({"model": "m", "input": "x", "reasoning": {"effort": "none"}}).chat_body([])
    assert off["chat_template_kwargs"] == {"enable_thinking": False} and "reasoning_effort" not in off


@pytest.mark.parametrize(
    ("extra", "param", "code"),
    [
        ({"bogus": 1}, "bogus", "unknown_parameter"),
        ({"background": True}, "background", "unsupported_parameter"),
        ({"conversation": "conv_1"}, "conversation", "unsupported_parameter"),
        ({"max_tool_calls": 3}, "max_tool_calls", "unsupported_parameter"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type", "unsupported_parameter"),
        ({"input": [{"type": "item_reference", "id": 7}]}, "input.0.id", None),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input.0.content.0.type",
            "unsupported_parameter",
        ),
        ({"temperature": 3}, "temperature", None),
        ({"include": ["nope"]}, "include.0", "invalid_value"),
        ({"previous_response_id": "abc"}, "previous_response_id", "invalid_value"),
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata", "invalid_value"),
        ({"input": None}, "input", "missing_required_parameter"),
        ({"input": [{"role": "robot", "content": "x"}]}, "input.0.role", "invalid_value"),
    ],
)
def test_what_cannot_be_honoured_is_a_400_naming_the_parameter(
    extra: dict[str, Any], param: str, code: str | None
) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse({"model": "m", "input": "x", **extra})
    assert e.value.status == 400 and e.value.param == param
    if code is not None:
        assert e.value.code == code


def test_nulls_are_absent_fields_and_background_false_is_fine() -> None:
    body = parse(
        {"model": "m", "input": "x", "background": False, "temperature": None, "conversation": None}
    ).chat_body([])
    assert body == {"model": "m", "messages": [{"role": "user", "content": "x"}]}


# -- whole answers -------------------------------------------------------------------------------------------


def chat_answer(message: dict[str, Any], finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "public",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 7,
            "total_tokens": 18,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    }


def test_a_whole_answer_is_a_response_the_sdk_reads() -> None:
    req = parse({"model": "public", "input": "hi", "tools": [TOOL], "metadata": {"k": "v"}})
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
    obj, turn = to_response(
        chat_answer({"content": "On it.", "reasoning_content": "Think.", "tool_calls": [call]}, "tool_calls"),
        req,
        "resp_1",
    )
    r = Response.model_validate(obj)
    assert (r.id, r.status, r.model, r.object) == ("resp_1", "completed", "public", "response")
    assert [o.type for o in r.output] == ["reasoning", "message", "function_call"]
    assert r.output_text == "On it."
    fc = r.output[2]
    assert fc.type == "function_call" and (fc.call_id, fc.name, fc.arguments) == (
        "call_9",
        "get_weather",
        '{"city":"Rome"}',
    )
    assert r.output[0].type == "reasoning" and r.output[0].content is not None
    assert r.output[0].content[0].text == "Think."
    assert r.usage is not None and (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (11, 7, 18)
    assert r.usage.input_tokens_details.cached_tokens == 4
    assert r.metadata == {"k": "v"} and r.tools[0].type == "function"
    assert turn == {"role": "assistant", "content": "On it.", "reasoning_content": "Think.", "tool_calls": [call]}


def test_the_token_limit_is_an_incomplete_response() -> None:
    obj, _ = to_response(chat_answer({"content": "cut"}, "length"), parse({"model": "p", "input": "x"}), "resp_2")
    r = Response.model_validate(obj)
    assert r.status == "incomplete" and r.incomplete_details is not None
    assert r.incomplete_details.reason == "max_output_tokens"
    # the item the limit cut is incomplete too (openai-python: ResponseOutputMessage.status), as OpenAI's are
    assert [(o.type, o.status) for o in r.output] == [("message", "incomplete")]


def test_only_the_item_the_limit_cut_is_incomplete() -> None:
    answer = chat_answer({"content": "cu", "reasoning_content": "Done thinking."}, "length")
    obj, _ = to_response(answer, parse({"model": "p", "input": "x"}), "resp_3")
    r = Response.model_validate(obj)
    assert [(o.type, o.status) for o in r.output] == [("reasoning", "completed"), ("message", "incomplete")]
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a":'}}
    obj, _ = to_response(chat_answer({"tool_calls": [call]}, "length"), parse({"model": "p", "input": "x"}), "r")
    assert [(o["type"], o["status"]) for o in obj["output"]] == [("function_call", "incomplete")]
    obj, _ = to_response(chat_answer({"content": "whole"}), parse({"model": "p", "input": "x"}), "resp_4")
    assert obj["output"][0]["status"] == "completed"


# -- streams -------------------------------------------------------------------------------------------------


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "public", "choices": choices, **extra}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


STREAM = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "Th"}),
    chunk({"reasoning_content": "ink."}),
    chunk({"content": "On "}),
    chunk({"content": "it."}),
    chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]}),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Rome"}'}}]}),
    chunk({}, "tool_calls"),
    chunk(None, usage={"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}),
    b"data: [DONE]\n\n",
]


def events_of(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for frame in raw.split(b"\n\n"):
        if not frame:
            continue
        name, data = frame.split(b"\n", 1)
        obj = orjson.loads(data.removeprefix(b"data: "))
        assert name == b"event: " + obj["type"].encode()
        EVENT.validate_python(obj)  # the SDK's own model of each event
        out.append(obj)
    return out


def run(writes: list[bytes], req_body: dict[str, Any] | None = None) -> tuple[ResponsesStream, list[dict[str, Any]]]:
    s = ResponsesStream(parse(req_body or {"model": "public", "input": "hi", "stream": True}), "resp_s")
    raw = b"".join(s.feed(w) for w in writes) + s.finish()
    return s, events_of(raw)


def test_a_stream_is_the_typed_events_in_openais_order() -> None:
    s, evs = run(STREAM)
    assert [e["type"] for e in evs] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in evs] == list(range(len(evs)))
    assert [e["output_index"] for e in evs if e["type"] == "response.output_item.added"] == [0, 1, 2]
    final = Response.model_validate(evs[-1]["response"])
    assert final.output_text == "On it." and final.status == "completed"
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].type == "function_call" and final.output[2].arguments == '{"city":"Rome"}'
    assert final.usage is not None and final.usage.output_tokens == 7
    assert s.terminal == "response.completed"
    assert s.turn["content"] == "On it." and s.turn["reasoning_content"] == "Think."
    assert s.turn["tool_calls"][0]["function"]["arguments"] == '{"city":"Rome"}'


def test_the_streamed_final_object_equals_the_whole_answer() -> None:
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
    whole, turn = to_response(
        chat_answer({"content": "On it.", "reasoning_content": "Think.", "tool_calls": [call]}, "tool_calls"),
        parse({"model": "public", "input": "hi"}),
        "resp_s",
    )
    s, evs = run(STREAM)

    def shape(r: dict[str, Any]) -> Any:
        return [{k: v for k, v in o.items() if k != "id"} for o in r["output"]], r["status"]

    assert shape(evs[-1]["response"]) == shape(whole)
    assert s.turn == turn


def test_writes_split_anywhere_give_the_same_events() -> None:
    raw = b"".join(STREAM)
    _, whole = run([raw])
    _, bytewise = run([raw[i : i + 7] for i in range(0, len(raw), 7)])
    strip = [{k: v for k, v in e.items() if k not in ("item_id", "item", "response")} for e in whole]
    assert strip == [{k: v for k, v in e.items() if k not in ("item_id", "item", "response")} for e in bytewise]


def test_an_engine_error_mid_stream_is_response_failed_and_nothing_after() -> None:
    error = {"message": "the engine went away", "type": "server_error", "code": "upstream_stream_interrupted"}
    err = b"data: " + orjson.dumps({"error": error}) + b"\n\n"
    s, evs = run([chunk({"content": "Hi"}), err, b"data: [DONE]\n\n"])
    assert evs[-1]["type"] == "response.failed" and s.terminal == "response.failed"
    failed = Response.model_validate(evs[-1]["response"])
    assert failed.status == "failed" and failed.error is not None
    assert failed.error.message == "the engine went away (upstream_stream_interrupted)"
    assert failed.error.code == "server_error"


def test_a_stream_without_its_end_marker_fails_rather_than_completes() -> None:
    _, evs = run([chunk({"content": "Hi"})])
    assert evs[-1]["type"] == "response.failed"


def test_the_token_limit_ends_with_response_incomplete() -> None:
    s, evs = run(
        [chunk({"reasoning_content": "Hm."}), chunk({"content": "Hi"}), chunk({}, "length"), b"data: [DONE]\n\n"]
    )
    assert evs[-1]["type"] == "response.incomplete"
    assert evs[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    done = [e["item"] for e in evs if e["type"] == "response.output_item.done"]
    assert [(i["type"], i["status"]) for i in done] == [("reasoning", "completed"), ("message", "incomplete")]
    assert [(i["type"], i["status"]) for i in evs[-1]["response"]["output"]] == [
        ("reasoning", "completed"),
        ("message", "incomplete"),
    ]
    whole, _ = to_response(
        chat_answer({"content": "Hi", "reasoning_content": "Hm."}, "length"),
        parse({"model": "public", "input": "hi", "stream": True}),
        "resp_s",
    )
    assert [i["status"] for i in whole["output"]] == [i["status"] for i in s.response["output"]]


def test_no_usage_from_the_engine_means_estimates_not_zeros() -> None:
    _, evs = run([chunk({"content": "a"}), chunk({"content": "b"}), b"data: [DONE]\n\n"])
    u = evs[-1]["response"]["usage"]
    assert u["output_tokens"] == 2 and u["input_tokens"] > 0


# -- input checking found by schemathesis (tests/reliability/test_schemathesis.py) -------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        # an unhashable role was a TypeError (a 500) in the role lookup
        ({"input": [{"type": "message", "role": {}, "content": ""}]}, "input.0.role"),
        ({"input": [{"role": ["user"], "content": "hi"}]}, "input.0.role"),
        # a field left unchecked because another one was present (valid by the document otherwise)
        ({"input": "hi", "user": "u", "safety_identifier": 5}, "safety_identifier"),
        ({"input": "hi", "reasoning": {"summary": "auto", "generate_summary": 5}}, "reasoning.generate_summary"),
        ({"input": "hi", "reasoning": {"summary": None, "generate_summary": "bogus"}}, "reasoning.generate_summary"),
        (
            {
                "input": [
                    {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "t"}], "summary": 5},
                    {"role": "assistant", "content": "x"},
                ]
            },
            "input.0.summary",
        ),
    ],
)
def test_a_value_of_the_wrong_type_is_a_400_not_a_crash(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse({"model": "m", **body})
    assert e.value.param == param


def test_codex_client_metadata_is_a_hint() -> None:
    """Codex sends `client_metadata` (its installation, thread and turn ids) on every request."""
    body = parse({"model": "m", "input": "x", "client_metadata": {"thread_id": "t"}}).chat_body([])
    assert "client_metadata" not in body
    with pytest.raises(InvalidRequest):
        parse({"model": "m", "input": "x", "client_metadata": "not an object"})


# -- the OpenAPI document (llm_gateway/dialects/responses/openapi.py) says the same -------------------------------


def test_the_document_lists_exactly_the_fields_parse_reads() -> None:
    from llm_gateway.dialects.responses import request as rr
    from llm_gateway.dialects.responses.openapi import REQUEST_PROPERTIES

    assert set(REQUEST_PROPERTIES) == rr._FIELDS | set(rr.HINTS) | set(rr._UNSUPPORTED)


def test_the_answers_are_what_the_document_says() -> None:
    """Whole answers and streams held to the gateway's own document, by schemathesis's response checks."""
    from datetime import timedelta

    import httpx
    import schemathesis

    from llm_gateway.dialects.openapi import openapi_document

    create = schemathesis.openapi.from_dict(orjson.loads(openapi_document()))["/v1/responses"]["POST"]
    request = httpx.Request("POST", "http://gateway.test/v1/responses")

    def answer(**kw: Any) -> httpx.Response:
        r = httpx.Response(200, request=request, **kw)
        r.elapsed = timedelta(0)  # what schemathesis reads of a response it did not send itself
        return r

    req = parse({"model": "public", "input": "hi", "tools": [TOOL], "metadata": {"k": "v"}, "user": "u"})
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
    answers: list[tuple[dict[str, Any], str]] = [
        ({"content": "On it.", "reasoning_content": "Think.", "tool_calls": [call]}, "tool_calls"),
        ({"content": None, "refusal": "No."}, "stop"),
        ({"content": "cut"}, "length"),
    ]
    for message, finish in answers:
        obj = to_response(chat_answer(message, finish), req, "resp_1")[0]
        create.validate_response(answer(json=obj))
    error = b"data: " + orjson.dumps({"error": {"message": "gone", "code": "x"}}) + b"\n\n"
    for writes in (STREAM, [chunk({"content": "Hi"}), error], [chunk({"content": "Hi"})]):
        s = ResponsesStream(parse({"model": "public", "input": "hi", "stream": True}), "resp_s")
        raw = b"".join(s.feed(w) for w in writes) + s.finish()
        create.validate_response(answer(content=raw, headers={"content-type": "text/event-stream"}))
