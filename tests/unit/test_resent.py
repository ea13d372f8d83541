"""wire/resent.py through wire/body_json.loads: a request that resends a kept conversation's entries, byte for byte,
is parsed with them not parsed again and gives exactly what parsing it whole gives (values, types, key order), in
each API's body, in compact, spaced and indented JSON, and against bodies made to mislead where the entries lie
(duplicate keys, the next member's name inside the entries, the markers' own strings)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gateway.wire import body_json, resent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    body_json.clear()
    yield
    body_json.clear()


def same(raw: bytes) -> Any:
    """`body_json.loads(raw)`, checked to be what a whole parse gives: the same JSON, keys in the same order."""
    got = body_json.loads(raw)
    assert orjson.dumps(got) == orjson.dumps(orjson.loads(raw))
    return got


FORMATS = {
    "compact": lambda v: orjson.dumps(v),
    "spaced": lambda v: json.dumps(v).encode(),
    "indented": lambda v: json.dumps(v, indent=2).encode() + b"\n",
}


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("dialect", ["chat", "messages", "responses"])
def test_each_turn_of_a_conversation_parses_as_a_whole_parse_would(dialect: str, fmt: str) -> None:
    dump = FORMATS[fmt]
    body = agent_request.bodies()[dialect]
    name = "input" if dialect == "responses" else "messages"
    entry = {"role": "user", "content": "go on"}
    first = same(dump(body))
    again = same(dump(body))  # resent as it was (a retry)
    assert again[name][0] is first[name][0]  # kept: not parsed again
    lead = {"chat": "model", "messages": "system", "responses": "instructions"}[dialect]
    assert same(dump(body))[lead] is again[lead]  # nor the members before the array (a system prompt)
    turns = [first]
    for n in range(1, 4):
        turn = {**body, name: body[name] + [entry] * n}
        got = same(dump(turn))
        assert got[name][0] is first[name][0] and got[name][-1] == entry
        turns.append(got)
    assert len(body_json.RESENT.kept) == 1  # each turn replaced the last
    # an edited early entry: the prefix differs, parsed whole, kept afresh
    edited = {**body, name: [{"role": "user", "content": "else"}, *body[name][1:]]}
    got = same(dump(edited))
    assert got[name][1] is not first[name][1]


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_the_array_may_be_anywhere_among_the_members(where: str) -> None:
    history = agent_request.bodies()["chat"]["messages"]
    members = {"model": "m", "max_tokens": 9, "stream": False}
    keys = list(members)
    at = {"first": 0, "middle": 2, "last": 3}[where]
    keys.insert(at, "messages")

    def body(entries: list[Any]) -> bytes:
        return orjson.dumps({k: entries if k == "messages" else members[k] for k in keys})

    first = same(body(history))
    got = same(body([*history, {"role": "user", "content": "x"}]))
    assert got["messages"][0] is first["messages"][0]
    got = same(body([*history, {"role": "user", "content": "x"}, {"role": "user", "content": "y"}]))
    assert got["messages"][0] is first["messages"][0]


def _long(n: int = 60) -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"message {i} " + "x" * 200} for i in range(n)]


def test_a_duplicate_key_never_puts_the_wrong_entries_in_place() -> None:
    # the first "messages" is not the one parsed (the last is): what was found by name is checked before its use
    history = _long()
    decoy = orjson.dumps({"messages": history})[1:-1]  # "messages":[...]
    real = orjson.dumps([{"role": "user", "content": "real"}])
    raw = b'{"model":"m",' + decoy + b',"model":"x","messages":' + real + b',"max_tokens":9}'
    same(raw)
    nxt = b'{"model":"m",' + decoy[:-1] + b',{"role":"user","content":"more"}],"model":"x","max_tokens":9}'
    got = same(nxt)
    assert got["model"] == "x" and len(got["messages"]) == len(history) + 1
    again = b'{"model":"m",' + decoy[:-1] + b',{"role":"user","content":"more"}],"messages":[1],"max_tokens":9}'
    assert same(again)["messages"] == [1]
    # kept by its first name, which is not the parsed one: a later request that resends those bytes must not take
    # the kept entries for the ones before its marker (the member between the two is lost to the marked parse)
    body_json.clear()
    two = b'{"model":"m","messages":' + orjson.dumps(history) + b',"model":"x","messages":[{"a":1}'
    same(two + b'],"max_tokens":9}')
    assert same(two + b',{"b":2}],"max_tokens":9}')["model"] == "x"


def test_an_end_put_inside_a_later_member_is_not_taken_for_the_arrays() -> None:
    history = _long()
    same(orjson.dumps({"model": "m", "messages": history, "max_tokens": 9}))
    later = {"b": [2], "max_tokens": 3}  # `],"max_tokens"` again after the array, and inside a new entry
    got = same(orjson.dumps({"model": "m", "messages": [*history, {"c": 1}], "max_tokens": 9, "z": later}))
    assert got["messages"][0] is not None
    got = same(orjson.dumps({"model": "m", "messages": [*history, {"c": 1}, later], "max_tokens": 9}))
    assert got["messages"][-1] == later


def test_a_member_before_the_array_written_again_after_it() -> None:
    history = _long()
    cases = [(b'"model":"a",', b',"model":"b"', False), (b'"model":"a","model":"b",', b"", True), (b"", b"", True)]
    for before, after, kept in cases:  # the first is not kept: its end is not found by the next member's name
        body_json.clear()
        raw = b"{" + before + b'"messages":' + orjson.dumps(history) + after + b"}"
        same(raw)
        nxt = b"{" + before + b'"messages":' + orjson.dumps([*history, 1]) + after + b',"x":2}'
        assert (same(nxt)["messages"][0] is same(nxt)["messages"][0]) is kept
    raw = b'{"messages":[1],"messages":' + orjson.dumps(history) + b"}"  # the name twice before the entries
    same(raw)
    same(b'{"messages":[1],"messages":' + orjson.dumps([*history, 2]) + b"}")


def test_the_next_members_name_inside_the_entries_or_after_them() -> None:
    history = [*_long(), {"role": "tool", "content": [{"a": [1], "max_tokens": 2}]}]  # `],"max_tokens"` nested
    raw = orjson.dumps({"model": "m", "messages": history, "max_tokens": 9, "z": {"b": [2], "max_tokens": 3}})
    same(raw)
    for more in ([{"role": "user", "content": "x"}], [{"c": [3], "max_tokens": 4}]):
        raw = orjson.dumps(
            {"model": "m", "messages": history + more, "max_tokens": 9, "z": {"b": [2], "max_tokens": 3}}
        )
        same(raw)


def test_the_markers_strings_in_a_body_are_taken_as_the_clients() -> None:
    history = _long()
    same(orjson.dumps({"model": "m", "messages": history}))
    for planted in (resent.SENT, resent.END, resent.SENT_JSON.decode(), "resent-" + resent.SENT[8:]):
        got = same(orjson.dumps({"model": "m", "messages": [*history, planted]}))
        assert got["messages"][-1] == planted
        got = same(orjson.dumps({"model": "m", "messages": [*history, {"role": "user", "content": planted}]}))
        assert got["messages"][-1]["content"] == planted


def test_bytes_that_are_not_json_fail_as_orjson_fails() -> None:
    history = _long()
    raw = orjson.dumps({"model": "m", "messages": history, "max_tokens": 9})
    same(raw)
    for bad in (raw[:-1], raw[:-20], raw.replace(b',"max_tokens"', b',,"max_tokens"'), raw + b"x"):
        with pytest.raises(orjson.JSONDecodeError):
            body_json.loads(bad)
    nxt = orjson.dumps({"model": "m", "messages": [*history, {"role": "user"}], "max_tokens": 9})
    for bad in (nxt[:-1], nxt.replace(b'{"role":"user"}', b'{"role":}')):
        with pytest.raises(orjson.JSONDecodeError):
            body_json.loads(bad)
    same(nxt)


def test_what_is_kept_is_bounded() -> None:
    short = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}] * 20})
    same(short)
    assert not body_json.RESENT.kept  # under MIN_BYTES: parsed every time
    for i in range(resent.KEPT + 3):
        same(orjson.dumps({"model": f"m{i}", "messages": _long()}))
    assert len(body_json.RESENT.kept) == resent.KEPT
    body_json.clear()
    big = [{"role": "user", "content": "x" * (resent.MAX_BYTES // 4)}] * 5  # entries over MAX_BYTES
    same(orjson.dumps({"model": "m", "messages": big}))
    near = big[:3]  # entries within it, in a request over twice it
    same(orjson.dumps({"model": "m", "messages": near, "metadata": "y" * (2 * resent.MAX_BYTES)}))
    assert not body_json.RESENT.kept
    same(orjson.dumps({"model": "m", "messages": near}))
    assert len(body_json.RESENT.kept) == 1


# -- any conversation, any turn --------------------------------------------------------------------------------------

_PIECES = [*'ab "\\],[{}:\n\x00é', '"max_tokens":', '],"model":', '"messages":[']
_text = st.lists(st.sampled_from(_PIECES), max_size=12).map("".join)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from([1.0, 0.5, -0.0]), _text)
_value = st.recursive(
    _leaf,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["messages", "model", "max_tokens", "content", "x"]), inner, max_size=3)
    ),
    max_leaves=8,
)
_entry = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]), "content": _value}), _value
)
_turn = st.tuples(st.sampled_from(["more", "same", "edit", "fewer", "dup", "shape"]), st.lists(_entry, max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=st.lists(_entry, min_size=1, max_size=6),
    turns=st.lists(_turn, min_size=1, max_size=5),
    fmt=st.sampled_from(list(FORMATS)),
    after=st.sampled_from([[], ["max_tokens"], ["max_tokens", "stream"]]),
)
def test_any_conversation_parses_as_a_whole_parse_would(
    start: list[Any], turns: list[tuple[str, list[Any]]], fmt: str, after: list[str]
) -> None:
    body_json.clear()
    dump = FORMATS[fmt]
    pad = [{"role": "system", "content": "p" * resent.MIN_BYTES}]  # long enough to be kept
    entries = pad + start

    def raw_of(entries: list[Any], dup: bool = False) -> bytes:
        body: dict[str, Any] = {"model": "m", "messages": entries}
        body.update({k: 1 for k in after})
        raw = dump(body)
        if dup:  # a second top-level "messages" (the one parsed), after the rest
            raw = raw.rstrip()[:-1] + b',"messages":' + orjson.dumps(entries[-2:]) + b"}"
        return raw

    last = same(raw_of(entries))["messages"][0]  # the entry every turn that resends them reuses
    for kind, more in turns:
        if kind == "more":
            entries = entries + more
        elif kind == "edit" and len(entries) > 1:
            entries = [*entries[:-1], {"edited": more}]
        elif kind == "fewer" and len(entries) > 2:
            entries = entries[:-1]
        elif kind == "shape":  # the same entries, the array's end then another member's name
            same(raw_of(entries).replace(b'"model"', b'"model2"', 1))
        got = same(raw_of(entries, dup=kind == "dup"))
        if kind in ("more", "same") and last is not None:  # after a plain turn: resent, not parsed again
            assert got["messages"][0] is last
        last = got["messages"][0] if kind in ("more", "same", "edit", "fewer") else None
