"""The Responses translation's fast paths (issue 36 item 2) give what the helpers give.

- A function tool is read with its fields' paths built for their errors only: its chat function and the
  echoed tool (defaults for what it leaves out or sends as null) are as before.
- Input messages of text are read inline (`_text_message`); a message is the chat message `_message` makes
  of it, for every content shape (a string, text parts, none, refusals, images), and function call outputs
  of parts are the same as of a string.
- Input items are read in their order, references included: the first item in error is the one answered,
  even when a later one is a reference the key has no item for, or not an object at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from llm_gateway.dialects.field_checks import PromptChars
from llm_gateway.dialects.responses import items as responses_items
from llm_gateway.dialects.responses.request import parse
from llm_gateway.errors import GatewayError, InvalidRequest
from llm_gateway.routing.gathered import Gathered

_F = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}


def test_a_tool_is_its_function_and_echoes_its_defaults() -> None:
    tools = [_F, {"type": "function", "name": "g", "description": None, "strict": None}, {**_F, "strict": False}]
    req = parse({"model": "m", "input": "q", "tools": tools})
    assert req.options["tools"] == [
        {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "g"}},
        {
            "type": "function",
            "function": {"name": "f", "description": "d", "parameters": {"type": "object"}, "strict": False},
        },
    ]
    assert req.echo["tools"] == [
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True},
        {"type": "function", "name": "g", "description": None, "parameters": None, "strict": True},
        {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": False},
    ]


_CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
_IMAGE = {"type": "input_image", "image_url": "data:image/png;base64,AAAA", "detail": "low"}
CONTENTS = [
    "plain",
    "",
    [],
    [{"type": "input_text", "text": "a"}],
    [{"type": "output_text", "text": "a", "annotations": []}, {"type": "input_text", "text": "b"}],
    [{"type": "refusal", "refusal": "no"}],
    [{"type": "input_text", "text": "see"}, _IMAGE],
]


@pytest.mark.parametrize("role", ["user", "assistant", "system", "developer"])
@pytest.mark.parametrize("content", CONTENTS)
def test_a_message_read_inline_is_the_message_read_by_its_helper(role: str, content: Any) -> None:
    it = {"type": "message", "role": role, "content": content}
    by_helper, inline = Gathered(), Gathered()
    try:
        expected: Any = responses_items._message(it, "input.0", PromptChars(), by_helper)
    except InvalidRequest as e:  # images outside a user message
        expected = e.param
    seen = PromptChars()
    try:
        got: Any = responses_items.input_messages([it], seen, gathered=inline)[0][0]
    except InvalidRequest as e:
        got = e.param
    assert got == expected
    helper = PromptChars()
    if not isinstance(expected, str):
        responses_items._message(it, "input.0", helper, Gathered())
        assert seen.chars == helper.chars + 16
        # what read_request sizes of it is gathered the same both ways (an assistant's is no longer fresh)
        assert (inline.texts, inline.images, inline.fresh) == (by_helper.texts, by_helper.images, role != "assistant")


def test_a_function_call_output_of_text_parts_is_its_text() -> None:
    call = {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    as_text = [call, {"type": "function_call_output", "call_id": "c", "output": "ab"}]
    as_parts = [
        call,
        {
            "type": "function_call_output",
            "call_id": "c",
            "output": [{"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}],
        },
    ]
    a, b = PromptChars(), PromptChars()
    assert responses_items.input_messages(as_text, a, items_too=False) == responses_items.input_messages(
        as_parts, b, items_too=False
    )
    assert a.chars == b.chars


@pytest.mark.parametrize(
    "later",
    [{"type": "item_reference", "id": "msg_missing"}, {"id": "msg_missing"}, "not an object", 7, {"type": ["x"]}],
)
def test_the_first_item_in_error_is_answered_before_a_later_one(later: Any) -> None:
    body = {"model": "m", "input": [{"role": "user", "content": "q"}, {"role": "bogus", "content": "x"}, later]}
    with pytest.raises(InvalidRequest) as e:
        parse(body, {})
    assert e.value.param == "input.1.role"
    with pytest.raises(GatewayError) as e2:  # alone, the later item is answered
        parse({"model": "m", "input": [{"role": "user", "content": "q"}, later]}, {})
    assert e2.value.param in ("input", "input.1", "input.1.type")


def test_a_reference_is_read_as_the_item_it_names_in_its_place() -> None:
    stored = {"id": "fc_1", "type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}
    body = {
        "model": "m",
        "input": [
            {"role": "assistant", "content": "calling"},
            {"type": "item_reference", "id": "fc_1"},
            {"type": "function_call_output", "call_id": "c", "output": "r"},
        ],
    }
    req = parse(body, {"fc_1": stored})
    assert req.messages == [
        {
            "role": "assistant",
            "content": "calling",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c", "content": "r"},
    ]
    assert req.referenced == {"fc_1"}
    assert [it["type"] for it in req.items] == ["message", "function_call", "function_call_output"]
    assert req.items[1]["id"] == "fc_1"


def test_an_item_type_that_is_not_a_string_is_answered_as_such() -> None:
    body = {"model": "m", "input": [{"type": "message", "role": "user", "content": "q"}, {"type": ["message"]}]}
    with pytest.raises(InvalidRequest) as e:
        parse(body)
    assert (e.value.param, e.value.code) == ("input.1.type", "invalid_value")
