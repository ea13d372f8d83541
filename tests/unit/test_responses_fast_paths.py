"""The Responses translation's fast paths (issue 36 item 2) give what the item-by-item reading gives.

- Function tools whose fields are all there with their types are read in C (`_plain_functions`) and copied;
  the chat body, the echoed tools and the prompt estimate are what the tool-by-tool reading gives, for
  every shape of tool either path takes (explicit nulls, `strict`, `defer_loading`, a mix).
- Input messages of text are read inline; a message is the same chat message `_message` makes of it, for
  every content shape (a string, text parts, none, refusals, images), and function call outputs of parts
  are the same as of a string.
- An input of messages of text, function calls and their string outputs (an agent's history) is read a kind
  at a time (`_usual_input`): the chat messages and the characters counted are what reading it item by item
  gives, for any order of such items (calls that begin a turn, join one, follow a message with no text);
  any other input, or one with an item in error, is read item by item.
- Input items are read in their order, references included: the first item in error is the one answered,
  even when a later one is a reference the key has no item for, or not an object at all.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from llm_gateway.dialects.field_checks import PromptChars
from llm_gateway.dialects.responses import items as responses_items
from llm_gateway.dialects.responses import request as responses_request
from llm_gateway.dialects.responses.request import parse
from llm_gateway.errors import GatewayError, InvalidRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request

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


# -- the usual input, read a kind at a time ---------------------------------------------------------------
_texts = st.sampled_from(["", "a", "done.", "é漢"])
_part = st.builds(lambda k, t: {"type": k, "text": t}, st.sampled_from(["input_text", "output_text"]), _texts)
_content = st.one_of(
    _texts,
    st.lists(_part, max_size=3),
    st.just([{"type": "refusal", "refusal": "no"}]),  # read by the helper
    st.just([{"type": "input_text", "text": None}]),  # in error
    st.just({}),  # in error
)
_message_item = st.builds(
    lambda role, content: {"type": "message", "role": role, "content": content},
    st.sampled_from(["user", "assistant", "system", "developer", "assistant", "nobody"]),
    _content,
)
_call_item = st.builds(
    lambda cid, name, args: {"type": "function_call", "call_id": cid, "name": name, "arguments": args},
    st.sampled_from(["c1", "c2"]),
    st.sampled_from(["read_file", "grep"]),
    st.sampled_from(["{}", '{"path": "a.py"}', 7]),  # 7: in error
)
_output_item = st.builds(
    lambda cid, out: {"type": "function_call_output", "call_id": cid, "output": out},
    st.sampled_from(["c1", "c2", 3]),  # 3: in error
    st.sampled_from(["", "ok", [{"type": "input_text", "text": "parts"}]]),  # parts: read by the helper
)
_usual_inputs = st.lists(st.one_of(_message_item, _call_item, _output_item), max_size=12)


def _one_by_one(value: list[dict[str, Any]]) -> Any:
    seen = PromptChars()
    try:
        messages, chars = responses_items._item_by_item(zip(value, [it["type"] for it in value], strict=True), seen)
    except InvalidRequest as e:
        return e.param
    return messages, chars + seen.chars


@given(_usual_inputs)
@example([{"type": "message", "role": "assistant", "content": ""}, {**_CALL}, {**_CALL, "call_id": "c2"}])
@example([{**_CALL}, {"type": "function_call_output", "call_id": "c1", "output": "r"}, {**_CALL}])
@example([{"type": "message", "role": "user", "content": "q"}, {**_CALL}])
def test_the_usual_input_read_a_kind_at_a_time_is_what_item_by_item_makes(value: list[dict[str, Any]]) -> None:
    expected = _one_by_one(value)
    got = responses_items._usual_input(value, [it["type"] for it in value])
    if got is None:  # read item by item, then: only what that reads with a helper, or answers
        assert isinstance(expected, str) or _has_other_shapes(value)
    else:
        assert got == expected


def _has_other_shapes(value: list[dict[str, Any]]) -> bool:
    for it in value:
        content = it.get("content", it.get("output"))
        if isinstance(content, list) and any(p.get("type") not in ("input_text", "output_text") for p in content):
            return True
        if it["type"] == "function_call_output" and isinstance(content, list):
            return True
    return False


def test_the_agent_request_is_the_same_read_item_by_item(monkeypatch: pytest.MonkeyPatch) -> None:
    body = agent_request.bodies()["responses"]
    fast = parse(body)
    monkeypatch.setattr(responses_items, "_usual_input", lambda value, kinds: None)
    slow = parse(body)
    assert fast.messages == slow.messages
    assert fast.prompt_estimate == slow.prompt_estimate


def test_an_item_type_that_is_not_a_string_is_answered_as_such() -> None:
    body = {"model": "m", "input": [{"type": "message", "role": "user", "content": "q"}, {"type": ["message"]}]}
    with pytest.raises(InvalidRequest) as e:
        parse(body)
    assert (e.value.param, e.value.code) == ("input.1.type", "invalid_value")
