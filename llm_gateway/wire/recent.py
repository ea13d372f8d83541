"""What a translation made for the last few distinct inputs, found again by the input's bytes.

A coding agent resends the same 20-odd tool schemas and system prompt on every turn; translating or encoding
them again each time was a large part of what /v1/messages and /v1/responses cost over chat completions
(issue 36 item 2). `Recent` keeps what was made for the last few distinct keys (the input's JSON bytes, or its
text): equal bytes are equal values, types included (1 and 1.0 differ), so a hit is exactly what making it again
would give. Keys are compared by length first, then contents (one memcmp), not hashed: a key is tens of KB and a
new object on every request, whose hash would be computed each time. The few entries are scanned newest first.
What is kept must never be changed by its users.

Encoding the input to find its key was itself a cost (~130k instructions for an agent's tools, as much as the
rest of a hit): `find_member` looks for a kept key in the request's own bytes instead, as the client wrote the
value when it was first found again by its key (`member_bytes` finds those bytes then, once; else the key itself,
as orjson writes it). A hit there is exact: see `find_member` for why those bytes can only be the top-level
member's value; anything it cannot prove is a miss, and the caller encodes the key as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

import orjson

T = TypeVar("T")


class Recent(Generic[T]):
    """The values kept for the last `size` distinct keys, the newest last; a key found moves to the end."""

    __slots__ = ("_entries", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        #: (key, value, the bytes `find_member` looks for: the key as a client wrote it where `member_bytes` found
        #: that, else the key; None until a request found the value by its key: not looked for yet)
        self._entries: list[tuple[str | bytes, T, str | bytes | None]] = []

    def find(self, key: str | bytes, written: Callable[[], bytes | None] | None = None) -> T | None:
        """The value kept under a key equal to `key`, or None. `written`: how to find the bytes a client wrote the
        key as (`member_bytes` of its request), called once for a value found so, on its first find, not when it
        is kept: a client whose bytes are not the key would never find it in them otherwise, and a value found
        once is likely found again (one seen once need not pay for the search)."""
        entries = self._entries
        n = len(key)
        for i in range(len(entries) - 1, -1, -1):
            k, value, w = entries[i]
            if len(k) == n and k == key:
                if w is None and written is not None:
                    entries[i] = (k, value, written() or k)
                if i != len(entries) - 1:
                    entries.append(entries.pop(i))
                return value
        return None

    def find_member(self, raw: bytes, name: str) -> T | None:
        """The value kept under the JSON of the top-level member `name` of the JSON object `raw`; see
        `find_member_at`."""
        found = self.find_member_at(raw, name)
        return None if found is None else found[0]

    def find_member_at(self, raw: bytes, name: str) -> tuple[T, int, int] | None:
        """The value kept under the JSON of the top-level member `name` of the JSON object `raw` (the bytes the
        request was parsed from, or is to be: valid JSON), found in `raw` without the member's value being parsed or
        encoded, with where that value's bytes start and end in `raw`; None where it is not found so (no kept key
        written there as it is, or a place this cannot prove top-level).

        Why a hit is exact: a `"name":` in `raw` not after a backslash opens a string (a quote that
        closed one would leave `name` bare, which is not JSON), so it is a key and a value follows it. A kept key
        is a whole JSON value, so where `raw` holds its bytes there, that value is exactly it, and it parses to
        what the key was encoded from (orjson's encoding round-trips: types, key order, floats). The object
        holding the member is the outermost when the rest of `raw` after the value, after a `{` in place of its
        comma, is a JSON object by itself: a nested one would leave its parents' closing brackets after it. A
        duplicate of the member after it would be the one parsed (orjson keeps a key's last value): none may be
        there. The rest is parsed, so only a short one is tried (`MAX_REST`: what follows the tools in an agent's
        request is a few fields), and the member is looked for only where such a rest would put it. (For bytes not
        yet known to be JSON, the parse of the whole that follows a hit tells: a hit in bytes that are not JSON is
        never used, since they fail to parse.)"""
        head = b'"%b":' % name.encode()
        n = len(raw)
        entries = self._entries
        for i in range(len(entries) - 1, -1, -1):
            key, value, k = entries[i]
            if k is None:
                k = key
            if type(k) is not bytes:
                continue
            end = n - len(k)  # where the value would start if nothing followed it: the member is looked for just
            at = raw.rfind(head, max(0, end - len(head) - MAX_REST), end)  # before that, not in all of `raw`
            if at <= 0 or raw[at - 1] == 92:  # 92: a backslash
                continue
            at += len(head)
            if raw.startswith(k, at):
                if not _closes_outermost(raw[at + len(k) :], name):
                    return None
                if i != len(entries) - 1:
                    entries.append(entries.pop(i))
                return value, at, at + len(k)
        return None

    def keep(self, key: str | bytes, value: T) -> T:
        """Keep `value` under `key` (the oldest goes beyond `size`); gives `value` back."""
        entries = self._entries
        entries.append((key, value, None))
        if len(entries) > self.size:
            del entries[0]
        return value

    def values(self) -> list[T]:
        """The values kept, the newest first."""
        return [value for _, value, _ in reversed(self._entries)]

    def clear(self) -> None:
        self._entries.clear()


#: the most bytes after a member's value that `find_member` parses to prove the member top-level
MAX_REST = 2048


def member_bytes(raw: bytes, name: str, value: Any) -> bytes | None:
    """The bytes of the top-level member `name` of the JSON object `raw` (valid JSON, parsed: `value` is that
    member's value) as the client wrote them, from just after its colon, where `find_member` would prove them
    that member's; None where not. Once per value kept, so it may parse: the value ends at one of the closing
    brackets in the last `MAX_REST` bytes, the one after which the rest closes the outermost object and before
    which the bytes are one JSON value (which, being that member's, is `value`: checked too)."""
    head = b'"%b":' % name.encode()
    at = raw.rfind(head)
    if at <= 0 or raw[at - 1] == 92:  # 92: a backslash
        return None
    at += len(head)
    end = len(raw)
    low = max(at, end - MAX_REST - 1)
    while (end := max(raw.rfind(b"]", low, end), raw.rfind(b"}", low, end))) >= 0:
        if _closes_outermost(raw[end + 1 :], name):
            written = raw[at : end + 1]
            try:
                if orjson.loads(written) == value:
                    return written
            except orjson.JSONDecodeError:
                pass
    return None


def _closes_outermost(rest: bytes, name: str) -> bool:
    """Whether `rest`, what follows a member's value in a parsed JSON object's bytes, is the rest of the outermost
    object with no other member `name`."""
    rest = rest.lstrip(b" \t\r\n")
    if rest[:1] == b"}":
        return not rest[1:].strip(b" \t\r\n")  # JSON's blanks only
    if rest[:1] != b",":
        return False
    try:
        more = orjson.loads(b"{" + rest[1:])
    except orjson.JSONDecodeError:
        return False
    return type(more) is dict and name not in more


class Same(Generic[T]):
    """What was made for the last `size` objects, found by identity: for objects nothing changes once made, such as
    the tools lists body_json keeps (the same object in every request that resends them), so that a translation of
    them is found without looking for their bytes again."""

    __slots__ = ("_pairs", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._pairs: list[tuple[Any, T]] = []  # the objects are held: an identity is never another's

    def find(self, obj: Any) -> T | None:
        for held, value in reversed(self._pairs):
            if held is obj:
                found: T = value
                return found
        return None

    def keep(self, obj: Any, value: T) -> None:
        self._pairs.append((obj, value))
        if len(self._pairs) > self.size:
            del self._pairs[0]

    def clear(self) -> None:
        self._pairs.clear()
