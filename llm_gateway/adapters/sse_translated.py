"""The translated stream's token path of the SSE relay (sse_relay.py's `SSERelay` is built on it): for a client of
another API (wire/chat_events.ChatTranslation), an ordinary token of the learnt envelope is handed to the
translation as its text alone, and every other event as it is, parsed once by the translation (a block's events
together: `_slow_translated`). Also the test
the relay's envelopes share: whether a swap of the model or field names could reach into an event's text.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import ClassVar

import orjson

from llm_gateway.adapters.relay_base import RelayBase
from llm_gateway.errors import DONE
from llm_gateway.wire.chat_events import ChatTranslation, plain_text
from llm_gateway.wire.sse_bytes import has_output, text_envelope


class TokenTranslation(RelayBase):
    """The translated path of `SSERelay`: `_translated` is its `feed` while a translation is set."""

    __slots__ = ("_learns", "_tok")

    #: a translated stream's envelope of an ordinary token (see `SSERelay.__init__`)
    _tok: tuple[bytes, bytes, int, int, bytes] | None
    _learns: int  # envelopes learnt (again when one changes, as a per-chunk `created` does each second)
    #: set by `SSERelay`: the swaps of model and field names
    _replacements: tuple[tuple[bytes, bytes], ...]
    _finish_renames: tuple[tuple[bytes, bytes], ...]
    _fed: list[bytes]  # a block's events waiting to be handed to the translation together
    oversized: ClassVar[str]

    def _block(self, data: bytes) -> bytes:  # the block path: SSERelay's
        raise NotImplementedError

    def _passed(self, block: bytes) -> Iterator[bytes | None]:  # a block's events as passed on: SSERelay's
        raise NotImplementedError

    def _slow_translated(self, block: bytes, tr: ChatTranslation) -> bytes:
        """`_slow` for a translated stream: the block's events (as `_event` passes them on) are handed to the
        translation together, `[DONE]` too, so that its output is joined once, by it: the Responses API's last
        frame, after the last token and the usage, is tens of KB. A failure (in the client's API already,
        `_fail`) first hands over what came before it (`_fail` does), so the translation fails in that state."""
        fed = self._fed
        for ev in self._passed(block):
            if ev is None:
                fed.append(DONE)  # the translation's `end()`, as `_done_out` would call it
            elif self._closed:  # a failure, the translation's already: what came before it went first
                return ev
            else:
                if not self.output_started:  # read in OpenAI's events, before translating
                    self.output_started = has_output(ev)
                fed.append(ev)
        if not fed:
            return b""
        out = tr.feed(fed[0] if len(fed) == 1 else b"".join(fed))
        fed.clear()
        return out

    def _translated(self, data: bytes) -> bytes:
        """`feed` of a translated stream: an ordinary token of the learnt envelope is handed to the translation
        as its text alone (the same checks as the envelope's path above), anything else goes the block path."""
        tok = self._tok
        if tok is not None and not self._buf and not self._closed:
            pre, suf, a, n_suf, _ = tok
            b = len(data) - n_suf
            if a <= b and data[:a] == pre and data[b:] == suf:
                text = data[a:b]
                if not text.partition(b'"')[1] and not text.partition(b"\n")[1]:
                    out = self._tr.token(text)  # type: ignore[union-attr]
                    if out is not None:
                        self.content_events += 1
                        self.text_bytes += b - a
                        return out
        return self._block(data)

    def _translate_block(self, raw: bytes, block: bytes, n: int) -> bytes:
        """A block of ordinary events (counted already) for a translated stream: each event of the token
        envelope handed over as its text, the others as they are (`block`: with the swaps; `raw`: without);
        an event that is not taken so is learnt from (up to `_MAX_LEARNS` a stream: `created` ticks)."""
        tr: ChatTranslation = self._tr  # type: ignore[assignment]
        if n == 1:  # `_translated` tried the token path already
            out = tr.feed(block)
            if self._learns < _MAX_LEARNS:
                self._learns += 1
                self._learn_token(raw)
            return out
        raws = raw.split(b"\n\n")
        if self._tok is None:  # no envelope learnt (a stream's first block): all of it parsed, in one feed
            out = tr.feed(block)  # its output joined once (the Responses API's first frames are tens of KB)
            for i in range(n):
                if self._learns >= _MAX_LEARNS or self._tok is not None:
                    break
                self._learns += 1
                self._learn_token(raws[i] + b"\n\n")
            return out
        outs = raws if block is raw else block.split(b"\n\n")  # the swaps hold no blank line: events match
        parts: list[bytes] = []
        for i in range(n):
            ev = raws[i]
            tok = self._tok
            if tok is not None:
                pre, _, a, n_suf, suf = tok
                b = len(ev) + 2 - n_suf
                if a <= b and ev[:a] == pre and ev[b:] == suf:
                    text = ev[a:b]
                    if not text.partition(b'"')[1]:  # one event a line: no line break in it
                        got = tr.token(text)
                        if got is not None:
                            parts.append(got)
                            continue
            parts.append(tr.feed(outs[i] + b"\n\n"))
            if self._learns < _MAX_LEARNS:
                self._learns += 1
                self._learn_token(ev + b"\n\n")
        return b"".join(parts)

    def _learn_token(self, event: bytes) -> None:
        """Learn a translated stream's token envelope from `event` (one whole event, `data: {...}` and its
        blank line) when it is an ordinary token (parsed here: once per event learnt from) with one text
        string that no swap of the model or field names could reach into."""
        found = text_envelope(event)
        if found is None:
            return
        pre, _, suf = found
        for old, _new in self._replacements + self._finish_renames:
            n = len(old)
            if _straddles_near(old, pre[-n:], suf[:n]):
                return
        try:
            obj = orjson.loads(event[6:])
        except orjson.JSONDecodeError:
            return
        if isinstance(obj, dict) and plain_text(obj) is not None:
            self._tok = (pre, suf, len(pre), len(suf), suf[:-2])


_MAX_LEARNS = 16  # a stream whose envelope keeps changing (or cannot be learnt) stops trying


def _straddles(old: bytes, pre: bytes, suf: bytes) -> bool:
    """Could `old` match across the text of an event `pre + text + suf`, for some text with no quote in it?
    `pre` ends with the text string's opening quote and `suf` starts with its closing one."""
    q = old.find(b'"')
    if q < 0:  # no quote: it could lie in the text itself
        return True
    if q > 0 and suf.startswith(old[q:]):  # begins in the text, ends in the suffix
        return True
    for i in range(q, len(old) - 1):  # begins in the prefix at one of its quotes, goes on into the text
        if old[i : i + 1] == b'"' and pre.endswith(old[: i + 1]):
            rest = old[i + 1 :]
            j = rest.find(b'"')
            if j < 0 or suf.startswith(rest[j:]):
                return True
    return False


#: `_straddles` of the ends of `pre` and `suf` as long as `old`, which are all it reads: the same for every
#: stream of an engine (the ids and timestamps sit further from the text), so a stream's `_learn` finds
#: its answer here instead of walking `old` byte by byte (~200 bytecodes a stream, bench/instructions.sh)
_straddles_near = functools.lru_cache(maxsize=256)(_straddles)
