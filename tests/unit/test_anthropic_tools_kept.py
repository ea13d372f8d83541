"""An Anthropic request's tools are translated once for the last few distinct tool lists (issue 36 item 2): a list
byte for byte the same gets the kept chat tools, whose JSON is what translating it anew gives; any difference, a
number's type included (1 against 1.0), is translated anew; a bad tool is still a 400."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects.anthropic import request
from llm_gateway.dialects.anthropic.options import tool
from llm_gateway.dialects.anthropic.request import RECENT_TOOLS, to_chat
from llm_gateway.errors import InvalidRequest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


def _agent(tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = copy.deepcopy(agent_request.bodies()["messages"])
    if tools is not None:
        body["tools"] = tools
    return body


def _plain(tools: list[dict[str, Any]]) -> bytes:
    return orjson.dumps([tool(t, j) for j, t in enumerate(tools)])


@pytest.fixture(autouse=True)
def _empty() -> None:
    request._RECENT_TOOLS.clear()
    request._SAME_TOOLS.clear()


def test_the_same_tools_again_are_the_kept_translation() -> None:
    first, again = to_chat(_agent()), to_chat(_agent())
    assert again.body["tools"] is first.body["tools"]
    assert again.body["tools"].json == _plain(_agent()["tools"])
    assert again.gathered is not None and again.gathered.tools_json is again.body["tools"].json
    assert orjson.dumps(again.body) == orjson.dumps(first.body)


def test_any_difference_is_translated_anew() -> None:
    tools = _agent()["tools"]
    changed = copy.deepcopy(tools)
    changed[2]["description"] = changed[2]["description"].replace("a", "e")  # the same length
    base = {"name": "n", "input_schema": {"type": "object", "properties": {"k": {"type": "integer", "minimum": 1}}}}
    as_float = copy.deepcopy(base)
    as_float["input_schema"]["properties"]["k"]["minimum"] = 1.0  # equal in Python, not in JSON
    for t in (tools, changed, [base], [as_float], tools):
        got = to_chat(_agent(t)).body["tools"]
        assert got.json == _plain(t) and orjson.loads(got.json) == [tool(x, j) for j, x in enumerate(t)]
    assert b'"minimum":1.0' in to_chat(_agent([as_float])).body["tools"].json


def test_only_the_last_few_are_kept_and_a_bad_tool_is_still_refused() -> None:
    first = to_chat(_agent()).body["tools"]
    for i in range(RECENT_TOOLS):
        to_chat(_agent([{"name": f"t{i}", "input_schema": {"type": "object"}}]))
    assert to_chat(_agent()).body["tools"] is not first  # pushed out
    bad = [{"name": "x", "input_schema": {"type": "object"}, "type": "web_search_20250305"}]
    for _ in range(2):
        with pytest.raises(InvalidRequest):
            to_chat(_agent(bad))
    assert "tools" not in to_chat(_agent([])).body
