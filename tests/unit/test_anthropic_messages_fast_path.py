"""`blocks.messages` (the Messages translation's loop, with its fast path for the usual user and assistant messages
of blocks) gives what `blocks.message` gives message by message: the same chat messages, the same gathered sizes
and characters, and the same error (text and parameter) for a bad message, wherever it sits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects.anthropic.blocks import Seen, message, messages
from llm_gateway.errors import InvalidRequest

BENCH = Path(__file__).resolve().parents[2] / "bench"

GOOD: list[Any] = [
    {"role": "user", "content": "hello"},
    {"role": "assistant", "content": [{"type": "text", "text": "let me look"}]},
    {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}},
        ],
    },
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "x = 1"}]},
    {"role": "user", "content": [{"type": "text", "text": "and"}, {"type": "text", "text": "then"}]},
    {"role": "system", "content": [{"type": "text", "text": "be brief"}]},
    {"role": "system", "content": "be briefer"},
    {"role": "assistant", "content": "plain"},
    {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "a"}]},
            {"type": "tool_result", "tool_use_id": "toolu_3", "content": "b", "is_error": True},
        ],
    },
]

BAD: list[Any] = [
    "not an object",
    {"role": "user"},
    {"role": "user", "content": None},
    {"role": "user", "content": []},
    {"role": "assistant", "content": []},
    {"role": "system", "content": []},
    {"role": "robot", "content": [{"type": "text", "text": "x"}]},
    {"content": [{"type": "text", "text": "x"}]},
    {"role": "user", "content": 7},
    {"role": "user", "content": ["not a block"]},
    {"role": "assistant", "content": [{"type": "tool_use", "id": 1, "name": "n", "input": {}}]},
    {"role": "assistant", "content": [{"type": "image"}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": None, "content": "x"}]},
    {"role": "user", "content": [{"type": "video"}]},
]


def _one_by_one(raw: list[Any]) -> tuple[list[dict[str, Any]], Seen]:
    out: list[dict[str, Any]] = []
    seen = Seen()
    for i, m in enumerate(raw):
        message(m, i, out, seen)
    return out, seen


def _together(raw: list[Any]) -> tuple[list[dict[str, Any]], Seen]:
    out: list[dict[str, Any]] = []
    seen = Seen()
    messages(raw, out, seen)
    return out, seen


def _same(a: tuple[list[dict[str, Any]], Seen], b: tuple[list[dict[str, Any]], Seen]) -> None:
    assert a[0] == b[0]
    assert a[1].chars == b[1].chars
    ga, gb = a[1].gathered, b[1].gathered
    assert (ga.texts, ga.strings, ga.as_json, ga.images, ga.fresh, ga.other_parts) == (
        gb.texts,
        gb.strings,
        gb.as_json,
        gb.images,
        gb.fresh,
        gb.other_parts,
    )


def test_good_messages_as_one_by_one() -> None:
    _same(_together(GOOD), _one_by_one(GOOD))
    for m in GOOD:
        _same(_together([m]), _one_by_one([m]))


def test_the_agent_request_as_one_by_one() -> None:
    import sys

    sys.path.insert(0, str(BENCH))
    import agent_request

    raw = orjson.loads(orjson.dumps(agent_request.bodies()["messages"]))["messages"]
    _same(_together(raw), _one_by_one(raw))


@pytest.mark.parametrize("bad", BAD)
def test_a_bad_message_fails_the_same(bad: Any) -> None:
    for where in (0, 3, len(GOOD)):
        raw = [*GOOD[:where], bad, *GOOD[where:]]
        with pytest.raises(InvalidRequest) as slow:
            _one_by_one(raw)
        with pytest.raises(InvalidRequest) as fast:
            _together(raw)
        assert (str(fast.value), fast.value.param, fast.value.code) == (
            str(slow.value),
            slow.value.param,
            slow.value.code,
        )
