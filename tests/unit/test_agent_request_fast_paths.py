"""The fast paths for agent-sized requests (issue 36 item 2) give what the slow ones gave.

- request_info's prompt bounds count a text's non-blank UTF-8 bytes in one pass over its encoding; the
  reference here is the four `str.count`s it replaced, for any text (blanks of every kind, non-ASCII, lone
  surrogates as the surrogatepass encoding has them).
- request_info sizes chat messages in one pass that only gathers their texts and other fields, then sums them
  in C: the reference here is the loop that added each message's share in turn (which also counted the other
  fields of a message without a content key, as a template renders them).
- The Messages and Responses translations gather what read_request sizes of the chat messages as they build them:
  read_request gives the same with what they gathered as when it walks the messages itself (the agent request,
  edge bodies, and any Responses input).
- The Responses translation builds the input items (each with a fresh id) only when the response is stored,
  the one use they have; everything else a request becomes is the same with `store` true or false.
- The Messages and Responses translations build a field's dotted path only for the error that names it: every
  error names the same parameter as before (the unit tests of each translation check the texts; these check a
  field deep in each kind of block).
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from llm_gateway.dialects.anthropic.request import to_chat
from llm_gateway.dialects.responses.request import parse
from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.candidates import fits
from llm_gateway.routing.gathered import CEILING_BASE, CEILING_PER_IMAGE, CEILING_PER_MESSAGE
from llm_gateway.routing.gathered import messages_sums as _messages
from llm_gateway.routing.request_info import FLOOR_BYTES_PER_TOKEN, _bounds, read_request

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


def _bounds_reference(text: str) -> tuple[int, int]:
    """What _bounds computed before (four passes of str.count over the text)."""
    size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    blanks = text.count(" ") + text.count("\n") + text.count("\t") + text.count("\r")
    return (size - blanks) // FLOOR_BYTES_PER_TOKEN, size


@given(st.text(alphabet=st.characters(blacklist_categories=()), max_size=400))
@example("")
@example("a b\tc\r\nd")
@example("    \n\n\t\t\r\r")
@example("\ud800 lone \udfff surrogates \U0001f600 and é, 漢字\u3000(ideographic space is not a blank)")
@example("\x0b\x0c\x85\xa0 other whitespace is not a blank")
def test_prompt_bounds_are_what_four_counts_gave(text: str) -> None:
    assert _bounds(text) == _bounds_reference(text)
    # repeated FLOOR_BYTES_PER_TOKEN times, the floor is the exact count of non-blank bytes: one off shows
    many = text * FLOOR_BYTES_PER_TOKEN
    assert _bounds(many) == _bounds_reference(many)


def test_the_agent_requests_estimates_are_unchanged() -> None:
    # the numbers read_request gave the agent-sized request before the fast path (git adb3ba0)
    body = orjson.loads(agent_request.encode(agent_request.bodies()["chat"]))
    info = read_request("chat", body)
    assert (info.prompt_tokens, info.prompt_floor, info.prompt_ceiling) == (17893, 4532, 73586)


def _agent(dialect: str) -> dict[str, Any]:
    return dict(orjson.loads(agent_request.encode(agent_request.bodies()[dialect])))


def _messages_reference(messages: list[Any], needs: set[str]) -> tuple[int, str, list[str], int, bool]:
    """What _messages computed before it summed in C: each message's share added in turn."""
    texts: list[str] = []
    chars, ceiling, head, fresh = 16 * len(messages), CEILING_BASE + CEILING_PER_MESSAGE * len(messages), [], True
    for m in messages:
        fresh = fresh and m["role"] not in ("assistant", "tool")
        content = m.get("content")
        parts = [{"text": content}] if isinstance(content, str) else content if isinstance(content, list) else []
        for part in parts:
            if not isinstance(part, dict):
                continue
            text = part.get("text")
            if part.get("type") in ("image_url", "input_image", "image"):
                needs.add("vision")
                chars, ceiling = chars + 1024, ceiling + CEILING_PER_IMAGE
            elif isinstance(text, str):
                chars, ceiling = chars + len(text), ceiling + len(text.encode("utf-8", "surrogatepass"))
                texts.append(text)
                head += [text][: 4 - len(head)]
            else:
                ceiling += len(orjson.dumps(part))
        for k, v in m.items():
            if k not in ("role", "content") and v is not None:
                size = len(v.encode("utf-8", "surrogatepass")) if isinstance(v, str) else len(orjson.dumps(v))
                chars, ceiling = chars + size, ceiling + size
    return chars, "\x00".join(head), texts, ceiling, fresh


