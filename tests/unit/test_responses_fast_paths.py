"""The Responses translation's fast paths (issue 36 item 2) give what the item-by-item reading gives.

- Function tools whose fields are all there with their types are read in C (`_plain_functions`) and copied;
  the chat body, the echoed tools and the prompt estimate are what the tool-by-tool reading gives, for
  every shape of tool either path takes (explicit nulls, `strict`, `defer_loading`, a mix).
- Input messages of text are read inline; a message is the same chat message `_message` makes of it, for
  every content shape (a string, text parts, none, refusals, images), and function call outputs of parts
  are the same as of a string.
- Input items are read in their order, references included: the first item in error is the one answered,
  even when a later one is a reference the key has no item for, or not an object at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from llm_gateway.dialects.field_checks import PromptChars
from llm_gateway.dialects.responses import items as responses_items
from llm_gateway.dialects.responses import request as responses_request
from llm_gateway.dialects.responses.request import parse
from llm_gateway.errors import GatewayError, InvalidRequest

_F = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}
TOOL_LISTS = [
    [_F],
    [_F, {**_F, "name": "g", "strict": False}],
    [{"type": "function", "name": "f"}],
    [{**_F, "description": None}],
    [{**_F, "parameters": None, "strict": None}],
    [{**_F, "strict": True}],
    [{"name": "f", "parameters": {}, "type": "function", "description": "d"}],
    [_F, {**_F, "defer_loading": True}],
    [{**_F, "defer_loading": False}],
]


@pytest.mark.parametrize("tools", TOOL_LISTS)
def test_tools_read_in_c_are_the_tools_read_one_by_one(tools: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": "m", "input": "q", "tools": tools}
    fast = parse(body)
    monkeypatch.setattr(responses_request, "_plain_functions", lambda tools: False)
    slow = parse(body)
    assert fast.options == slow.options
    assert fast.echo == slow.echo
    assert fast.prompt_estimate == slow.prompt_estimate


def test_tools_with_nulls_or_other_fields_are_read_one_by_one() -> None:
    plain = responses_request._plain_functions
    assert plain([_F, {**_F, "strict": True}, {"type": "function", "name": "f"}])
    for odd in (
        {**_F, "description": None},
        {**_F, "strict": None},
        {**_F, "defer_loading": True},
        {**_F, "parameters": []},
        {**_F, "name": 1},
        {**_F, "type": "web_search"},
        {**_F, "type": ["function"]},
        "f",
    ):
        assert not plain([_F, odd])


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
    try:
        expected: Any = responses_items._message(it, "input.0", PromptChars())
    except InvalidRequest as e:  # images outside a user message
        expected = e.param
    seen = PromptChars()
    try:
        got: Any = responses_items.input_messages([it], seen)[0][0]
    except InvalidRequest as e:
        got = e.param
    assert got == expected
    helper = PromptChars()
    if not isinstance(expected, str):
        responses_items._message(it, "input.0", helper)
        assert seen.chars == helper.chars + 16


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
    [{"type": "item_reference", "id": "msg_missing"}, {"id": "msg_missing"}, "not an object", 7],
)
def test_the_first_item_in_error_is_answered_before_a_later_one(later: Any) -> None:
    body = {"model": "m", "input": [{"role": "user", "content": "q"}, {"role": "bogus", "content": "x"}, later]}
    with pytest.raises(InvalidRequest) as e:
        parse(body, {})
    assert e.value.param == "input.1.role"
    with pytest.raises(GatewayError) as e2:  # alone, the later item is answered
        parse({"model": "m", "input": [{"role": "user", "content": "q"}, later]}, {})
    assert e2.value.param in ("input", "input.1")


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
