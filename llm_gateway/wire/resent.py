"""A resent conversation's leading entries not parsed again: the top-level `messages` (or Responses' `input`) array
of the last few long requests kept with the bytes it was parsed from, and a request that begins with the same bytes
up to the end of one's entries parsed with a marker in their place.

A coding agent resends its whole conversation on every turn, one or two new entries at its end: parsing (and
later freeing) the 46 messages of bench/agent_request.py's history is most of what reading its 74 KB request
costs (issue 36 item 2: ~50 µs of ~55, the tools not parsed again already), and a Messages or Responses request
parses its system prompt or instructions (11 KB) before them. `Resent.find` looks for a kept request whose bytes,
up to where its entries end, are the start of this one's (one memcmp each); the caller then parses the request
with the array's name and the marker `SENT` in place of everything from its first member to the end of those
entries, and `END` put before the array's closing bracket; `Resent.take` checks where the markers landed and puts
back the members before the array and the kept entries (the same objects each time), in a whole parse's order;
the request, its end now known, is kept in its turn.

Why it is exact: the bytes before the array's name, less their last comma, parse as an object by themselves, and
the kept entries' bytes as an array by themselves, to exactly the kept entries (`_verified`, once per request kept
whole): so the name is the top-level member's (a name inside a value would leave a bracket open before it), and a
request that begins with those bytes is those members, then that array, the kept entries first. `SENT` (a string
no client can write: it holds a random token, and bytes parsed that hold the token are parsed whole) parsed as the
first element of that array, so no later member of the same name replaced it (orjson keeps a key's last value).
`END` parsed as the last element of the same array, so the array closes where it was put: the next request's kept
entries are all of this one's. A marker anywhere else, or bytes that no longer parse with the markers in, mean the
request is parsed whole, as if nothing were kept.

What is kept is shared by every request that finds it: nothing may change the parsed entries (the gateway
replaces a body's fields, never edits the client's nested values; the dialects' translations build their own).
Only long arrays (`MIN_BYTES`) and bounded ones (`MAX_BYTES`) are kept, `KEPT` of them.
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

#: requests kept (a few agents at once)
KEPT = 4
#: entries shorter than this (their bytes) are parsed every time
MIN_BYTES = 8 * 1024
#: nor longer than this, nor kept from a request of more than twice this: what is kept (the request's bytes and
#: the parsed entries) outlives its request, `KEPT` of them
MAX_BYTES = 2 << 20
#: the top-level arrays a conversation is resent in: chat completions' and Messages' `messages`, Responses' `input`
NAMES = ("messages", "input")

_TOKEN = secrets.token_hex(16)
#: what stands for the kept entries, and what marks the array's end, in the bytes parsed
SENT = f"\x00resent-{_TOKEN}"
END = f"\x00end-{_TOKEN}"
SENT_JSON = orjson.dumps(SENT)
END_JSON = b"," + orjson.dumps(END)
_TOKEN_BYTES = _TOKEN.encode()
_BLANKS = b" \t\r\n"


class Kept:
    """One request's bytes and where its top-level `name` array's entries lie in them (`first`: where its first
    member begins; `start`: after the array's opening bracket; `end`: after the last entry's last byte), their
    parsed values, the members before the array (`head`, parsed from their bytes alone: a system prompt or
    instructions, not parsed again either; None until checked), and `tail`: the bytes from the closing
    bracket to the next member's name (`],"model"`), or to the end, as a later request of the same client has
    them (where its array closes is looked for by them: the first after the kept entries; one inside the new
    entries puts `END` where the parse shows it is not the array's end, and the request is parsed whole)."""

    __slots__ = ("end", "first", "head", "key_at", "name", "raw", "start", "tail", "values")

    def __init__(self, raw: bytes, name: str, at: tuple[int, int, int, int], values: list[Any], tail: bytes) -> None:
        self.raw, self.name, self.values, self.tail = raw, name, values, tail
        self.first, self.key_at, self.start, self.end = at  # the first member, the array's name, its entries
        self.head: dict[str, Any] | None = None


class Found:
    """A kept request whose entries' bytes a request begins with, and where the request's array closes (its
    bracket; -1: not found: `SENT` then stands for the kept entries alone, and the request is not kept)."""

    __slots__ = ("end", "kept")

    def __init__(self, kept: Kept, end: int) -> None:
        self.kept, self.end = kept, end


class Resent:
    """The last `KEPT` long arrays, newest last."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: list[Kept] = []

    def find(self, raw: bytes) -> Found | None:
        """The kept request whose bytes up to its entries' end `raw` begins with (then a comma or the bracket),
        with where `raw`'s array closes; None where there is none."""
        for i in range(len(self.kept) - 1, -1, -1):
            kept = self.kept[i]
            end = kept.end
            if _after(raw, end, b",") < 0 and _after(raw, end, b"]") < 0:
                continue  # (a cheap test first: the next entry, or the array's end, follows the kept entries)
            if raw.startswith(memoryview(kept.raw)[:end]):
                if i != len(self.kept) - 1:
                    self.kept.append(self.kept.pop(i))
                # the first tail after the kept entries: past the new ones (a turn's few), not through the tools
                return Found(kept, raw.find(kept.tail, end))
        return None

    def take(self, raw: bytes, found: Found, marked: bytes, body: Any) -> dict[str, Any] | None:
        """The body of `raw`, parsed as `body` from `marked` (`raw` with `cuts(found)` made), with the kept members
        and entries put back (and `raw` kept in its turn where its end was marked); None where a marker is not where
        it was put, or the bytes parsed hold the markers' token other than in them (parse `raw` whole then)."""
        kept = found.kept
        if marked.count(_TOKEN_BYTES) != (2 if found.end >= 0 else 1):
            return None  # (the parsed bytes only: the kept entries' were parsed before)
        arr = body.get(kept.name) if type(body) is dict else None
        if type(arr) is not list or not arr or arr[0] != SENT or type(arr[0]) is not str:
            return None
        ended = found.end >= 0
        if ended and (len(arr) < 2 or arr[-1] != END or type(arr[-1]) is not str):
            return None
        head = self._verified(kept)
        if head is None:
            return None
        values = kept.values + (arr[1:-1] if ended else arr[1:])
        out: dict[str, Any] = {**head, **body} if head else body  # the order a whole parse gives: head, array, rest
        out[kept.name] = values
        if ended:  # END proved where the array closes: the next request's kept entries are all of these
            at = (kept.first, kept.key_at, kept.start, _before_blanks(raw, found.end))
            again = Kept(raw, kept.name, at, values, kept.tail)
            again.head = head  # the same bytes before the array
            self._keep(again, replaces=kept)
        return out

    def offer(self, raw: bytes, body: Any) -> None:
        """Keep `body`'s long top-level array (parsed whole from `raw`) for a later request that begins the same:
        where its bytes are (found by its name and the next member's; checked when a request first finds it)."""
        if type(body) is not dict:
            return
        for name in NAMES:
            arr = body.get(name)
            if type(arr) is list and arr:
                break
        else:
            return
        key_at = raw.find(b'"%b"' % name.encode())  # the first: where it is top-level is checked when first found
        first = _after(raw, 0, b"{")
        if key_at < 0 or first < 0:
            return
        while first < key_at and raw[first] in _BLANKS:
            first += 1
        start = _after(raw, key_at + len(name) + 2, b":")
        start = _after(raw, start, b"[") if start > 0 else -1
        closing = _closing(raw, body, name)
        if start <= 0 or closing is None:
            return
        end, tail = _before_blanks(raw, closing[0]), closing[1]
        if not MIN_BYTES <= end - start <= MAX_BYTES or len(raw) > 2 * MAX_BYTES:
            return
        self._keep(Kept(raw, name, (first, key_at, start, end), arr, tail), replaces=None)

    def _verified(self, kept: Kept) -> dict[str, Any] | None:
        """The members before the kept array, where its entries' bytes parse, as an array by themselves, to the kept
        entries, and the bytes before its name, less their last comma, as an object by themselves (once each: a
        request kept whole was parsed whole, and its array was found by its name, not proven there); else None.
        Those two parses prove the name top-level (a name inside a value of the object would leave a bracket open
        before it), so a request that begins with the same bytes is those members, the array's name and those
        entries, then the rest of the array. (The name written before, escaped: that member is the first of the
        two, whose value the second replaces where `take` merges them, as a whole parse does.)"""
        if kept.head is not None:
            return kept.head
        view = memoryview(kept.raw)
        before = bytes(view[kept.first : kept.key_at]).rstrip(_BLANKS)
        head: Any = None
        try:  # compared as JSON: `==` would take 1 for true, or 1.0
            alone = orjson.loads(b"".join((b"[", view[kept.start : kept.end], b"]")))
            if orjson.dumps(alone) == orjson.dumps(kept.values) and (not before or before[-1:] == b","):
                head = orjson.loads(b"{" + before[:-1] + b"}") if before else {}
        except (orjson.JSONDecodeError, orjson.JSONEncodeError):
            pass
        if type(head) is not dict:
            if kept in self.kept:
                self.kept.remove(kept)
            return None
        kept.head = head
        return head

    def _keep(self, kept: Kept, replaces: Kept | None) -> None:
        if replaces is not None and replaces in self.kept:
            self.kept.remove(replaces)  # the same conversation's last turn: this one holds all of it
        self.kept.append(kept)
        if len(self.kept) > KEPT:
            del self.kept[0]

    def clear(self) -> None:
        """Forget every kept request (tests)."""
        self.kept.clear()


def cuts(found: Found) -> list[tuple[int, int, bytes]]:
    """Where `found`'s request is parsed with other bytes: the array's name and `SENT` in place of the members
    before it and the kept entries, `END` before the array's closing bracket (start, end, the bytes instead)."""
    kept, end = found.kept, found.end
    out = [(kept.first, kept.end, b'"%b":[%b' % (kept.name.encode(), SENT_JSON))]  # the members before it too
    if end >= 0:
        out.append((end, end, END_JSON))
    return out


def _after(raw: bytes, at: int, char: bytes) -> int:
    """Where `raw` goes on after `char`, which is next after JSON's blanks from `at`; -1 where it is not."""
    n = len(raw)
    while at < n and raw[at] in _BLANKS:
        at += 1
    return at + 1 if raw[at : at + 1] == char else -1


def _before_blanks(raw: bytes, at: int) -> int:
    """Where the JSON blanks before `at` begin."""
    while at > 0 and raw[at - 1] in _BLANKS:
        at -= 1
    return at


def _closing(raw: bytes, body: dict[str, Any], name: str) -> tuple[int, bytes] | None:
    """Where the top-level `name` array of `body` likely closes in `raw` (its bracket), and the tail from there
    (see `Kept`): before the next member's name (its last occurrence), or before the object's closing brace."""
    keys = list(body)
    i = keys.index(name)
    if i + 1 < len(keys):
        key = b'"%b"' % keys[i + 1].encode()
        at = raw.rfind(key)
        if at < 0:
            return None
        j = at - 1
        while j > 0 and raw[j] in _BLANKS:
            j -= 1
        if raw[j : j + 1] != b",":
            return None
        j -= 1
        while j > 0 and raw[j] in _BLANKS:
            j -= 1
        return (j, raw[j : at + len(key)]) if raw[j : j + 1] == b"]" else None
    j = _before_blanks(raw, len(raw)) - 2  # before the object's closing brace, its last byte but blanks
    while j > 0 and raw[j] in _BLANKS:
        j -= 1
    return (j, raw[j:]) if raw[j : j + 1] == b"]" else None