_TEXTS = st.text(alphabet=st.characters(blacklist_categories=()), max_size=40)
_JSON_TEXTS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)  # orjson's strings
_VALUES = st.none() | _TEXTS | st.lists(st.dictionaries(st.sampled_from(["id", "type"]), _JSON_TEXTS), max_size=2)
_PARTS = st.lists(
    st.sampled_from([{"type": "image_url", "image_url": {"url": "data:,"}}, {"type": "input_audio"}, "x"])
    | st.builds(lambda t: {"type": "text", "text": t}, _TEXTS),
    max_size=3,
)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])},
    optional={
        "content": st.none() | _TEXTS | _PARTS,
        "tool_calls": _VALUES,
        "tool_call_id": _VALUES,
        "name": st.none() | _TEXTS,
        "reasoning_content": _VALUES,
    },
)


@given(st.lists(_MESSAGE, min_size=1, max_size=8))
@example([{"role": "user", "content": "é" * 3}, {"role": "assistant", "tool_calls": [{"id": "漢"}]}])
@example([{"role": "tool", "tool_call_id": "\ud800", "content": None}, {"role": "user", "content": ""}])
def test_messages_are_sized_as_one_at_a_time(messages: list[dict[str, Any]]) -> None:
    needs: set[str] = set()
    reference_needs: set[str] = set()
    assert _messages(messages, needs) == _messages_reference(messages, reference_needs) and needs == reference_needs


@pytest.mark.parametrize("body", ["chat", "messages", "responses"])
def test_the_agent_requests_bodies_are_sized_as_one_at_a_time(body: str) -> None:
    chat = {"chat": _agent("chat"), "messages": to_chat(_agent("messages")).body}.get(body)
    messages = (chat or parse(_agent("responses")).chat_body([]))["messages"]
    assert _messages(messages, set()) == _messages_reference(messages, set())


@pytest.mark.parametrize("parts", [False, True])  # plain contents; content parts (one message at a time)
def test_an_assistant_message_without_content_counts_its_tool_calls(parts: bool) -> None:
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": "' + "x" * 900 + '"}'}}]
    first = {"role": "user", "content": [{"type": "text", "text": "q"}] if parts else "q"}
    absent = read_request("chat", {"model": "m", "messages": [first, {"role": "assistant", "tool_calls": calls}]})
    null_content = {"role": "assistant", "content": None, "tool_calls": calls}
    null = read_request("chat", {"model": "m", "messages": [first, null_content]})
    assert null.prompt_ceiling is not None and null.prompt_ceiling > 900  # the call's JSON, as a template renders it
    assert (absent.prompt_tokens, absent.prompt_ceiling) == (null.prompt_tokens, null.prompt_ceiling)


