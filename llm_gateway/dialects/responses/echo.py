"""The Response object's echo of a request's `tools` and `instructions`, as JSON kept across turns and written
as pieces beside the Response's own JSON, never copied into it.

A Response echoes the request's tools and instructions (`ResponsesRequest.echo`): a coding agent's 20 tool
schemas and its long system prompt, the same on every turn of its session, written into the whole Response
once and into a stream three times (`response.created`, `.in_progress`, `.completed`). Encoding them each
time was a third of what /v1/responses costs over chat completions (issue 36 item 2). Here their JSON is
kept for the last `KEPT` distinct values of each (per process, wire/recent.py), found by the bytes the
request's chat tools were already encoded as (`Gathered.tools_json`: the echo is a function of them) and by the
instructions' text.

Copying that JSON (~27 KB for an agent) into each encoded Response was the next cost: into orjson's buffer (as
an `orjson.Fragment`), again each time the buffer grew, and again at each join on the way to the socket. So an
`Echo` encodes the Response with a one-byte mark (`MARK`, a NUL: orjson escapes control characters in strings
and keys, so a raw one is only ever a mark) over each echoed value, splits the small result at the marks and
puts the kept JSON between the parts (`pieces`): a list of bytes whose concatenation is exactly what a plain
encoding writes, for the writer to join once (or hand to the socket as they are). The Response object itself
keeps its plain values (stored, listed, answered again as they are).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.responses.request import ResponsesRequest
from llm_gateway.wire.recent import Recent

#: distinct tools (and instructions) whose JSON is kept
KEPT = 8
_TOOLS: Recent[bytes] = Recent(KEPT)
_INSTRUCTIONS: Recent[bytes] = Recent(KEPT)
#: what stands for an echoed value in the small encoding: a raw NUL, which orjson never writes itself
MARK = orjson.Fragment(b"\x00")


def kept_json(kept: Recent[bytes], key: str | bytes, value: Any) -> bytes:
    """`value`'s JSON, kept in `kept` under `key` (which decides `value`): found, or encoded and kept."""
    found = kept.find(key)
    if found is None:
        found = kept.keep(key, orjson.dumps(value))
    return found


def echo_json(req: ResponsesRequest) -> dict[str, bytes]:
    """The echoed `tools` and `instructions` of `req` as encoded JSON, where they are long enough to keep."""
    out: dict[str, bytes] = {}
    tools = req.echo.get("tools")
    key = req.gathered.tools_json if req.gathered is not None else b""
    if tools and key:
        out["tools"] = kept_json(_TOOLS, key, tools)
    text = req.echo.get("instructions")
    if isinstance(text, str) and text:
        out["instructions"] = kept_json(_INSTRUCTIONS, text, text)
    return out


class Echo:
    """How one Response is written with its echoed values' kept JSON (`echo_json`): `marks`, to put over the
    Response's own values when it is encoded, and `pieces()`, which puts the JSON in their place."""

    __slots__ = ("_json", "marks")

    def __init__(self, response: dict[str, Any], encoded: dict[str, bytes]) -> None:
        keys = sorted(encoded, key=list(response).index)  # the order the Response has them in: the marks' order
        self.marks = dict.fromkeys(keys, MARK)
        self._json = [encoded[k] for k in keys]

    def pieces(self, small: bytes, out: list[bytes]) -> None:
        """Append to `out` the JSON `small` (an encoding of an object whose Response had `marks` put over its
        echoed values) with the kept JSON in place of each mark."""
        at = 0
        for json in self._json:  # `find` (memchr), not `split`: bytes' split by one byte goes byte by byte
            mark = small.find(b"\x00", at)
            if mark < 0:
                raise AssertionError("a Response's echo marks: one for each echoed value")
            out += (small[at:mark], json)
            at = mark + 1
        out.append(small[at:])

    def dumps(self, resp: dict[str, Any]) -> bytes:
        """A Response object as JSON, its echoed values their kept JSON: the bytes `orjson.dumps(resp)` gives."""
        if not self._json:
            return orjson.dumps(resp)
        out: list[bytes] = []
        self.pieces(orjson.dumps({**resp, **self.marks}), out)
        return b"".join(out)
