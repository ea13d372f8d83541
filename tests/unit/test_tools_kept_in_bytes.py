"""A request's kept tools are found in the request's own bytes (wire/recent.py `Recent.find_member`), not by
encoding the parsed tools as the key (issue 36 item 2): a hit where the client wrote them as it did when they were
kept (`member_bytes`), or as orjson writes them, and only where the bytes prove them the top-level `tools` (a copy
nested in a message, a later duplicate, a quote before them, a long rest after them: each a miss, translated from
the parsed body as before)."""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects.anthropic import request
from llm_gateway.dialects.anthropic.options import tool
from llm_gateway.dialects.anthropic.request import to_chat
from llm_gateway.dialects.responses import tools as kept_tools
from llm_gateway.dialects.responses.request import parse
from llm_gateway.wire import body_json
from llm_gateway.wire.recent import MAX_REST, Recent, member_bytes

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request

TOOLS = [{"name": "a", "input_schema": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 1}}}}]
OTHER = [{"name": "b", "input_schema": {"type": "object"}}]


@pytest.fixture(autouse=True)
def _empty() -> None:
    request._RECENT_TOOLS.clear()
    request._SAME_TOOLS.clear()
    kept_tools._kept.clear()
    kept_tools._same.clear()


def _kept(value: Any = TOOLS) -> Recent[str]:
    r: Recent[str] = Recent(4)
    r.keep(orjson.dumps(value), "kept")
    return r


def test_a_member_written_as_kept_is_found_in_the_bytes() -> None:
    k = orjson.dumps(TOOLS).decode()
    for template in (
        '{"model":"m","tools":@}',
        '{"model":"m","tools":@,"stream":true,"metadata":{"user_id":"u"}}  ',
        '{"tools":"x","model":"m","tools":@,"n":[1,{"a":"]}"}]}',  # an earlier duplicate: the last is parsed
    ):
        raw = template.replace("@", k)
        assert orjson.loads(raw)["tools"] == TOOLS
        assert _kept().find_member(raw.encode(), "tools") == "kept", raw


def test_only_a_provable_top_level_member_is_a_hit() -> None:
    k = orjson.dumps(TOOLS).decode()
    k10, kc = k.replace(":1}", ":1.0}"), k.replace('"a"', '"c"')
    for template in (
        '{"model":"m","tools":@1}',  # equal in Python, not in JSON
        '{"model":"m","tools": @}',  # not written as orjson writes it
        '{"model":"m","m":[{"tools":@}]}',  # nested: no top-level tools at all
        '{"model":"m","m":[{"tools":@,"z":1}]}',
        '{"model":"m","m":{"tools":@},"tools":[]}',  # nested, the top-level one before it
        '{"model":"m","tools":@c,"x":{"tools":[]}}',  # not kept, and a nested one after
        '{"model":"m","tools":@,"tools":[]}',  # a later duplicate is the one parsed
        '{"model":"m","tools":@,"tool\\u0073":[]}',  # ... however its name is written
        '{"model":"m","x\\"tools":@}',  # a key `x"tools`, not `tools`
        '{"model":"m","tools":@,"pad":"' + "p" * MAX_REST + '"}',  # a rest too long to parse
    ):
        raw = template.replace("@1", k10).replace("@c", kc).replace("@", k)
        assert k10 != k and kc != k and "@" not in raw
        orjson.loads(raw)  # valid JSON, as find_member's bytes always are
        assert _kept().find_member(raw.encode(), "tools") is None, raw


def test_the_bytes_a_client_wrote_a_member_as_are_found_where_provable() -> None:
    for text in (
        json.dumps({"model": "m", "tools": TOOLS, "stream": True}),  # Python's spaces
        json.dumps({"model": "m", "tools": TOOLS, "include": ["a"], "m": {"n": 1}}, indent=2),
        '{"model":"m","tools":@}',
        '{"model":"m","tools":@ ,"x":[1]}',
    ):
        raw = text.replace("@", orjson.dumps(TOOLS).decode()).encode()
        written = member_bytes(raw, "tools", TOOLS)
        assert written is not None and orjson.loads(written) == TOOLS and raw.count(written) == 1, text
        r: Recent[str] = Recent(4)
        r.keep(orjson.dumps(TOOLS), "kept")
        assert r.find(orjson.dumps(TOOLS), lambda raw=raw: member_bytes(raw, "tools", TOOLS)) == "kept"
        assert r.find_member(raw, "tools") == "kept", text
    k = orjson.dumps(TOOLS).decode()
    for text in (
        '{"model":"m","m":[{"tools":@}]}',
        '{"model":"m","m":[{"tools":@,"z":[1]}]}',
        '{"model":"m","tools":@,"tools":[]}',
        '{"model":"m","x\\"tools":@}',
        '{"model":"m","tools":@,"pad":"' + "p" * MAX_REST + '"}',
    ):
        assert member_bytes(text.replace("@", k).encode(), "tools", TOOLS) is None, text


