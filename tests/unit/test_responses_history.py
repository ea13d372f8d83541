"""dialects/history.py, as the Responses translation uses it: an unstored request whose leading input items equal a
kept history's reuses their translation up to where it carries no state (function calls join the assistant message
before them), and gives exactly what translating it afresh gives; stored requests and item references are never
kept; what is kept is never changed by a later request."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects.responses.items import HISTORIES
from llm_gateway.dialects.responses.request import ResponsesRequest, parse
from llm_gateway.errors import GatewayError
from llm_gateway.wire.client_body import EncodedMessages, Spliced, encode
from tests.support.history_facts import afresh, facts, reparsed

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    HISTORIES.clear()
    yield
    HISTORIES.clear()


def _agent() -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(orjson.dumps(agent_request.bodies()["responses"]))
    assert body["store"] is False
    return body


def _facts(r: ResponsesRequest) -> tuple[Any, ...]:
    return facts(r.chat_body([]), r.prompt_estimate, r.gathered)


def _afresh(req: dict[str, Any]) -> tuple[Any, ...]:
    return afresh(HISTORIES, lambda q: _facts(parse(q)), req)


_parsed = reparsed


def test_a_resent_history_is_translated_once_and_gives_the_same() -> None:
    req = _agent()
    first = parse(_parsed(req))
    assert len(HISTORIES.kept) == 1
    again = parse(_parsed(req))
    assert _facts(again) == _facts(first) == _afresh(req)
    assert again.messages[0] is first.messages[0]
    # nor encoded again: the engine's body is written from the kept JSON (the instructions' too), not a copy of it
    body = again.chat_body([])
    written = encode(body, body)
    assert type(body["messages"]) is EncodedMessages and type(written) is Spliced
    assert any(p.obj is HISTORIES.kept[0].json for p in written.parts if type(p) is memoryview)
    # an earlier conversation before the input (previous_response_id): encoded as a plain list
    earlier = again.chat_body([{"role": "user", "content": "before"}])
    assert type(earlier["messages"]) is list and type(encode(earlier, earlier)) is bytes


def test_a_prefix_is_reused_only_where_no_state_is_carried_on() -> None:
    req = _agent()
    parse(_parsed(req))
    kinds = [it.get("type") for it in req["input"]]
    at = kinds.index("function_call")  # a call joins the assistant message before it: the prefix ends before both
    for cut in (at, at + 1, at + 2, len(kinds) - 1):
        turn = _parsed(req)
        turn["input"][cut] = {"type": "function_call", "call_id": "c_new", "name": "grep", "arguments": "{}"}
        assert _facts(parse(turn)) == _afresh(turn), cut
    nxt = _parsed(req)
    nxt["input"] += [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
        {"type": "function_call", "call_id": "c9", "name": "read", "arguments": '{"p": 1}'},
        {"type": "function_call_output", "call_id": "c9", "output": "ok"},
        {"type": "message", "role": "assistant", "content": ""},
        {"type": "function_call", "call_id": "c10", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c10", "output": "fine"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go on"}]},
    ]
    assert _facts(parse(nxt)) == _afresh(nxt)
    assert _facts(parse(_parsed(nxt))) == _afresh(nxt)


def test_stored_requests_and_references_are_not_kept() -> None:
    stored = _agent()
    stored["store"] = True
    parse(_parsed(stored))
    assert HISTORIES.kept == []
    ref = _agent()
    ref["input"].append({"type": "item_reference", "id": "msg_1"})
    found = {"msg_1": {"type": "message", "role": "user", "content": "stored"}}
    parse(_parsed(ref), found)
    assert HISTORIES.kept == []


def test_a_bad_item_after_a_reused_prefix_is_the_same_error() -> None:
    req = _agent()
    parse(_parsed(req))
    bad = _parsed(req)
    bad["input"].append({"type": "computer_call"})
    with pytest.raises(GatewayError) as reused:
        parse(bad)
    HISTORIES.clear()
    with pytest.raises(GatewayError) as fresh:
        parse(_parsed(bad))
    assert (str(reused.value), reused.value.param) == (str(fresh.value), fresh.value.param)


def test_what_is_kept_is_not_changed_by_later_requests() -> None:
    req = _agent()
    before = _facts(parse(_parsed(req)))
    for extra in ("a", "b"):
        turn = _parsed(req)
        turn["input"] += [
            {"type": "function_call", "call_id": extra, "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": extra, "output": extra},
        ]
        parse(turn)
    assert _facts(parse(_parsed(req))) == before
