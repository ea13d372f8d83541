"""An agent's history translated once: the chat messages of the last few long lists of messages (Anthropic) or
input items (Responses) kept, and a request whose leading entries equal one's reuses their translation and
translates only the rest.

A coding agent resends its whole conversation on every turn, one or two new entries at its end: translating the
46 messages of bench/agent_request.py's history into chat messages cost ~0.45M instructions a request (callgrind),
the largest part of `/v1/messages`' and `/v1/responses`' cost over chat completions' (issue 36 item 2). Comparing
a parsed entry with a kept one (`==`, in C) costs a small part of translating it. What a reused entry's
translation added to the request's sizes (its characters, and what `Gathered` holds of it) is kept beside it,
entry by entry, so that a prefix of any length replays exactly what translating it gave. A translation whose
entries carry state to the next (Responses: function calls join the assistant message before them) marks the
places where none is carried (`clean`); a prefix is reused only up to such a place.

Equal means Python's equality of parsed JSON: an entry is reused where it compares equal to a kept one, which
holds for the same bytes and for key orders and number spellings that parse equal (`1` and `1.0`, `true` and `1`
in a tool's input: the kept translation's spelling is sent then). A history's entries pass the checks before
they are kept, so a reused prefix is one that passed them. What is kept is shared by every request that reuses
it: nothing may change the chat messages a translation builds, nor the client's parsed entries (the gateway
replaces a body's fields and adapters build their own). Only lists of `MIN_ENTRIES` or more are kept: a short one
costs little to translate; and only those of at most `MAX_CHARS` characters and no images or other parts: each
kept one stays in memory, so each is bounded.

A kept history keeps its chat messages' JSON too (`Kept.json`, with where each message ends in it): made when it
is kept, from the reused prefix's JSON and the new messages' encodings, so that the engine's body is written from
it (`encoded_messages`: wire/client_body.py's `EncodedMessages`) rather than encoding the whole history again on every
turn (~130k instructions of an agent's request). It holds the translation's messages exactly (the same objects,
which nothing changes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from llm_gateway.routing.gathered import Gathered
from llm_gateway.wire.client_body import EncodedMessages
from llm_gateway.wire.recent import Recent

#: histories kept by each dialect (the newest replaces the oldest): a few agents at once
KEPT = 4
#: shorter lists are translated every time
MIN_ENTRIES = 8
#: a history with more characters of text than this, or with images or other parts (base64 data: megabytes), is not
#: kept: what is kept stays in memory after its request, so each is bounded (KEPT of them in each dialect)
MAX_CHARS = 1 << 21

#: after an entry, relative to before the first: the chat messages, texts, strings and as_json gathered, images,
#: other parts and characters counted, whether every entry so far left the request fresh, and whether the
#: translation carries no state past it (a prefix may end there)
End = tuple[int, int, int, int, int, int, int, bool, bool]


class Kept(NamedTuple):
    given: list[Any]  # the client's entries, parsed
    ends: list[End]  # after each of them
    out: list[dict[str, Any]]  # the chat messages they became
    texts: list[str]
    strings: list[str]
    as_json: list[Any]
    json: bytes  # `out` as JSON, the messages joined by commas (no brackets)
    json_ends: list[int]  # where each message of `out` ends in `json`


class Marks:
    """What a translation of `given` adds to `out` and the sizes, entry by entry, from where it began."""

    __slots__ = ("base", "ends", "given", "histories", "made", "out", "replaces", "src", "src_out")

    def __init__(self, histories: Histories, given: list[Any], out: list[dict[str, Any]], g: Gathered) -> None:
        self.histories, self.given, self.out = histories, given, out
        self.base = (len(out), len(g.texts), len(g.strings), len(g.as_json), g.images, g.other_parts)
        self.ends: list[End] = []
        self.replaces: Kept | None = None  # a kept history this one begins with whole: kept no more once this is
        self.src: Kept | None = None  # the kept history whose translation this one's begins with
        self.src_out = 0  # how many of its chat messages
        self.made: Kept | None = None  # this one's, once kept

    def mark(self, g: Gathered, chars: int, fresh: bool, clean: bool = True) -> None:
        """After an entry: what it and those before it added (`chars`: the characters counted since the first;
        `fresh`: no assistant or tool message yet)."""
        b = self.base
        end = (
            len(self.out) - b[0],
            len(g.texts) - b[1],
            len(g.strings) - b[2],
            len(g.as_json) - b[3],
            g.images - b[4],
            g.other_parts - b[5],
            chars,
            fresh,
            clean,
        )
        self.ends.append(end)

    def keep(self, g: Gathered) -> None:
        """After the last entry: keep the translation (the oldest kept goes beyond `KEPT`), unless it is large."""
        b = self.base
        last = self.ends[-1]
        if last[6] > MAX_CHARS or last[4] or last[5]:
            return
        out = self.out[b[0] :]
        json, json_ends = self._json(out)
        kept = Kept(self.given, self.ends, out, g.texts[b[1] :], g.strings[b[2] :], g.as_json[b[3] :], json, json_ends)
        self.made = kept
        histories = self.histories
        if self.replaces is not None:
            histories.forget(self.replaces)  # the last turn of the same conversation: this one holds all of it
        histories.kept.append(kept)
        if len(histories.kept) > KEPT:
            del histories.kept[0]

    def _json(self, out: list[dict[str, Any]]) -> tuple[bytes, list[int]]:
        """`out`'s JSON (its messages joined by commas) and where each ends: the reused prefix's from the kept one,
        the rest encoded."""
        src, n = self.src, self.src_out
        fresh = [orjson.dumps(m) for m in out[n:]]
        head: list[bytes | memoryview] = []
        ends: list[int] = []
        at = -1
        if src is not None and n:
            ends = src.json_ends[:n]
            at = ends[-1]
            head.append(memoryview(src.json)[:at])  # joined below: the one copy of the prefix
        for p in fresh:
            at += 1 + len(p)
            ends.append(at)
        return b",".join([*head, *fresh]), ends

    def json(self) -> bytes | memoryview | None:
        """The JSON of the messages the translation added (joined by commas), where it is known: kept, or all reused."""
        if self.made is not None:
            return self.made.json
        src = self.src
        if src is not None and self.src_out and len(self.out) - self.base[0] == self.src_out:
            return memoryview(src.json)[: src.json_ends[self.src_out - 1]]
        return None


class Histories:
    """One dialect's kept translations."""

    __slots__ = ("kept",)

    def __init__(self) -> None:
        self.kept: list[Kept] = []

    def reuse(self, given: list[Any], out: list[dict[str, Any]], g: Gathered) -> tuple[int, int, Marks | None]:
        """How many leading entries of `given` a kept translation gave (their chat messages put in `out`, what they
        gathered in `g`; `g.fresh` is the caller's to start true), the characters they counted, and the marks to
        go on with for a list worth keeping (None: too short)."""
        if len(given) < MIN_ENTRIES:
            return 0, 0, None
        marks = Marks(self, given, out, g)
        best: Kept | None = None
        n = 0
        for kept in reversed(self.kept):
            src = kept.given
            most = min(len(src), len(given))
            if given[:most] == src[:most]:  # in C, the same objects at once (wire/resent.py puts them back)
                k = most
            else:
                k = 0
                while k < most and (given[k] is src[k] or given[k] == src[k]):
                    k += 1
            if k > n:
                best, n = kept, k
                if k == len(given):
                    break
        ends = best.ends if best is not None else []
        while n and not ends[n - 1][8]:
            n -= 1  # back to where the translation carried nothing on
        if best is None or not n:
            return 0, 0, marks
        if n == len(best.given):
            marks.replaces = best
        if best is not self.kept[-1]:
            self.forget(best)
            self.kept.append(best)  # the most recently used is the last to go
        e = ends[n - 1]
        marks.src, marks.src_out = best, e[0]
        out.extend(best.out[: e[0]])
        g.texts.extend(best.texts[: e[1]])
        g.strings.extend(best.strings[: e[2]])
        g.as_json.extend(best.as_json[: e[3]])
        g.images += e[4]
        g.other_parts += e[5]
        g.fresh = e[7]
        marks.ends.extend(ends[:n])
        return n, e[6], marks

    def forget(self, kept: Kept) -> None:
        """Drop `kept` (found by identity: `==` would compare whole histories)."""
        for i, k in enumerate(self.kept):
            if k is kept:
                del self.kept[i]
                return

    def clear(self) -> None:
        """Forget every kept history (tests)."""
        self.kept.clear()


