"""A client's JSON body as parsed, beside the bytes it came as, and its re-encoding from those bytes.

An OpenAI-compatible engine gets the client's body with a few top-level fields set by the gateway (the upstream
model name, both names of the token limit, `stream_options`, a priority): when every field the client sent is
still there with its value, and the gateway only added fields, the upstream body is the client's bytes with the
added fields spliced in before the closing brace, not a re-encoding of the whole (issue 36: re-encoding a coding
agent's 74 KB request cost ~25 µs, 5 % of its CPU). A changed or removed field falls back to encoding the dict.
The splice is not even a copy: it is a `Spliced` body, the client's bytes up to their closing brace (a view of
them) and the added fields' bytes, which the gateway's engine client writes to the socket one after the other (one
writev) and the other clients join (`bytes(body)`); a copy of an agent's 74 KB was ~75k instructions a request.

The bytes were parsed by orjson into the same dict, so the engine reads what the gateway read, with one caveat a
re-encoding did not have: a top-level key the client sent twice reaches the engine twice. orjson keeps the last
one; so do the Python engines (json/pydantic), Go's encoding/json and nlohmann's json (llama.cpp), and serde's
derived structs (TGI) refuse the request, so no engine reads a value the gateway did not check.

A translated body (/v1/messages, /v1/responses) has no client bytes, but its `tools` were encoded once already,
for the size estimate (`Gathered.tools_json`): they come as an `EncodedList`, the list beside its JSON, and the
upstream body splices those bytes in (an `orjson.Fragment`) instead of encoding 20 tool schemas again (issue 36
item 2). The bytes are the same as a plain encoding's: nothing changes a tools list once it is built. Its chat
messages come as `EncodedMessages` where an agent's history was kept (dialects/history.py): the list beside the
pieces of its JSON (a kept history's JSON, encoded when it was kept), and the upstream body is a `Spliced` of
the small rest's encoding and those pieces, neither the history nor the tools encoded nor copied again.
"""

from __future__ import annotations

from typing import Any

import orjson

#: the blanks JSON allows after a value (the only bytes after a parsed object's closing brace)
_BLANKS = b" \t\r\n"
#: the types whose equal values are the same JSON (so the upstream name of a model can equal the client's)
_SCALARS = (str, int, float, bool)


class EncodedList(list[Any]):
    """A list and `json`, its compact JSON as `orjson.dumps` writes it (made once, by whoever built the list)."""

    __slots__ = ("json",)

    def __init__(self, items: list[Any], json: bytes) -> None:
        super().__init__(items)
        self.json = json


def encoded_list(items: list[Any]) -> EncodedList:
    """`items` with their JSON beside them."""
    return EncodedList(items, orjson.dumps(items))


class EncodedMessages(list[Any]):
    """Chat messages and `parts`: bytes whose concatenation is their JSON as `orjson.dumps` writes it, made by
    whoever built the list (a kept history's JSON among them); `length`, how many messages that JSON holds: a list
    whose length changed after is encoded as a plain list."""

    __slots__ = ("length", "parts")

    def __init__(self, items: list[Any], parts: tuple[bytes | memoryview, ...]) -> None:
        super().__init__(items)
        self.parts = parts
        self.length = len(items)


#: what stands for `messages` and `tools` in the small encoding of a body whose messages are `EncodedMessages`: a
#: raw NUL, which orjson never writes itself (it escapes control characters in strings and keys)
_MARK = orjson.Fragment(b"\x00")


def _dumps(out: dict[str, Any]) -> Body:
    """`out` as JSON, with the JSON an `EncodedList` of `tools` carries spliced in rather than encoded again, and
    with `EncodedMessages` a `Spliced` body: the rest encoded with a mark over each of the two, split at the marks,
    their JSON in between (as it is: not copied)."""
    tools = out.get("tools")
    messages = out.get("messages")
    if type(messages) is EncodedMessages and len(messages) == messages.length:
        marked: list[tuple[bytes | memoryview, ...]] = []
        for k, v in out.items():  # in the body's order: the marks' order
            if k == "messages":
                marked.append(messages.parts)
            elif k == "tools" and type(v) is EncodedList:
                marked.append((v.json,))
        small = orjson.dumps({**out, "messages": _MARK, **({"tools": _MARK} if len(marked) == 2 else {})})
        parts: list[bytes | memoryview] = []
        at = 0
        for pieces in marked:
            mark = small.find(b"\x00", at)  # memchr
            parts.append(small[at:mark])
            parts += pieces
            at = mark + 1
        parts.append(small[at:])
        return Spliced(tuple(parts))
    if type(tools) is EncodedList:
        return orjson.dumps({**out, "tools": orjson.Fragment(tools.json)})
    return orjson.dumps(out)


class Spliced:
    """A request body in pieces, written one after the other: `parts` (a view of the client's bytes and the added
    fields' JSON), `size` bytes in all; `bytes(body)` joins them. `Body`: what an engine request's body may be."""

    __slots__ = ("parts", "size")

    def __init__(self, parts: tuple[bytes | memoryview, ...]) -> None:
        self.parts = parts
        self.size = sum(map(len, parts))

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __repr__(self) -> str:
        return f"Spliced({bytes(self)!r})"


#: an engine request's body: its bytes, or pieces of them (`Spliced`: the client's bytes and added fields)
Body = bytes | Spliced


def joined(body: Body) -> bytes:
    """`body`'s bytes, in one piece."""
    return body if isinstance(body, bytes) else bytes(body)


class ClientBody(dict[str, Any]):
    """The parsed body (a dict the gateway may change as before) and `raw`, the bytes it was parsed from."""

    __slots__ = ("_sent", "raw")

    def __init__(self, parsed: dict[str, Any], raw: bytes) -> None:
        super().__init__(parsed)
        self.raw = raw
        self._sent = parsed  # the client's own top-level values: a copy nothing changes


def encode(out: dict[str, Any], source: dict[str, Any]) -> Body:
    """`out` as JSON: from `source`'s bytes when `source` is a `ClientBody` and `out` is its client's body with
    fields added (at the top level, after the client's own: the order `orjson.dumps(out)` has: `Spliced`, the
    client's bytes not copied); else encoded."""
    if not isinstance(source, ClientBody):
        return _dumps(out)
    sent = source._sent
    added: dict[str, Any] = {}
    kept = 0
    for k, v in out.items():
        if k not in sent:
            added[k] = v
            continue
        was = sent[k]
        if added or (v is not was and not (type(v) is type(was) and isinstance(v, _SCALARS) and v == was)):
            return orjson.dumps(out)  # a value changed, or a client's field came after an added one
        kept += 1
    if kept != len(sent):
        return orjson.dumps(out)  # a field removed
    if not added:
        return source.raw
    raw = source.raw
    end = len(raw) - 1  # a JSON object: its last byte is the closing brace, after it only JSON's blanks
    while raw[end] in _BLANKS:
        end -= 1
    more = orjson.dumps(added)
    # no copy of the client's bytes (a slice and a concatenation were two: ~150k instructions of a 74 KB request)
    return Spliced((memoryview(raw)[:end], b"," + more[1:] if sent else more[1:]))
