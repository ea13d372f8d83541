"""A Responses request's tools are translated once for the last few distinct tool lists (issue 36 item 2): a list
byte for byte the same gets the kept chat tools and echo, equal to translating it anew; any difference, a number's
type included (1 against 1.0), is translated anew; a bad tool is still a 400."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects.responses import tools as kept_tools
from llm_gateway.dialects.responses.request import parse
from llm_gateway.errors import GatewayError

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


def _agent(tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    body = copy.deepcopy(agent_request.bodies()["responses"])
    if tools is not None:
        body["tools"] = tools
    return body


def _fresh(tools: list[dict[str, Any]]) -> tuple[bytes, list[dict[str, Any]]]:
    chat, echoed = kept_tools._translate(copy.deepcopy(tools))
    return chat.json, echoed


@pytest.fixture(autouse=True)
def _empty() -> None:
    kept_tools._kept.clear()
    kept_tools._same.clear()


def test_the_same_tools_again_are_the_kept_translation() -> None:
    first, again = parse(_agent()), parse(_agent())
    assert again.options["tools"] is first.options["tools"] and again.echo["tools"] is first.echo["tools"]
    json, echoed = _fresh(_agent()["tools"])
    assert again.options["tools"].json == json == orjson.dumps(list(again.options["tools"]))
    assert again.echo["tools"] == echoed and len(echoed) == 20
    assert again.gathered is not None and again.gathered.tools_json is again.options["tools"].json


def test_any_difference_is_translated_anew() -> None:
    tools = _agent()["tools"]
    changed = copy.deepcopy(tools)
    changed[2]["description"] = changed[2]["description"].replace("a", "e")  # the same length
    base = {"type": "function", "name": "n", "parameters": {"type": "object", "properties": {"k": {"minimum": 1}}}}
    as_float = copy.deepcopy(base)
    as_float["parameters"]["properties"]["k"]["minimum"] = 1.0  # equal in Python, not in JSON
    for t in (tools, changed, [base], [as_float], [{**base, "strict": False}], tools):
        req = parse(_agent(t))
        json, echoed = _fresh(t)
        assert req.options["tools"].json == json and req.echo["tools"] == echoed
        assert orjson.dumps(req.echo["tools"]) == orjson.dumps(echoed)
    assert b'"minimum":1.0' in parse(_agent([as_float])).options["tools"].json


def test_only_the_last_few_are_kept_and_a_bad_tool_is_still_refused() -> None:
    first = parse(_agent()).options["tools"]
    for i in range(kept_tools.KEPT):
        parse(_agent([{"type": "function", "name": f"t{i}"}]))
    assert parse(_agent()).options["tools"] is not first  # pushed out
    for _ in range(2):
        with pytest.raises(GatewayError):
            parse(_agent([{"type": "web_search"}]))
    req = parse(_agent([]))
    assert "tools" not in req.options and req.echo["tools"] == []
