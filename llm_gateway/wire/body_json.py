"""A request body's JSON parsed with the top-level `tools` list of the last few distinct ones not parsed again.

A coding agent resends the same 20-odd tool schemas on every turn: ~20 KB of small nested objects whose parse and
freeing cost about as much as the rest of its 74 KB request (~410k instructions of ~1.1 M, counted by callgrind),
and whose encoding for the size estimate cost ~120k more (issue 36 item 2). `loads` keeps the parsed list of the
last `KEPT` distinct ones under their JSON as orjson writes it, with the bytes its client wrote it as
(`recent.member_bytes`, searched for once, when a list is first found again by that JSON); a body whose top-level
`tools` are, byte for byte, one kept list's written bytes (`Recent.find_member_at`: proven the top-level member,
so the hit is exact) is parsed with `null`
in their place, and the kept list is put back under `tools`: the dict equals what parsing it whole would give,
key order and types included. `tools_json` gives a kept list's JSON back by identity, so the estimate and the
prefix-cache key need no encoding.

A kept list is shared by every body it is found in: nothing may change it (the gateway replaces a body's fields,
never edits the client's nested values; adapters build their own). A body whose `tools` changed keeps
`tools_json` from answering (it looks a list up by identity).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

import orjson

from llm_gateway.wire import resent
from llm_gateway.wire.recent import MAX_REST, Recent, Same, member_bytes

T = TypeVar("T")

#: distinct tools lists kept
KEPT = 8
#: tools lists smaller than this are parsed every time (keeping them would save less than the lookup costs)
MIN_BYTES = 1024
#: nor larger than this (what is kept outlives its request: each is bounded, not only their count)
MAX_BYTES = 1 << 20


class KeptTools(NamedTuple):
    value: list[Any]  # the parsed list: never changed by anyone
    json: bytes  # orjson's encoding of it (the estimate's and the prefix cache's)


_kept: Recent[KeptTools] = Recent(KEPT)
#: the conversations resent (wire/resent.py)
RESENT = resent.Resent()


def loads(raw: bytes) -> Any:
    """`orjson.loads(raw)`, with a kept top-level `tools` list found in `raw` not parsed again, nor the leading
    entries of a resent conversation (wire/resent.py); raises orjson.JSONDecodeError as orjson does (a body that is
    not JSON is not JSON with or without its tools)."""
    found = _kept.find_member_at(raw, "tools")
    if len(raw) > resent.MIN_BYTES:
        again = RESENT.find(raw)
        if again is not None:
            body = _loads_again(raw, again, found)
            if body is not None:
                return body
    if found is None:
        body = orjson.loads(raw)
        if type(body) is dict:
            tools = body.get("tools")
            if type(tools) is list and tools:
                _keep_or_share(raw, body, tools)
    else:
        kept, start, end = found
        view = memoryview(raw)
        body = orjson.loads(b"".join((view[:start], b"null", view[end:])))  # one copy, no parse of the tools
        body["tools"] = kept.value  # the same place in the key order: the key was there, with null
    if len(raw) > resent.MIN_BYTES:
        RESENT.offer(raw, body)
    return body


def _loads_again(raw: bytes, again: resent.Found, found: tuple[KeptTools, int, int] | None) -> Any:
    """`raw` parsed with the kept entries it begins with (and its kept tools) not parsed again; None where the
    markers did not land where they were put (the caller parses it as if nothing were kept). An `END` that did
    not (the array's next member's name inside a new entry) is tried without: the request is then not kept."""
    body = _marked_loads(raw, again, found)
    if body is None and again.end >= 0:
        body = _marked_loads(raw, resent.Found(again.kept, -1), found)
    if body is None:
        return None
    if found is not None:
        body["tools"] = found[0].value
    elif type(tools := body.get("tools")) is list and tools:
        _keep_or_share(raw, body, tools)
    return body


def _marked_loads(raw: bytes, again: resent.Found, found: tuple[KeptTools, int, int] | None) -> Any:
    """`raw` parsed with `resent.cuts(again)` made, and `null` for the kept tools; None where that failed."""
    cuts = resent.cuts(again)
    if found is not None:
        cuts.append((found[1], found[2], b"null"))
        cuts.sort()
    view = memoryview(raw)
    pieces: list[bytes | memoryview] = []
    at = 0
    for start, end, instead in cuts:
        if start < at:
            return None  # overlapping places: not for this body
        pieces += (view[at:start], instead)
        at = end
    pieces.append(view[at:])
    marked = b"".join(pieces)
    try:
        body = orjson.loads(marked)
    except orjson.JSONDecodeError:
        return None
    return RESENT.take(raw, again, marked, body)


def _keep_or_share(raw: bytes, body: dict[str, Any], tools: list[Any]) -> None:
    """Put a kept list equal to `tools` (the top-level member of `body`, parsed from `raw`) in their place, or keep
    them, if they are written where a later body's can be found: before a short rest (`recent.MAX_REST`), so that
    finding them parses little. Their JSON is the key (the estimate encodes them on a miss anyway); the bytes the
    client wrote them as are searched for (`member_bytes`, a parse) once, when a list is found again by its key,
    not when it is kept: a workload of more distinct lists than are kept pays no more than before."""
    keys = list(body)
    for k in keys[keys.index("tools") + 1 :]:
        v = body[k]
        if isinstance(v, list | dict | str) and len(v) > MAX_REST // 8:
            return  # messages, a system prompt... after the tools: the rest is long, never proven; not tried
    json = orjson.dumps(tools)
    if not MIN_BYTES <= len(json) <= MAX_BYTES:
        return
    kept = _kept.find(json, lambda: member_bytes(raw, "tools", tools))
    if kept is None:
        _kept.keep(json, KeptTools(tools, json))
    else:
        body["tools"] = kept.value  # equal, and the one the dialects' and the estimate's caches know


def tools_json(tools: Any) -> bytes | None:
    """The JSON of `tools` where it is a kept list (by identity: the object `loads` put in a body), else None."""
    for kept in _kept.values():
        if kept.value is tools:
            return kept.json
    return None


def translated_tools(
    tools: list[Any], raw: bytes | None, recent: Recent[T], same: Same[T], translate: Callable[[], T]
) -> T:
    """A dialect's translation of a request's `tools` (`translate()`), kept in `recent` under their JSON: found first
    by the list's identity where it is a list kept here (`same`: the next request has the same object), then in `raw`
    (the request's bytes, whose top-level `tools` they are: `Recent.find_member`, as the client wrote them once found
    again), then by their JSON; made and kept where none is."""
    if (found := same.find(tools)) is not None:
        return found
    found = recent.find_member(raw, "tools") if raw is not None else None
    if found is None:
        key = orjson.dumps(tools)
        found = recent.find(key, None if raw is None else lambda: member_bytes(raw, "tools", tools))
        if found is None:
            found = recent.keep(key, translate())
    if tools_json(tools) is not None:
        same.keep(tools, found)
    return found


def clear() -> None:
    """Forget every kept list and conversation (tests)."""
    _kept.clear()
    RESENT.clear()