@pytest.mark.parametrize(
    "body",
    [
        _agent("responses"),
        {"model": "m", "input": "Hello", "instructions": "Be brief.", "tools": _agent("responses")["tools"][:2]},
        {"model": "m", "input": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yes?"}]},
    ],
)
def test_a_responses_request_is_the_same_stored_or_not_but_for_its_items(body: dict[str, Any]) -> None:
    kept, unkept = parse({**body, "store": True}), parse({**body, "store": False})
    assert unkept.items == [] and len(kept.items) == (len(body["input"]) if isinstance(body["input"], list) else 1)
    assert unkept.messages == kept.messages and unkept.options == kept.options
    assert {**unkept.echo, "store": True} == kept.echo and unkept.prompt_estimate == kept.prompt_estimate
    assert unkept.chat_body([]) == kept.chat_body([])


_TEXT = {"type": "text", "text": "t"}
_USE = {"type": "tool_use", "id": "c1", "name": "f", "input": {}}
_RESULT = {"type": "tool_result", "tool_use_id": "c1", "content": "out"}
_TOOL = {"name": "f", "description": "d", "input_schema": {"type": "object"}}


def _messages_with(turns: list[Any], tools: list[Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "max_tokens": 8, "messages": turns}
    if tools is not None:
        body["tools"] = tools
    return body


# each a bad field deep in an agent's kind of block, and the parameter the error names (as before the fast path)
MESSAGES_ERRORS = [
    (_messages_with([{"role": "user", "content": [{"type": "text", "text": 1}]}]), "messages.0.content.0.text"),
    (_messages_with([{"role": "user", "content": ["x"]}]), "messages.0.content.0"),
    (_messages_with([{"role": "user", "content": {}}]), "messages.0.content"),
    (_messages_with([{"role": "user", "content": []}]), "messages.0.content"),
    (_messages_with(["x"]), "messages.0"),
    (_messages_with([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{**_USE, "input": []}]}]),
     "messages.1.content.0.input"),
    (_messages_with([{"role": "user", "content": "q"}, {"role": "assistant", "content": [_TEXT, {**_USE, "id": 2}]}]),
     "messages.1.content.1.id"),
    (_messages_with([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{**_USE, "name": None}]}]),
     "messages.1.content.0.name"),
    (_messages_with([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "text"}]}]),
     "messages.1.content.0.text"),
    (_messages_with([{"role": "user", "content": "q"}, {"role": "assistant", "content": [7]}]),
     "messages.1.content.0"),
    (_messages_with([{"role": "user", "content": "q"}, {"role": "assistant", "content": [{"type": "x"}]}]),
     "messages.1.content.0.type"),
    (_messages_with([{"role": "user", "content": [_TEXT, {**_RESULT, "tool_use_id": 3}]}]),
     "messages.0.content.1.tool_use_id"),
    (_messages_with([{"role": "user", "content": [{**_RESULT, "is_error": "yes"}]}]), "messages.0.content.0.is_error"),
    (_messages_with([{"role": "user", "content": [{**_RESULT, "content": [{"type": "text", "text": 5}]}]}]),
     "messages.0.content.0.content.0.text"),
    (_messages_with([{"role": "user", "content": [{"type": "video"}]}]), "messages.0.content.0.type"),
    (_messages_with([{"role": "user", "content": "q"}], [{**_TOOL, "name": 1}]), "tools.0.name"),
    (_messages_with([{"role": "user", "content": "q"}], [_TOOL, {**_TOOL, "name": ""}]), "tools.1.name"),
    (_messages_with([{"role": "user", "content": "q"}], [{**_TOOL, "input_schema": "s"}]), "tools.0.input_schema"),
    (_messages_with([{"role": "user", "content": "q"}], [{**_TOOL, "description": 2}]), "tools.0.description"),
    (_messages_with([{"role": "user", "content": "q"}], [{**_TOOL, "cache_control": 1}]), "tools.0.cache_control"),
    (_messages_with([{"role": "user", "content": "q"}], [{**_TOOL, "color": 1}]), "tools.0.color"),
    (_messages_with([{"role": "user", "content": "q"}], ["t"]), "tools.0"),
]  # fmt: skip

_CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
_FTOOL = {"type": "function", "name": "f", "description": "d", "parameters": {"type": "object"}}
RESPONSES_ERRORS = [
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": 1}]}]}, "input.0.content.0.text"),
    ({"input": [{"role": "user", "content": ["x"]}]}, "input.0.content.0"),
    ({"input": [{"role": "user", "content": {}}]}, "input.0.content"),
    ({"input": [{"role": "user", "content": [{"type": "refusal", "refusal": 1}]}]}, "input.0.content.0.refusal"),
    ({"input": [{"role": "user", "content": [{"type": "audio"}]}]}, "input.0.content.0.type"),
    ({"input": [{"role": "user", "content": "q"}, {**_CALL, "arguments": {}}]}, "input.1.arguments"),
    ({"input": [{"role": "user", "content": "q"}, {**_CALL, "call_id": 1}]}, "input.1.call_id"),
    ({"input": [{"role": "user", "content": "q"}, {**_CALL, "name": None}]}, "input.1.name"),
    ({"input": [{"type": "function_call_output", "call_id": 5, "output": "o"}]}, "input.0.call_id"),
    ({"input": "q", "tools": [{**_FTOOL, "name": 1}]}, "tools.0.name"),
    ({"input": "q", "tools": [_FTOOL, {**_FTOOL, "description": 1}]}, "tools.1.description"),
    ({"input": "q", "tools": [{**_FTOOL, "parameters": []}]}, "tools.0.parameters"),
    ({"input": "q", "tools": [{**_FTOOL, "color": 1}]}, "tools.0.color"),
    ({"input": "q", "tools": ["t"]}, "tools.0"),
]


@pytest.mark.parametrize(("body", "param"), MESSAGES_ERRORS)
def test_a_bad_field_in_a_messages_request_names_its_path(body: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as e:
        to_chat(body)
    assert e.value.param == param


@pytest.mark.parametrize(("body", "param"), RESPONSES_ERRORS)
@pytest.mark.parametrize("store", [True, False])
def test_a_bad_field_in_a_responses_request_names_its_path(body: dict[str, Any], param: str, store: bool) -> None:
    with pytest.raises(InvalidRequest) as e:
        parse({"model": "m", "store": store, **body})
    assert e.value.param == param


def test_the_agent_request_translates_as_before() -> None:
    # what the Messages and Responses forms of the agent request became before the fast paths (git adb3ba0):
    # the prompt estimates, and a digest of the chat body (the same for both: the same conversation). Both estimates
    # count the chat tools by their JSON bytes since, as a chat body's does (Messages 16905 when it counted their
    # names, descriptions and schemas' JSON; Responses 17199 when it counted each function's JSON without its chat
    # wrapper): the tools are encoded once, for the estimate and read_request both
    msgs, resp = to_chat(_agent("messages")), parse(_agent("responses"))
    assert (msgs.prompt_estimate, resp.prompt_estimate) == (17276, 17360)
    for body in (msgs.body, resp.chat_body([])):
        assert hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16] == "4cb4595eaf3dd424"


def _floor_reference(body: dict[str, Any]) -> int:
    """The chat floor as read_request summed it before it was lazy: every text's floor, at once."""
    total = 0
    for m in body["messages"]:
        content = m.get("content")
        texts = [content] if isinstance(content, str) else []
        if isinstance(content, list):
            texts = [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
            texts = [t for p, t in zip(content, texts, strict=False) if p.get("type") not in ("image_url",)]
        total += sum(_bounds_reference(t)[0] for t in texts)
    return total


_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
FLOOR_BODIES = [
    _agent("chat"),
    {"model": "m", "messages": [{"role": "user", "content": "word " * 400}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 90}, _IMAGE]}]},
    {"model": "m", "messages": [{"role": "system", "content": "é" * 50}, {"role": "user", "content": "漢" * 30}]},
]


@pytest.mark.parametrize("body", FLOOR_BODIES)
def test_the_floor_summed_on_first_read_is_the_floor_summed_at_once(body: dict[str, Any]) -> None:
    info = read_request("chat", body)
    assert info.floor_texts  # not summed yet: reading the request did not pass over every byte
    assert info.prompt_floor == _floor_reference(body) and not info.floor_texts
    assert info.prompt_floor <= (info.prompt_ceiling or 0)
    truncated = read_request("chat", {**body, "truncate_prompt_tokens": 10})
    assert truncated.prompt_floor == 0 and truncated.prompt_ceiling is None


def _deployment(window: int | None, counts_output: bool = True) -> Any:
    adapter = SimpleNamespace(window_counts_output=counts_output)
    return SimpleNamespace(context_length=window, model="m", backend=SimpleNamespace(adapter=adapter))


