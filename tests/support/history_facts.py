"""What a dialect's translation gives of a request, as the kept-history tests compare it (dialects/history.py):
the chat body (as the engine gets it: a kept history's JSON spliced in is checked to be a plain encoding's), the
estimate and everything gathered for sizing, and the same translated with nothing kept."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import orjson

from llm_gateway.dialects.history import Histories
from llm_gateway.routing.gathered import Gathered
from llm_gateway.wire.client_body import encode, joined


def facts(body: dict[str, Any], estimate: int, g: Gathered | None) -> tuple[Any, ...]:
    """The chat body's bytes, the estimate, and what `g` holds and sums to."""
    assert g is not None
    written = joined(encode(body, body))  # as an engine gets it: from a kept history's JSON where there is one
    assert written == orjson.dumps(body), "the spliced body differs from a plain encoding"
    as_json = orjson.dumps(g.as_json)
    sums = g.sums(len(body["messages"]), set())
    return orjson.dumps(body), estimate, g.texts, g.strings, as_json, g.images, g.other_parts, g.fresh, sums


def afresh(histories: Histories, translate: Callable[[dict[str, Any]], tuple[Any, ...]], req: Any) -> tuple[Any, ...]:
    """`translate(req)` with no history kept (those kept are put back after)."""
    saved = list(histories.kept)
    histories.clear()
    try:
        return translate(copy.deepcopy(req))
    finally:
        histories.kept[:] = saved


def reparsed(req: dict[str, Any]) -> dict[str, Any]:
    """As the handler has it: parsed from bytes (nothing shared with an earlier request)."""
    out: dict[str, Any] = orjson.loads(orjson.dumps(req))
    return out
