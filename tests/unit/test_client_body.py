"""An OpenAI-compatible engine's body is the client's bytes with the gateway's added fields spliced in (issue 36):
whatever the splice gives parses to exactly the dict a re-encoding gave, in the same key order; a changed or
removed field is encoded whole; and the agent-sized chat request takes the splice through a real adapter. A translated
body's tools (`EncodedList`) go in as the bytes the size estimate encoded, the same bytes a plain encoding gives."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.dialects.anthropic.request import to_chat
from llm_gateway.dialects.responses.request import parse
from llm_gateway.types import BackendInfo, CallContext
from llm_gateway.wire.client_body import ClientBody, EncodedList, EncodedMessages, Spliced, encoded_list, joined
from llm_gateway.wire.client_body import encode as encode_body

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
_keys = st.sampled_from(["model", "messages", "max_tokens", "stream", "n", "x"])


def encode(out: dict[str, Any], source: dict[str, Any]) -> bytes:
    """The body's bytes as the engine reads them (a `Spliced` one joined)."""
    return joined(encode_body(out, source))


def _client(sent: dict[str, Any], spaced: bool) -> ClientBody:
    raw = orjson.dumps(sent, option=orjson.OPT_INDENT_2) + b"\n " if spaced else orjson.dumps(sent)
    return ClientBody(orjson.loads(raw), raw)


@given(
    sent=st.dictionaries(_keys, _json, max_size=5),
    spaced=st.booleans(),
    changes=st.lists(st.tuples(st.sampled_from(["set", "add", "del", "same"]), _keys, _json), max_size=4),
)
def test_the_upstream_body_is_what_encoding_the_dict_gives(
    sent: dict[str, Any], spaced: bool, changes: list[tuple[str, str, Any]]
) -> None:
    body = _client(sent, spaced)
    out = dict(body)
    for op, k, v in changes:
        if op == "del":
            out.pop(k, None)
        elif op == "same" and k in out:
            out[k] = orjson.loads(orjson.dumps(out[k]))  # an equal value, not the same object
        elif op == "set" or (op == "add" and k not in out):
            out[k] = v
    got = encode(out, body)
    assert orjson.loads(got) == out
    assert list(orjson.loads(got)) == list(out)  # the same order of keys
    assert encode(out, dict(body)) == orjson.dumps(out)  # a plain dict: encoded


def test_only_added_fields_keep_the_clients_bytes() -> None:
    raw = b'{"model": "m",\n "messages": [{"role": "user", "content": "hi  there"}], "max_tokens": 8}\n'
    body = ClientBody(orjson.loads(raw), raw)
    assert encode_body(dict(body), body) is raw
    assert encode_body({**body, "model": "m"}, body) is raw  # an equal string is the same JSON
    added = encode({**body, "max_completion_tokens": 8}, body)
    assert added == raw.rstrip()[:-1] + b',"max_completion_tokens":8}'
    assert encode({**body, "model": "other"}, body) == orjson.dumps({**body, "model": "other"})
    assert encode({**body, "max_tokens": 8.0}, body) == orjson.dumps({**body, "max_tokens": 8.0})  # 8.0 is not 8
    # the client's own value, moved after an added field: the keys come in the dict's order
    moved = {k: body[k] for k in ["messages", "max_tokens"]} | {"n": 1, "model": body["model"]}
    assert list(orjson.loads(encode(moved, body))) == ["messages", "max_tokens", "n", "model"]
    del body["max_tokens"]
    assert encode(dict(body), body) == orjson.dumps(dict(body))
    empty = ClientBody({}, b"{ }")
    assert orjson.loads(encode({"a": 1}, empty)) == {"a": 1}


def test_the_splice_does_not_copy_the_clients_bytes() -> None:
    # a slice and a concatenation were two copies of a coding agent's 74 KB (issue 36): the splice is a view of the
    # client's bytes and the added fields, which the engine client writes one after the other
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 100_000}]}) + b" \n"
    body = ClientBody(orjson.loads(raw), raw)
    got = encode_body({**body, "max_completion_tokens": 8}, body)
    assert type(got) is Spliced and got.size == len(bytes(got)) == len(raw) - 2 + len(b',"max_completion_tokens":8')
    view, added = got.parts
    assert isinstance(view, memoryview) and view.obj is raw and view.nbytes == len(raw) - 3  # up to its brace
    assert added == b',"max_completion_tokens":8}' and joined(got) == raw.rstrip()[:-1] + added
    assert joined(raw) is raw


def _ctx(stream: bool) -> CallContext:
    return CallContext("chat", "fake-model", "fake-model", stream, False, "rid")