@pytest.mark.parametrize("body", FLOOR_BODIES)
@pytest.mark.parametrize("counts_output", [True, False])
def test_the_fit_check_decides_as_on_the_floor_and_sums_it_only_near_the_window(
    body: dict[str, Any], counts_output: bool
) -> None:
    body = {**body, "max_tokens": 64}
    probe = read_request("chat", body)
    floor, ceiling = _floor_reference(body), probe.prompt_ceiling or 0
    out = 64 if counts_output else 0
    windows = {None, 1, floor + out - 1, floor + out, floor + out + 1, (floor + ceiling) // 2, ceiling + out - 1}
    for window in windows | {ceiling + out, ceiling + out + 1, 131072}:
        info = read_request("chat", body)
        assert fits(_deployment(window, counts_output), info) is (window is None or floor + out <= window)
        far = window is None or window >= ceiling + out
        assert bool(info.floor_texts) is far  # the floor was summed only where the window is below the ceiling
    exact = read_request("chat", body)
    exact.prompt_exact = {"m": floor + 10}  # the engine's count, where it was asked, decides
    assert fits(_deployment(floor + 10 + out, counts_output), exact)
    assert not fits(_deployment(floor + 9 + out, counts_output), exact)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.lists(_JSON, min_size=1, max_size=8))
@example([{"name": 'a "quoted"\n\\ é', "arguments": "{}"}, [1, 2.5, None]])
def test_values_measured_in_one_encoding_are_the_sum_of_their_encodings(values: list[Any]) -> None:
    # what read_request and the Responses tools rely on: a list's JSON is its items', commas and brackets
    assert len(orjson.dumps(values)) - len(values) - 1 == sum(len(orjson.dumps(v)) for v in values)


def _other_fields_reference(m: dict[str, Any]) -> int:
    """read_request's measure of a message's other fields before it encoded them together."""
    size = 0
    for k, v in m.items():
        if k in ("role", "content") or v is None:
            continue
        size += len(v.encode("utf-8", "surrogatepass")) if isinstance(v, str) else len(orjson.dumps(v))
    return size


@pytest.mark.parametrize(
    "messages",
    [
        _agent("chat")["messages"],
        [
            {"role": "user", "content": "q", "name": "ünïcode"},
            {"role": "assistant", "content": None, "function_call": {"name": "f", "arguments": '{"a": "\\"x\\""}'}},
            {"role": "assistant", "content": "", "tool_calls": [], "reasoning_content": "thought"},
            {"role": "tool", "content": "r", "tool_call_id": "c", "extra": {"k": [1, 2.5, True, None]}},
        ],
    ],
)
def test_a_messages_other_fields_count_as_before(messages: list[dict[str, Any]]) -> None:
    plain = read_request(
        "chat", {"model": "m", "messages": [{"role": m["role"], "content": m["content"]} for m in messages]}
    )
    info = read_request("chat", {"model": "m", "messages": messages})
    other = sum(_other_fields_reference(m) for m in messages if len(m) > 2)
    assert info.prompt_ceiling == (plain.prompt_ceiling or 0) + other
    assert info.prompt_tokens - plain.prompt_tokens in (other // 4, other // 4 + 1)  # chars // 4 + 1 each


_PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
_URL = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
_DOC = {"type": "document", "title": "Notes", "source": {"type": "text", "media_type": "text/plain", "data": "día 1"}}
_DOCS = {"type": "document", "source": {"type": "content", "content": [_TEXT, {"type": "text", "text": "二"}]}}
GATHERED_BODIES = [
    _agent("messages"),
    _messages_with([{"role": "user", "content": "only a question, café"}]),
    {
        **_messages_with(
            [
                {"role": "user", "content": [_PNG, {"type": "text", "text": "what is this? 漢字"}, _URL]},
                {"role": "assistant", "content": "A picture."},
                {"role": "user", "content": [_DOC, _DOCS, {"type": "text", "text": "and these"}]},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]},
                {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                {"role": "user", "content": [_TEXT]},
            ]
        ),
        "system": [
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=1"},
            {"type": "text", "text": "You are a helper."},
            {"type": "text", "text": "Ünïcode rules."},
        ],
    },
    _messages_with(
        [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": [_TEXT, _USE, {**_USE, "id": "c2", "input": {"path": "é/ü"}}]},
            {
                "role": "user",
                "content": [
                    {**_RESULT, "is_error": True},
                    {**_RESULT, "tool_use_id": "c2", "content": [_TEXT, _PNG, _DOC], "is_error": False},
                    {"type": "tool_result", "tool_use_id": "c3"},
                    {"type": "text", "text": "go on"},
                ],
            },
            {"role": "assistant", "content": [_USE]},
            {"role": "user", "content": [{**_RESULT, "content": []}]},
        ],
        [_TOOL],
    ),
]


