"""An agent's Anthropic history translated once: the chat messages of the last few long `messages` lists kept, and a
request whose leading messages equal one's reuses their translation and translates only the rest.

A coding agent resends its whole conversation on every turn, one or two new messages at its end: translating the
46 messages of bench/agent_request.py's history into chat messages cost ~0.45M instructions a request (callgrind),
the largest part of `/v1/messages`' cost over chat completions' (issue 36 item 2). Comparing a parsed message with
a kept one (`==`, in C) costs a small part of translating it. What a reused message's translation added to the
request's sizes (`Seen`: its characters, and what `Gathered` holds of it) is kept beside it, message by message,
so that a prefix of any length replays exactly what translating it gave.

Equal means Python's equality of parsed JSON: a message is reused where it compares equal to a kept one, which
holds for the same bytes and for key orders and number spellings that parse equal (`1` and `1.0`, `true` and `1`
in a tool's input: the kept translation's spelling is sent then). A history's messages pass the checks before
they are kept, so a reused prefix is one that passed them. What is kept is shared by every request that reuses
it: nothing may change the chat messages a translation builds, nor the client's parsed messages (the gateway
replaces a body's fields and adapters build their own). Only lists of `MIN_MESSAGES` or more are kept: a short
one costs little to translate.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llm_gateway.dialects.field_checks import PromptChars
from llm_gateway.routing.request_info import Gathered

#: histories kept (the newest replaces the oldest): a few agents at once, each found by its own history
KEPT = 4
#: shorter message lists are translated every time
MIN_MESSAGES = 8

#: after a message, relative to before the first: the chat messages, texts, strings and as_json gathered, images,
#: other parts and characters counted, and whether every message so far left the request fresh
End = tuple[int, int, int, int, int, int, int, bool]


class Kept(NamedTuple):
    given: list[Any]  # the client's messages, parsed
    ends: list[End]  # after each of them
    out: list[dict[str, Any]]  # the chat messages they became
    texts: list[str]
    strings: list[str]
    as_json: list[Any]


_kept: list[Kept] = []


class Marks:
    """What a translation of `given` adds to `out` and `seen`, message by message, from where it began."""

    __slots__ = ("base", "ends", "given", "out", "replaces", "seen")

    def __init__(self, given: list[Any], out: list[dict[str, Any]], seen: PromptChars, g: Gathered) -> None:
        self.given, self.out, self.seen = given, out, seen
        self.base = (len(out), len(g.texts), len(g.strings), len(g.as_json), g.images, g.other_parts, seen.chars)
        self.ends: list[End] = []
        self.replaces: Kept | None = None  # a kept history this one begins with whole: kept no more once this is

    def mark(self, g: Gathered) -> None:
        """After a message: what it and those before it added."""
        b = self.base
        self.ends.append(
            (
                len(self.out) - b[0],
                len(g.texts) - b[1],
                len(g.strings) - b[2],
                len(g.as_json) - b[3],
                g.images - b[4],
                g.other_parts - b[5],
                self.seen.chars - b[6],
                g.fresh,
            )
        )

    def keep(self, g: Gathered) -> None:
        """After the last message: keep the translation (the oldest kept goes beyond `KEPT`)."""
        b = self.base
        kept = Kept(self.given, self.ends, self.out[b[0] :], g.texts[b[1] :], g.strings[b[2] :], g.as_json[b[3] :])
        if self.replaces is not None:
            _forget(self.replaces)  # the last turn of the same conversation: this one holds all of it
        _kept.append(kept)
        if len(_kept) > KEPT:
            del _kept[0]


def reuse(given: list[Any], out: list[dict[str, Any]], seen: PromptChars, g: Gathered) -> tuple[int, Marks | None]:
    """How many leading messages of `given` a kept translation gave (their chat messages put in `out`, their sizes
    in `seen` and `g`), and the marks to go on with for a list worth keeping (None: not kept, too short, or a
    request not fresh before its messages, whose marks would not hold for another)."""
    if len(given) < MIN_MESSAGES or not g.fresh:
        return 0, None
    marks = Marks(given, out, seen, g)
    best: Kept | None = None
    n = 0
    for kept in reversed(_kept):
        src = kept.given
        most = min(len(src), len(given))
        k = 0
        while k < most and given[k] == src[k]:
            k += 1
        if k > n:
            best, n = kept, k
            if k == len(given):
                break
    if best is None:
        return 0, marks
    if n == len(best.given):
        marks.replaces = best
    if best is not _kept[-1]:
        _forget(best)
        _kept.append(best)  # the most recently used is the last to go
    e = best.ends[n - 1]
    out.extend(best.out[: e[0]])
    g.texts.extend(best.texts[: e[1]])
    g.strings.extend(best.strings[: e[2]])
    g.as_json.extend(best.as_json[: e[3]])
    g.images += e[4]
    g.other_parts += e[5]
    seen.chars += e[6]
    if not e[7]:
        g.fresh = False
    marks.ends.extend(best.ends[:n])
    return n, marks


def _forget(kept: Kept) -> None:
    """Drop `kept` (found by identity: `==` would compare whole histories)."""
    for i, k in enumerate(_kept):
        if k is kept:
            del _kept[i]
            return


def clear() -> None:
    """Forget every kept history (tests)."""
    _kept.clear()
