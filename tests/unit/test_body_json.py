"""wire/body_json.py: a body's top-level `tools` kept from an earlier body are not parsed again, and what comes out
is exactly what parsing it whole gives (values, types, key order), or it is parsed whole."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.routing.request_info import read_request
from llm_gateway.wire import body_json
from llm_gateway.wire.client_body import ClientBody

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    body_json.clear()
    yield
    body_json.clear()


def _tools(n: int = 12, extra: Any = 1) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": "does a thing " * 8,
                "parameters": {"type": "object", "properties": {"x": {"type": "integer", "default": extra}}},
            },
        }
        for i in range(n)
    ]


def _body(tools: Any, **after: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi " * 300}], "tools": tools, **after}


def _same(parsed: Any, raw: bytes) -> None:
    """`parsed` is what orjson gives for `raw` whole: equal, and equal as JSON (types and key order included)."""
    whole = orjson.loads(raw)
    assert parsed == whole
    assert orjson.dumps(parsed) == orjson.dumps(whole)


@pytest.mark.parametrize(
    "encode", [orjson.dumps, lambda o: json.dumps(o).encode(), lambda o: json.dumps(o, indent=1).encode()]
)
def test_an_agents_resent_tools_are_parsed_once_and_shared(encode: Any) -> None:
    body = agent_request.bodies()["chat"]
    raw = encode(body)
    first = body_json.loads(raw)
    second = body_json.loads(raw)
    _same(first, raw)
    _same(second, raw)
    assert second["tools"] is first["tools"]  # the kept list: not parsed again
    assert list(second) == list(body)  # `tools` where the client put it
    assert body_json.tools_json(second["tools"]) == orjson.dumps(body["tools"])
    assert body_json.tools_json(list(second["tools"])) is None  # by identity only: a changed body's tools are encoded


def test_the_rest_of_the_body_is_parsed_each_time() -> None:
    tools = _tools()
    one = body_json.loads(orjson.dumps(_body(tools, max_tokens=5)))
    two_raw = orjson.dumps({**_body(tools, max_tokens=7), "messages": [{"role": "user", "content": "other"}]})
    two = body_json.loads(two_raw)
    assert two["tools"] is one["tools"]
    assert two["max_tokens"] == 7 and two["messages"] == [{"role": "user", "content": "other"}]
    _same(two, two_raw)


@pytest.mark.parametrize("other", [1.0, True, "1", None, [1]])
def test_tools_equal_in_python_but_not_in_json_are_not_taken_for_the_kept_ones(other: Any) -> None:
    kept = body_json.loads(orjson.dumps(_body(_tools(extra=1))))
    raw = orjson.dumps(_body(_tools(extra=other)))
    got = body_json.loads(raw)
    assert got["tools"] is not kept["tools"]
    _same(got, raw)


def test_tools_with_keys_in_another_order_are_their_own() -> None:
    kept = body_json.loads(orjson.dumps(_body(_tools())))
    swapped = [{"function": t["function"], "type": t["type"]} for t in _tools()]
    raw = orjson.dumps(_body(swapped))
    got = body_json.loads(raw)
    assert got["tools"] is not kept["tools"]
    assert list(got["tools"][0]) == ["function", "type"]


def test_the_same_bytes_nested_or_duplicated_are_not_the_top_level_tools() -> None:
    tools = _tools()
    written = orjson.dumps(tools)
    body_json.loads(orjson.dumps(_body(tools)))  # kept
    nested = b'{"model":"m","messages":[],"tools":[],"metadata":{"tools":' + written + b"}}"
    got = body_json.loads(nested)
    assert got["tools"] == [] and got["metadata"]["tools"] == tools
    _same(got, nested)
    # a later duplicate member is the one a parser keeps
    dup = b'{"model":"m","tools":' + written + b',"tools":[{"type":"function"}]}'
    got = body_json.loads(dup)
    assert got["tools"] == [{"type": "function"}]
    # inside a string (escaped) is text, not a member
    text = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": '"tools":' + written.decode()}]})
    _same(body_json.loads(text), text)


def test_a_body_that_is_not_json_is_refused_with_or_without_its_kept_tools() -> None:
    tools = _tools()
    body_json.loads(orjson.dumps(_body(tools)))
    bad = b'{"model":"m","messages":[,],"tools":' + orjson.dumps(tools) + b"}"
    with pytest.raises(orjson.JSONDecodeError):
        body_json.loads(bad)


def test_only_lists_worth_keeping_where_they_can_be_found_cheaply_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    small = [{"type": "function", "function": {"name": "f"}}]
    body_json.loads(orjson.dumps(_body(small)))
    assert body_json.tools_json(body_json.loads(orjson.dumps(_body(small)))["tools"]) is None  # under MIN_BYTES
    huge = _tools(n=12, extra="y" * body_json.MAX_BYTES)
    body_json.loads(orjson.dumps(_body(huge)))
    assert body_json.tools_json(body_json.loads(orjson.dumps(_body(huge)))["tools"]) is None  # over MAX_BYTES
    # tools before the messages: finding them would mean proving a long rest on every request; not kept
    looked: list[bytes] = []
    find = body_json.member_bytes
    monkeypatch.setattr(body_json, "member_bytes", lambda raw, *a: looked.append(raw) or find(raw, *a))
    first = {"model": "m", "tools": _tools(), "messages": [{"role": "user", "content": "x"}] * 400}
    one, two = body_json.loads(orjson.dumps(first)), body_json.loads(orjson.dumps(first))
    assert one["tools"] is not two["tools"] and body_json.tools_json(two["tools"]) is None
    assert looked == []  # not even looked for (that parses the rest, on every such request)
    # worth keeping: the client's bytes (not orjson's here) are searched for once, when the list is found again
    raw = json.dumps(_body(_tools(), max_tokens=3)).encode()
    kept = body_json.loads(raw)["tools"]
    assert looked == []  # kept under its JSON; a list seen once pays no search
    again = body_json.loads(raw)["tools"]
    assert again is kept and len(looked) == 1  # found by its JSON: the kept list shared, its bytes searched for
    assert body_json.loads(raw)["tools"] is kept and len(looked) == 1  # found in the bytes: not searched again


def test_the_estimate_of_a_kept_body_is_the_whole_parses() -> None:
    raw = agent_request.encode(agent_request.bodies()["chat"])
    body_json.loads(raw)
    kept = read_request("chat", ClientBody(body_json.loads(raw), raw))
    whole = read_request("chat", ClientBody(orjson.loads(raw), raw))
    assert kept.tools_json == whole.tools_json
    assert (kept.prompt_tokens, kept.prompt_ceiling, kept.prompt_floor) == (
        whole.prompt_tokens,
        whole.prompt_ceiling,
        whole.prompt_floor,
    )