@pytest.mark.parametrize("body", GATHERED_BODIES)
@pytest.mark.parametrize("count_only", [False, True])
def test_what_the_messages_translation_gathers_is_what_read_request_reads(
    body: dict[str, Any], count_only: bool
) -> None:
    req = to_chat(body, count_only=count_only)
    assert req.gathered is not None
    gathered, walked = read_request("chat", req.body, req.gathered), read_request("chat", req.body)
    assert gathered == walked and gathered.prompt_floor == walked.prompt_floor


# -- the Responses translation gathers what read_request sizes as it builds the chat messages ----------------

_RIMAGE = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}
_CALL = {"type": "function_call", "call_id": "call_1", "name": "read", "arguments": '{"path": "a.py"}'}
_OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "1 import os"}
_REASONING = {"type": "reasoning", "summary": [{"type": "summary_text", "text": "look first"}]}
_FUNCTION = {"type": "function", "name": "read", "description": "Read a file", "parameters": {"type": "object"}}
#: what the gateway stored for the key, named by the `item_reference`s below
_FOUND = {
    "msg_1": {"id": "msg_1", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "stored"}]},
    "fc_1": {**_CALL, "id": "fc_1", "call_id": "call_9"},
    "fco_1": {**_OUTPUT, "id": "fco_1", "call_id": "call_9", "output": [{"type": "input_text", "text": "ok"}]},
}


def _input(items: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "input": items, "store": False, **fields}


GATHERED_RESPONSES = [
    _agent("responses"),
    {**_agent("responses"), "store": True},  # its items built too
    {**_agent("responses"), "tools": None, "instructions": "Ünïcode rules, 漢字."},
    _input("only a question, café"),
    _input("a question", instructions="Be brief."),
    _input([{"role": "user", "content": "hi"}], instructions=""),  # empty instructions: no system message
    _input([], instructions="nothing but instructions"),
    _input(
        [
            {"role": "developer", "content": "Use tabs."},
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Be kind."}]},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "what is this? 漢字"}, _RIMAGE, _RIMAGE],
            },
            {"type": "message", "role": "user", "content": [_RIMAGE]},
            {"role": "user", "content": [{"type": "refusal", "refusal": "no"}, {"type": "input_text", "text": "é"}]},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't"}]},
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}, {"type": "output_text", "text": "b"}],
            },
            {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "think, ü"}], "summary": []},
            {"role": "assistant", "content": ""},  # its empty text is dropped when calls join it
            _CALL,
            {**_CALL, "call_id": "call_2", "arguments": '{"path": "é/ü"}'},
            _OUTPUT,
            {
                **_OUTPUT,
                "call_id": "call_2",
                "output": [{"type": "input_text", "text": "two "}, _RIMAGE, {"type": "output_text", "text": "parts"}],
            },
            _REASONING,
            {"type": "reasoning", "summary": []},  # no text: the next call still joins nothing
            {**_CALL, "call_id": "call_3"},
            {**_OUTPUT, "call_id": "call_3", "output": ""},
            {"role": "assistant", "content": ""},  # an empty answer that stays one
            _REASONING,
            {"role": "assistant", "content": "done"},
            {"type": "item_reference", "id": "msg_1"},
            {"id": "fc_1"},  # OpenAI's short form of a reference
            {"type": "item_reference", "id": "fco_1"},
            {"role": "user", "content": "go on"},
        ],
        tools=[_FUNCTION, {**_FUNCTION, "name": "write", "strict": False}],
    ),
    _input([_CALL, _OUTPUT]),  # calls with no assistant message before them
    _input([_REASONING, _CALL, _OUTPUT, _REASONING]),  # reasoning no assistant turn follows
]