def _agent(dialect: str, tools: Any = None, spaced: bool = False) -> tuple[dict[str, Any], bytes]:
    body = copy.deepcopy(agent_request.bodies()[dialect])
    if tools is not None:
        body["tools"] = tools
    return body, json.dumps(body).encode() if spaced else agent_request.encode(body)


def _no_encoding(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """The tools' JSON as a key would be encoded by `module.orjson.dumps`: any call of it now fails."""

    def dumps(*_: Any, **__: Any) -> bytes:
        raise AssertionError("the tools were encoded to find their translation")

    monkeypatch.setattr(module, "orjson", types.SimpleNamespace(dumps=dumps, loads=orjson.loads))


@pytest.mark.parametrize("spaced", [False, True])
def test_an_agents_next_turn_finds_its_tools_in_its_bytes(monkeypatch: pytest.MonkeyPatch, spaced: bool) -> None:
    """Written as orjson writes them, from the second turn on; else from the third (the second finds them by their
    key, and the bytes they were written as then)."""
    body, raw = _agent("messages", spaced=spaced)
    first = to_chat(body, raw=raw)
    to_chat(copy.deepcopy(body), raw=raw)
    with monkeypatch.context() as m:
        _no_encoding(m, body_json)
        again = to_chat(copy.deepcopy(body), raw=raw)
    assert again.body["tools"] is first.body["tools"]
    assert again.body["tools"].json == orjson.dumps([tool(t, j) for j, t in enumerate(body["tools"])])

    rbody, rraw = _agent("responses", spaced=spaced)
    rfirst = parse(rbody, None, rraw)
    parse(copy.deepcopy(rbody), None, rraw)
    _no_encoding(monkeypatch, body_json)
    ragain = parse(copy.deepcopy(rbody), None, rraw)
    assert ragain.options["tools"] is rfirst.options["tools"] and ragain.echo["tools"] is rfirst.echo["tools"]


def _translated(dialect: str, body: dict[str, Any], raw: bytes) -> Any:
    return to_chat(body, raw=raw).body["tools"] if dialect == "messages" else parse(body, None, raw).options["tools"]


def test_a_list_body_json_keeps_is_found_by_identity_without_its_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    body_json.clear()
    try:
        for dialect in ("messages", "responses"):
            raw = orjson.dumps(agent_request.bodies()[dialect])
            first = _translated(dialect, body_json.loads(raw), raw)
            second = body_json.loads(raw)
            assert body_json.tools_json(second["tools"]) is not None  # the list body_json keeps
            with monkeypatch.context() as m:  # not looked for in the bytes, nor encoded
                m.setattr(Recent, "find_member", lambda *_: pytest.fail("looked for in the bytes"))
                _no_encoding(m, body_json)
                assert _translated(dialect, second, raw) is first
            other = [dict(t) for t in second["tools"]]  # an equal list, another object: not by identity
            assert request._SAME_TOOLS.find(other) is None and kept_tools._same.find(other) is None
    finally:
        body_json.clear()


def test_the_bytes_are_searched_for_once_and_only_for_tools_found_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tools list seen once (a workload of more distinct lists than are kept) pays only for its key, as before."""
    searched: list[bytes] = []

    def counted(raw: bytes, name: str, value: Any) -> bytes | None:
        searched.append(raw)
        return member_bytes(raw, name, value)

    monkeypatch.setattr(body_json, "member_bytes", counted)
    body, raw = _agent("messages", spaced=True)
    to_chat(body, raw=raw)
    assert searched == []
    for _ in range(3):
        to_chat(copy.deepcopy(body), raw=raw)
    assert searched == [raw]
    # where the bytes cannot be found (a rest after the tools too long to parse), they are not searched for again
    searched.clear()
    request._RECENT_TOOLS.clear()
    body["metadata"] = {"user_id": "u" * MAX_REST}
    raw = json.dumps(body).encode()
    for _ in range(4):
        assert to_chat(copy.deepcopy(body), raw=raw).body["user"] == "u" * MAX_REST
    assert searched == [raw]


def test_a_copy_of_kept_tools_nested_in_a_message_is_not_the_requests_tools() -> None:
    body, raw = _agent("messages", TOOLS)
    to_chat(body, raw=raw)  # TOOLS kept
    agent, _ = _agent("messages")
    other = {"tools": OTHER, **{k: v for k, v in agent.items() if k not in ("tools", "messages")}}
    other["messages"] = agent["messages"]  # the tools first, the messages last
    other["messages"][-1]["content"] = [{"type": "text", "text": "x"}]
    # TOOLS written as kept where a short rest after them would put the request's own: in the last message's block
    text = orjson.dumps(other).decode()
    nested = text.replace('"text":"x"}', '"text":"x","tools":' + orjson.dumps(TOOLS).decode() + "}")
    assert nested != text and orjson.loads(nested)["tools"] == OTHER and list(other)[-1] == "messages"
    got = to_chat(orjson.loads(nested), raw=nested.encode())
    assert orjson.loads(got.body["tools"].json) == [tool(t, 0) for t in OTHER]
