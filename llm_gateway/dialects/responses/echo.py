"""The Response object's echo of a request's `tools` and `instructions`, as JSON kept across turns.

A Response echoes the request's tools and instructions (`ResponsesRequest.echo`): a coding agent's 20 tool
schemas and its long system prompt, the same on every turn of its session, written into the whole Response
once and into a stream three times (`response.created`, `.in_progress`, `.completed`). Encoding them each
time was a third of what /v1/responses costs over chat completions (issue 36 item 2). Here their JSON is
kept for the last `KEPT` distinct values of each (per process, dialects/recent.py), found by the bytes the
request's chat tools were already encoded as (`Gathered.tools_json`: the echo is a function of them) and by the
instructions' text; `fragments()` gives them as `orjson.Fragment`s to put over the Response's own values when it
is encoded (`dumps`), so the bytes are those a plain encoding writes. The Response object itself keeps its plain
values (stored, listed, answered again as they are).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.recent import Recent
from llm_gateway.dialects.responses.request import ResponsesRequest

#: distinct tools (and instructions) whose JSON is kept
KEPT = 8
_TOOLS: Recent[orjson.Fragment] = Recent(KEPT)
_INSTRUCTIONS: Recent[orjson.Fragment] = Recent(KEPT)


def kept_json(kept: Recent[orjson.Fragment], key: str | bytes, value: Any) -> orjson.Fragment:
    """`value`'s JSON, kept in `kept` under `key` (which decides `value`): found, or encoded and kept."""
    found = kept.find(key)
    if found is None:
        found = kept.keep(key, orjson.Fragment(orjson.dumps(value)))
    return found


def fragments(req: ResponsesRequest) -> dict[str, Any]:
    """The echoed `tools` and `instructions` of `req` as encoded JSON, where they are long enough to keep."""
    out: dict[str, Any] = {}
    tools = req.echo.get("tools")
    key = req.gathered.tools_json if req.gathered is not None else b""
    if tools and key:
        out["tools"] = kept_json(_TOOLS, key, tools)
    text = req.echo.get("instructions")
    if isinstance(text, str) and text:
        out["instructions"] = kept_json(_INSTRUCTIONS, text, text)
    return out


def dumps(resp: dict[str, Any], encoded: dict[str, Any]) -> bytes:
    """A Response object as JSON, its echoed fields from `encoded` (`fragments()`)."""
    return orjson.dumps({**resp, **encoded} if encoded else resp)
