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
"""

from __future__ import annotations

from typing import Any, NamedTuple

from llm_gateway.routing.gathered import Gathered

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


class Marks:
    """What a translation of `given` adds to `out` and the sizes, entry by entry, from where it began."""

    __slots__ = ("base", "ends", "given", "histories", "out", "replaces")

    def __init__(self, histories: Histories, given: list[Any], out: list[dict[str, Any]], g: Gathered) -> None:
        self.histories, self.given, self.out = histories, given, out
        self.base = (len(out), len(g.texts), len(g.strings), len(g.as_json), g.images, g.other_parts)
        self.ends: list[End] = []
        self.replaces: Kept | None = None  # a kept history this one begins with whole: kept no more once this is

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
        kept = Kept(self.given, self.ends, self.out[b[0] :], g.texts[b[1] :], g.strings[b[2] :], g.as_json[b[3] :])
        histories = self.histories
        if self.replaces is not None:
            histories.forget(self.replaces)  # the last turn of the same conversation: this one holds all of it
        histories.kept.append(kept)
        if len(histories.kept) > KEPT:
            del histories.kept[0]


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
            k = 0
            while k < most and given[k] == src[k]:
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
