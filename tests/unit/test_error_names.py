"""Errors of the chat path in the names of the route the client called (dialects/error_names.py): the
function on the errors the chat path really raises, and the Messages and Responses routes in-process,
where an engine's field table refuses a field the client named otherwise."""

from __future__ import annotations

import httpx

from llm_gateway.adapters.field_table import unsupported
from llm_gateway.dialects.error_names import MESSAGES, RESPONSES, renamed
from llm_gateway.errors import InvalidRequest
from tests.conftest import ONE_BACKEND, gateway_client, make_config

TABBY = (
    ONE_BACKEND.replace("engine: vllm", "engine: tabbyapi")
    .replace("capabilities: [chat, completions, embeddings]", "capabilities: [chat, tools]")
    .replace("format: safetensors", "format: exl2")
)
TOOL = {"name": "f", "input_schema": {"type": "object"}}


def test_param_and_text_take_the_routes_names() -> None:
    e = renamed(unsupported("response_format", "TabbyAPI", "type 'x'"), RESPONSES)
    assert (e.param, e.message) == (
        "text.format",
        "'text.format' is not supported by the TabbyAPI backend serving this model: type 'x'",
    )
    e = renamed(unsupported("parallel_tool_calls", "TabbyAPI", "parsed, never read"), MESSAGES)
    assert e.param == "tool_choice.disable_parallel_tool_use"
    assert e.message.startswith("'tool_choice.disable_parallel_tool_use' is not supported")
    e = renamed(InvalidRequest("'messages' must be a non-empty array", param="messages"), RESPONSES)
    assert (e.param, e.message) == ("input", "'input' must be a non-empty array")
    e = renamed(InvalidRequest("messages[3].content must be a string", param="messages[3].content"), RESPONSES)
    assert e.param == "input"  # an index into the chat messages is no index into the input
    e = renamed(
        InvalidRequest("x (400 of prompt and max_tokens 9). Reduce the prompt or max_tokens.", param="messages"),
        RESPONSES,
    )
    assert e.message == "x (400 of prompt and max_output_tokens 9). Reduce the prompt or max_output_tokens."
    # what both dialects name alike, and plain words, stay
    e = renamed(InvalidRequest("the messages and max_tokens of 'tools'", param="tools"), MESSAGES)
    assert (e.param, e.message) == ("tools", "the messages and max_tokens of 'tools'")
    e = renamed(InvalidRequest("stop the user at top_logprobs", param="top_logprobs"), RESPONSES | MESSAGES)
    assert (e.param, e.message) == ("top_logprobs", "stop the user at top_logprobs")


async def test_the_messages_route_names_anthropics_field_for_an_engine_refusal() -> None:
    async with gateway_client(make_config(TABBY)) as (client, _):
        r = await client.post(
            "/v1/messages",
            json={
                "model": "public-model",
                "max_tokens": 8,
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [TOOL],
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            },
        )
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["message"].startswith("'tool_choice.disable_parallel_tool_use' is not supported by the TabbyAPI")
    assert "parallel_tool_calls" not in err["message"]


async def test_the_responses_route_names_its_field_for_an_engine_refusal() -> None:
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    async with gateway_client(make_config(TABBY)) as (client, _):
        r: httpx.Response = await client.post(
            "/v1/responses",
            json={
                "model": "public-model",
                "input": "hi",
                "tools": [tool],
                "reasoning": {"effort": "none"},
                "store": False,
                "parallel_tool_calls": False,
            },
        )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "parallel_tool_calls"  # the same name on both: left as it is