#: the JSON of the messages before a history (a system prompt, the same on every turn of an agent's), by their text
_LEADS: Recent[bytes] = Recent(KEPT)


def encoded_messages(out: list[dict[str, Any]], marks: Marks | None) -> list[dict[str, Any]]:
    """`out`, a request's chat messages whose last are `marks`' history, as `EncodedMessages` where that history's
    JSON is known (`Marks.json`); else `out` as it is."""
    json = marks.json() if marks is not None else None
    if marks is None or not json:
        return out
    return _encoded(out, marks.base[0], (json,))


def with_lead(out: list[dict[str, Any]], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`out`, messages that end with `history`'s (`encoded_messages`' result, unchanged), as `EncodedMessages` where
    `history` is one; else `out` as it is."""
    lead = len(out) - len(history)
    if type(history) is not EncodedMessages or len(history) != history.length or out[lead:] != history:
        return out
    return _encoded(out, lead, history.parts[1:-1])


def _encoded(out: list[dict[str, Any]], lead: int, json: tuple[bytes | memoryview, ...]) -> EncodedMessages:
    """`out` with the parts of its JSON: its first `lead` messages' (a system prompt's kept), then `json`."""
    parts: list[bytes | memoryview] = [b"["]
    for m in out[:lead]:
        content = m.get("content")
        if len(m) == 2 and type(content) is str and next(iter(m)) == "role" and m["role"] == "system":
            found = _LEADS.find(content) or _LEADS.keep(content, orjson.dumps(m))
        else:
            found = orjson.dumps(m)
        parts += (found, b",")
    parts += json
    parts.append(b"]")
    return EncodedMessages(out, tuple(parts))