@pytest.mark.parametrize("body", GATHERED_RESPONSES)
def test_what_the_responses_translation_gathers_is_what_read_request_reads(body: dict[str, Any]) -> None:
    req = parse(body, _FOUND)
    chat, gathered = req.chat_body([]), req.gathered_for([])
    assert gathered is not None
    by_gathering, walked = read_request("chat", chat, gathered), read_request("chat", chat)
    assert by_gathering == walked and by_gathering.prompt_floor == walked.prompt_floor


def test_an_earlier_conversation_is_walked_not_gathered() -> None:
    # previous_response_id: the stored chat messages go before this input, and read_request walks them all
    req = parse(_input([_OUTPUT, {"role": "user", "content": "and now?"}], previous_response_id="resp_1"))
    earlier = [{"role": "user", "content": "read a.py"}, {"role": "assistant", "content": None, "tool_calls": []}]
    assert req.gathered_for(earlier) is None
    assert read_request("chat", req.chat_body(earlier)).prompt_ceiling is not None


def test_the_responses_tools_are_encoded_once() -> None:
    req = parse(_agent("responses"))
    assert req.gathered is not None and req.gathered.tools_json == orjson.dumps(req.options["tools"])
    assert read_request("chat", req.chat_body([]), req.gathered).tools_json is req.gathered.tools_json


_RTEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)  # what JSON can carry
_RPART = st.builds(lambda k, t: {"type": k, "text": t}, st.sampled_from(["input_text", "output_text"]), _RTEXT)
_ITEM = st.one_of(
    st.builds(
        lambda r, c: {"type": "message", "role": r, "content": c},
        st.sampled_from(["user", "assistant", "system", "developer"]),
        _RTEXT | st.lists(_RPART, min_size=1, max_size=3),
    ),
    st.builds(
        lambda parts: {"role": "user", "content": parts},
        st.lists(
            _RPART | st.just(_RIMAGE) | st.builds(lambda t: {"type": "refusal", "refusal": t}, _RTEXT), max_size=3
        ),
    ),
    st.builds(lambda c, a: {**_CALL, "call_id": c, "arguments": a}, _RTEXT, _RTEXT),
    st.builds(
        lambda c, o: {**_OUTPUT, "call_id": c, "output": o}, _RTEXT, _RTEXT | st.lists(_RPART | st.just(_RIMAGE))
    ),
    st.builds(
        lambda key, texts: {"type": "reasoning", key: [{"type": f"{key[:7]}_text", "text": t} for t in texts]},
        st.sampled_from(["content", "summary"]),
        st.lists(_RTEXT, max_size=2),
    ),
)


@given(st.lists(_ITEM, min_size=1, max_size=10), st.none() | _RTEXT)
@example([{"role": "assistant", "content": ""}, _CALL, _CALL], None)
@example([{"type": "reasoning", "summary": []}, {"role": "assistant", "content": ""}, _CALL], "")
def test_any_responses_input_is_gathered_as_read_request_reads_it(items: list[Any], instructions: str | None) -> None:
    req = parse(_input(items, instructions=instructions))
    chat = req.chat_body([])
    assert _read(chat, req.gathered_for([])) == _read(chat, None)


def _read(chat: dict[str, Any], gathered: Any) -> Any:
    """What read_request gives (the floor too), or the parameter its error names (reasoning alone: no message)."""
    try:
        info = read_request("chat", chat, gathered)
    except InvalidRequest as e:
        return e.param
    return list(info.floor_texts), info, info.prompt_floor  # the texts before the floor is summed (and they go)