@pytest.mark.parametrize("stream", [False, True])
def test_the_agent_request_reaches_vllm_as_the_clients_bytes(stream: bool) -> None:
    sent = agent_request.bodies()["chat"]
    if stream:
        sent = {**sent, "stream": True}
    raw = orjson.dumps(sent)
    body = ClientBody(orjson.loads(raw), raw)
    adapter = VLLMAdapter(BackendInfo("b", "http://127.0.0.1:1"))
    req = adapter.build("chat", body, _ctx(stream))
    assert type(req.body) is Spliced and req.body.parts[0].obj is raw  # the client's bytes, not a copy
    assert joined(req.body).startswith(raw[:-1])  # the client's bytes, the added fields after them
    plain = adapter.build("chat", dict(orjson.loads(raw)), _ctx(stream))
    assert plain.body is not None and orjson.loads(joined(req.body)) == orjson.loads(plain.body)
    renamed = adapter.build("chat", body, CallContext("chat", "fake-model", "org/Model-7B", stream, False, "rid"))
    assert isinstance(renamed.body, bytes)
    assert orjson.loads(renamed.body)["model"] == "org/Model-7B" and not renamed.body.startswith(raw[:-1])


def test_encoded_messages_are_written_from_their_parts_beside_the_encoded_tools() -> None:
    history = b'{"role":"user","content":"kept"}'  # bytes that are not its items' own: seen to be used
    messages = EncodedMessages([{"role": "user", "content": "hi"}], (b"[", history, b"]"))
    tools = EncodedList([{"name": "a"}], b'[{"name":"t"}]')
    for body, want in [
        (
            {"model": "m", "messages": messages, "tools": tools, "n": 1},
            b'{"model":"m","messages":[%b],"tools":[{"name":"t"}],"n":1}',
        ),
        ({"tools": tools, "messages": messages}, b'{"tools":[{"name":"t"}],"messages":[%b]}'),
        ({"messages": messages, "tools": [{"name": "a"}]}, b'{"messages":[%b],"tools":[{"name":"a"}]}'),
        ({"messages": messages, "x": "\x00"}, b'{"messages":[%b],"x":"\\u0000"}'),  # a NUL in a string is escaped
    ]:
        written = encode_body(body, {})
        assert type(written) is Spliced and joined(written) == want % history
        assert any(p is history for p in written.parts)  # not copied
    messages.append({"role": "user", "content": "more"})  # changed after its JSON was made: encoded as a list
    assert encode({"messages": messages}, {}) == orjson.dumps({"messages": list(messages)})


def test_an_encoded_list_is_spliced_not_encoded_again() -> None:
    tools = EncodedList([{"name": "a"}], b'[{"name":"spliced"}]')  # bytes that are not its items' own: seen to be used
    assert encode({"model": "m", "tools": tools, "n": 1}, {}) == b'{"model":"m","tools":[{"name":"spliced"}],"n":1}'
    assert encode({"tools": [{"name": "a"}]}, {}) == b'{"tools":[{"name":"a"}]}'  # a plain list: encoded
    made = encoded_list([{"name": "a", "x": [1.5, None]}])
    assert made == [{"name": "a", "x": [1.5, None]}] and made.json == orjson.dumps(list(made))


def _translated(dialect: str, stream: bool) -> tuple[dict[str, Any], bytes]:
    """The agent request's chat translation in `dialect`, and its tools' JSON as the size estimate encoded them."""
    sent = {**agent_request.bodies()[dialect], "stream": stream}
    if dialect == "messages":
        msgs = to_chat(sent)
        assert msgs.gathered is not None
        return msgs.body, msgs.gathered.tools_json
    req = parse(sent)
    assert req.gathered is not None
    return req.chat_body([]), req.gathered.tools_json


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_a_translated_agent_request_reaches_vllm_as_a_plain_encoding_would(dialect: str, stream: bool) -> None:
    body, estimated = _translated(dialect, stream)
    tools = body["tools"]
    assert type(tools) is EncodedList and tools.json is estimated and len(tools) == 20  # one encoding for both
    adapter = VLLMAdapter(BackendInfo("b", "http://127.0.0.1:1"))
    req = adapter.build("chat", body, _ctx(stream))
    plain = adapter.build("chat", {**body, "tools": list(tools), "messages": list(body["messages"])}, _ctx(stream))
    assert isinstance(plain.body, bytes) and req.body is not None
    assert joined(req.body) == plain.body  # the engine gets the same bytes
    assert orjson.dumps(list(tools)) in joined(req.body)
    if type(req.body) is Spliced:  # the agent's history kept (an earlier test's, or this one's): nothing copied
        assert any(p is tools.json for p in req.body.parts)
