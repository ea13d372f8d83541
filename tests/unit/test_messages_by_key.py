"""request_info gathers chat messages a field at a time (`_gather_by_key`) where every role is a string and every
content a string or null, the shape of an agent's history (issue 36 item 2): what it gathers sums to what the
message-at-a-time walk (`_gather_each`) gathers, and any other shape falls back to the walk, which names the fault.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.gathered import _gather_by_key, _gather_each
from llm_gateway.routing.gathered import messages_sums as _messages

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request

_TEXTS = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)
_VALUES = st.none() | _TEXTS | st.lists(st.dictionaries(st.sampled_from(["id", "type"]), _TEXTS), max_size=2)
_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"])},
    optional={
        "content": st.none() | _TEXTS,
        "tool_calls": _VALUES,
        "tool_call_id": _VALUES,
        "name": st.none() | _TEXTS,
        "reasoning_content": _VALUES,
    },
)


def _sums(g: Any, count: int) -> tuple[Any, ...]:
    needs: set[str] = set()
    return (*g.sums(count, needs), needs, g.images, g.other_parts)


@given(st.lists(_MESSAGE, min_size=1, max_size=8))
@example([{"role": "user", "content": ""}, {"role": "assistant", "content": None, "tool_calls": []}])
@example([{"role": "tool", "tool_call_id": "x", "content": "é"}, {"role": "assistant", "name": 3}])
@example([{"role": "user", "name": "a", "content": "q"}, {"role": "user", "name": ["b"]}])
def test_by_key_sums_to_what_the_walk_gathers(messages: list[dict[str, Any]]) -> None:
    by_key = _gather_by_key(messages)
    assert by_key is not None  # this shape takes the fast path
    assert _sums(by_key, len(messages)) == _sums(_gather_each(messages), len(messages))


def test_the_agent_request_takes_the_fast_path() -> None:
    messages = orjson.loads(agent_request.encode(agent_request.bodies()["chat"]))["messages"]
    by_key = _gather_by_key(messages)
    assert by_key is not None and _sums(by_key, len(messages)) == _sums(_gather_each(messages), len(messages))


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": [{"type": "text", "text": "t"}]}],  # content parts: the walk reads them
        [{"role": 1, "content": "q"}],
        ["x"],
        [None],
        [{"role": "user", "content": {}}],
    ],
)
def test_other_shapes_fall_back_to_the_walk(messages: list[Any]) -> None:
    assert _gather_by_key(messages) is None
    try:
        expected: Any = _sums(_gather_each(messages), len(messages))
    except InvalidRequest as e:
        with pytest.raises(InvalidRequest) as got:
            _messages(messages, set())
        assert got.value.param == e.param
    else:
        needs: set[str] = set()
        assert _messages(messages, needs) == expected[:5] and needs == expected[5]
