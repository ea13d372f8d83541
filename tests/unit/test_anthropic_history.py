"""dialects/history.py, as the Anthropic translation uses it: a Messages request whose leading messages equal a
kept history's reuses their translation, and gives exactly what translating it afresh gives (chat body, estimate,
gathered sizes, errors); what is kept is never changed by a later request."""

from __future__ import annotations

import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects import history
from llm_gateway.dialects.anthropic.blocks import HISTORIES
from llm_gateway.dialects.anthropic.request import MessagesRequest, to_chat
from llm_gateway.errors import InvalidRequest
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
    body: dict[str, Any] = agent_request.bodies()["messages"]
    return body


def _facts(r: MessagesRequest) -> tuple[Any, ...]:
    return facts(r.body, r.prompt_estimate, r.gathered)


def _afresh(req: dict[str, Any]) -> tuple[Any, ...]:
    return afresh(HISTORIES, lambda q: _facts(to_chat(q)), req)


_parsed = reparsed


def test_a_resent_history_is_translated_once_and_gives_the_same() -> None:
    req = _agent()
    first = to_chat(_parsed(req))
    assert len(HISTORIES.kept) == 1
    again = to_chat(_parsed(req))
    assert _facts(again) == _facts(first) == _afresh(req)
    # reused, not translated: the same chat message objects
    assert again.body["messages"][1] is first.body["messages"][1]
    assert len(HISTORIES.kept) == 1
    # nor encoded again: the engine's body is written from the kept JSON (the system prompt's too), not a copy of it
    written = encode(again.body, again.body)
    assert type(again.body["messages"]) is EncodedMessages and type(written) is Spliced
    assert any(p.obj is HISTORIES.kept[0].json for p in written.parts if type(p) is memoryview)


def test_a_next_turn_reuses_the_prefix_and_translates_the_rest() -> None:
    req = _agent()
    to_chat(_parsed(req))
    turn = _parsed(req)
    turn["messages"] += [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_n", "name": "read", "input": {"p": 1}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_n", "content": "boom", "is_error": True},
                {"type": "image", "source": {"type": "url", "url": "http://x/y.png"}},
                {"type": "text", "text": "fix it"},
            ],
        },
    ]
    got = to_chat(turn)
    assert _facts(got) == _afresh(turn)
    assert [k.given for k in HISTORIES.kept] == [req["messages"]]  # with an image: not kept (MAX_CHARS)
    turn["messages"][-1]["content"].pop(1)
    assert _facts(to_chat(turn)) == _afresh(turn)
    assert [k.given for k in HISTORIES.kept] == [turn["messages"]]  # holds the old one whole: kept instead of it
    # an edited middle message: reused up to it, translated from it
    edited = _parsed(req)
    edited["messages"][5] = {"role": "user", "content": [{"type": "text", "text": "something else"}]}
    assert _facts(to_chat(edited)) == _afresh(edited)
    # a shorter history (the client dropped its last turns): a prefix of a kept one
    short = _parsed(req)
    del short["messages"][-7:]
    assert _facts(to_chat(short)) == _afresh(short)


def test_values_that_differ_in_type_or_content_are_not_reused() -> None:
    req = _agent()
    to_chat(_parsed(req))
    other = _parsed(req)
    first = other["messages"][0]
    first["content"] = [*first["content"], {"type": "text", "text": "!"}] if isinstance(first["content"], list) else "!"
    assert _facts(to_chat(other)) == _afresh(other)


def test_a_bad_message_after_a_reused_prefix_is_the_same_error_and_nothing_is_kept() -> None:
    req = _agent()
    to_chat(_parsed(req))
    bad = _parsed(req)
    n = len(bad["messages"])
    bad["messages"].append({"role": "assistant", "content": [{"type": "video"}]})
    with pytest.raises(InvalidRequest) as reused:
        to_chat(bad)
    HISTORIES.clear()
    with pytest.raises(InvalidRequest) as fresh:
        to_chat(_parsed(bad))
    assert (str(reused.value), reused.value.param) == (str(fresh.value), fresh.value.param)
    assert f"messages.{n}" in str(reused.value.param)
    assert len(HISTORIES.kept) == 0


def test_what_is_kept_is_not_changed_by_later_requests() -> None:
    req = _agent()
    first = to_chat(_parsed(req))
    before = orjson.dumps(first.body), copy.deepcopy(first.gathered.texts)
    for extra in ("a", "b", "c"):
        turn = _parsed(req)
        turn["messages"].append({"role": "user", "content": extra})
        to_chat(turn)
    again = to_chat(_parsed(req))
    assert (orjson.dumps(again.body), again.gathered.texts) == before


def test_short_lists_and_many_conversations_stay_bounded() -> None:
    short = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}] * 3}
    to_chat(_parsed(short))
    assert HISTORIES.kept == []
    req = _agent()
    for k in range(history.KEPT + 3):
        other = _parsed(req)
        other["messages"][0] = {"role": "user", "content": f"conversation {k}"}
        assert _facts(to_chat(other)) == _afresh(other)
    assert len(HISTORIES.kept) == history.KEPT
    # a history over MAX_CHARS is translated, not kept
    HISTORIES.clear()
    long = _parsed(req)
    long["messages"][0] = {"role": "user", "content": "x" * (history.MAX_CHARS + 1)}
    assert _facts(to_chat(long)) == _afresh(long)
    assert HISTORIES.kept == []
