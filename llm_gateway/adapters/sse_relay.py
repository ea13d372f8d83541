"""Relaying an engine's OpenAI-style SSE stream to the client as clean OpenAI SSE.

Bytes pass through untouched on the fast path: a block of complete events with nothing to fix is
forwarded as one write (with the public model name swapped in by a byte replace). Only blocks that
carry something special are parsed event by event: `[DONE]`, usage chunks (captured for billing and
stripped unless the client asked for them), in-band error frames (turned into one OpenAI error
event followed by `[DONE]`), comment lines such as TabbyAPI's `: ping`, CRLF framing, and
finish reasons that are not OpenAI's. A stream that ends without `[DONE]` and without a finish
reason ends for the client with an error event: the client must never take a cut stream for a
complete answer. The first event that carries generated output (non-empty content, text or
reasoning, or a tool call) sets `output_started`, found by a byte scan that stops once it is set.
The generated text passed on is counted as well (`text_bytes`, for the estimate of a stream that
never reports usage) without parsing: the events of one stream share their shape, so once one
event has been measured, a block that starts and ends like it (with its text's key in each event,
when it has several) is its envelopes around the text (arithmetic on its length); any other block
is scanned for the strings that carry text.

The commonest block of all, one token's event, is cheaper still once the stream's envelope is known
(`_learn`): an ordinary event with one text string, generated output already started, is remembered as
the bytes before its text and the bytes after it. A later block that is exactly that prefix, a text with
no quote or line feed (so no other JSON member and no second event can hide in it), and that suffix is
the same event with other text: nothing in it can be special, and it is passed on as it came (or with its
prefix and suffix rewritten once, when the model name or a field name is swapped and no swap can straddle
the text). Two slice comparisons and two `partition`s instead of a dozen scans of the block
(bench/instructions.sh: instructions per relayed event).

The per-event paths test for a byte string with `data.find(x) < 0`, not `x not in data`: CPython (3.11 to
3.13) answers `bytes in bytes` by first trying `x` as an integer, which raises and clears a formatted
TypeError each time (70 ns on 3.11, 400 on 3.13, per test; `find` 50-100 ns in all). The envelope's check
avoids `find`, `startswith` and `endswith` as well: they parse their arguments through a format string
(450-670 instructions a call on 3.11), where a slice compared or a `partition` (one argument) does not.
What the relay reads in an event's bytes without parsing it (output markers, text, usage, data lines, the
envelope around an event's one text) is wire/sse_bytes.py.

A stream for a client of another API (`translate`, relay_base.py) goes the same way, the translation
(wire/chat_events.ChatTranslation) taking the place of the bytes passed on: the blocks as they are (parsed
once, by the translation), and an ordinary token (`wire.chat_events.plain_text`: parsed once to be told, per
envelope learnt) as its text alone, which the translation copies between its own frame's bytes. That token
envelope (`_tok`) is learnt and matched per event, in a lone event's read (`_translated`) and in a read of
several (`_translate_block`): what the translation would otherwise parse, the engine's events coalescing
when it is fast or the gateway busy. The chat envelope (`_env`) is not used then: one test on the block path.
A block read before any token envelope is learnt (a stream's first) is handed over in one feed, and so are a
special block's events (the last token, the finish, the usage, `[DONE]`: `_slow_translated`), so that the
translation joins its output once: a Responses frame that echoes an agent's tools is tens of KB.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.sse_translated import _MAX_LEARNS, TokenTranslation, _straddles_near
from llm_gateway.errors import DONE, EngineErrorAnswer, GatewayError, StreamInterrupted, UpstreamProtocolError
from llm_gateway.types import CallContext
from llm_gateway.wire.sse_bytes import (
    DONE_DATA,
    TEXT,
    both_spacings,
    both_spacings_of_pairs,
    data_of,
    has_output,
    has_usage,
    json_str,
    text_bytes,
    text_envelope,
    usage_from,
)

__all__ = ["DONE", "ErrorFrameHandler", "SSERelay", "has_output", "text_bytes", "usage_from"]

ErrorFrameHandler = Callable[[dict[str, Any]], EngineErrorAnswer]
_Envelope = tuple[bytes, bytes, bytes | None, bytes | None, int, int]


class SSERelay(TokenTranslation):
    """One stream's state. Adapters configure it; they rarely need to subclass it."""

    __slots__ = (
        "_cal",
        "_env",
        "_envelope",
        "_error_mark",
        "_fed",
        "_finish_errors",
        "_finish_renames",
        "_on_error",
        "_replacements",
        "_saw_finish",
    )

    oversized: ClassVar[str] = "the engine sent an SSE event"

    def __init__(
        self,
        ctx: CallContext,
        on_error: ErrorFrameHandler,
        *,
        replacements: tuple[tuple[bytes, bytes], ...] = (),
        finish_errors: tuple[bytes, ...] = (),
        finish_renames: tuple[tuple[bytes, bytes], ...] = (),
        flat_errors: bool = False,
    ) -> None:
        super().__init__(ctx)
        self._on_error = on_error
        #: what marks a block that may hold an error event: `{"error"`, or any `"error"` where the engine
        #: sends flat `{"object": "error", "message", ...}` frames (trtllm-serve)
        self._error_mark = b'"error"' if flat_errors else b'{"error"'
        rep = list(replacements)
        if ctx.public_model != ctx.upstream_model:
            up, pub = json_str(ctx.upstream_model), json_str(ctx.public_model)
            # compact JSON (pydantic, orjson, Go, nlohmann) and json.dumps' spaced style (TabbyAPI, LMDeploy)
            rep.append((b'"model":"' + up + b'"', b'"model":"' + pub + b'"'))
            rep.append((b'"model": "' + up + b'"', b'"model": "' + pub + b'"'))
        self._replacements = tuple(rep)
        self._finish_errors = both_spacings(finish_errors)
        self._finish_renames = both_spacings_of_pairs(finish_renames)
        self._saw_finish = False
        #: the shape of this stream's events, once one was measured (`_scan`): where the tail of the
        #: text's prefix sits and its bytes, the bytes after the text, the envelope's length and its quotes
        self._cal: tuple[int, bytes, bytes, int, int] | None = None
        #: one ordinary event's envelope, once learnt (`_learn`): the bytes before its text, after it, and what
        #: to send instead of each (None: the bytes as they came), with their lengths
        self._envelope: _Envelope | None = None
        #: the envelope `feed` tries first: `_envelope` while the relay is open and holds no part of an event,
        #: else None (set after each block, cleared by `finish` and `_fail`)
        self._env: _Envelope | None = None
        self._learns = 0  # envelopes learnt (again when one changes, as a per-chunk `created` does each second)
        #: a translated stream's envelope of an ordinary token (`wire.chat_events.plain_text`): the bytes before
        #: its text and after it, their lengths, and the bytes after it less the blank line (an event in a block);
        #: an event that is that envelope around a text is handed to the translation as its text alone
        self._tok: tuple[bytes, bytes, int, int, bytes] | None = None
        #: a translated stream's events of a special block not yet handed to the translation (`_slow_translated`)
        self._fed: list[bytes] = []

    # -- the hot path ------------------------------------------------------------------------------
    def feed(self, data: bytes) -> bytes:
        env = self._env  # None while the relay is closed or holds part of an event (`_block`'s invariant)
        if env is not None:
            # slices compared and `partition` (one argument, no parsing) for the text: bytes' startswith,
            # endswith and find parse their arguments through a format string and cost more than the
            # slices they spare, a regex more still (its match state set up per call)
            pre, suf, pre_out, suf_out, a, n_suf = env
            b = len(data) - n_suf
            if a <= b and data[:a] == pre and data[b:] == suf:
                text = data[a:b]
                # a quote in it would end the string early; a raw line break is not JSON, and SSE splits there.
                # (A lone CR or a trailing backslash is relayed and counted by the block path below exactly
                # as here: not checked; tests/unit/test_sse_relay.py compares the two paths on such texts.)
                if not text.partition(b'"')[1] and not text.partition(b"\n")[1]:
                    self.content_events += 1
                    self.text_bytes += b - a
                    return data if pre_out is None else pre_out + text + suf_out  # type: ignore[operator]
        if self._tr is not None:  # `_env` is never set while translating: one test here, on the block path
            return self._translated(data)
        out = self._block(data)
        # the envelope's path only while nothing is held over and the relay is open: one test per event above
        self._env = self._envelope if not self._buf and not self._closed else None
        return out

    def _block(self, data: bytes) -> bytes:
        if self._closed:
            return b""
        # the block path: `partition` (one argument) where a test would be `find`, and slices compared where it
        # would be `startswith`/`endswith`, as on the envelope's path above; `count` only for a block of several
        buf = self._buf + data if self._buf else data
        if buf.partition(b"\r")[1]:
            tail = b"\r" if buf[-1:] == b"\r" else b""
            buf = buf[: len(buf) - len(tail)].replace(b"\r\n", b"\n") + tail
        head, sep, rest = buf.rpartition(b"\n\n")
        if not sep:
            return self._hold(buf)
        block = head + sep if rest else buf
        self._buf = rest
        finish = bool(block.partition(b'"finish_reason":"')[1] or block.partition(b'"finish_reason": "')[1])
        if finish:
            self._saw_finish = True
        if block.partition(b"\n")[2] == b"\n":  # one event on one line (its only line feeds end the block)
            n = 1
            shaped = block[:7] == b"data: {" and block[-3:] == b"}\n\n"
        else:
            n = block.count(b"\n\n")
            shaped = (
                block[:7] == b"data: {"
                and block.count(b"\n") == 2 * n  # every event is one line
                and block.count(b"\n\ndata: {") == n - 1
                and block.count(b"}\n\n") == n
            )
        if (
            shaped
            and not block.partition(DONE_DATA)[1]
            and not has_usage(block)  # `"usage": null` on every chunk (LMDeploy, vLLM) stays on the fast path
            and not block.partition(self._error_mark)[1]
            and not (self._finish_errors and self._saw_finish)
        ):
            self.content_events += n
            cal = self._cal
            if (
                cal is not None
                and block[-len(cal[2]) :] == cal[2]  # both parts are never empty: each has a quote at least
                and block[cal[0] : cal[0] + len(cal[1])] == cal[1]
                # one string between them (a quote there would be another field: `"reasoning_content":"",
                # "content":"..."` after a reasoning event's shape); several events: each has the text where it
                # was, and the envelope's quotes only
                and (
                    not block[cal[0] + len(cal[1]) : len(block) - len(cal[2])].partition(b'"')[1]
                    if n == 1
                    else block.count(cal[1]) == n and block.count(b'"') == n * cal[4]
                )
            ):
                self.text_bytes += len(block) - n * cal[3]  # n envelopes of the measured shape around the text
            else:
                self._scan(block)
            raw = block
            for old, new in self._replacements:
                block = block.replace(old, new)
            for old, new in self._finish_renames:
                block = block.replace(old, new)
            if not self.output_started:
                self.output_started = has_output(block)
            if self._tr is not None:
                return self._translate_block(raw, block, n)
            # learnt from the first output on: the stream's first token is the envelope's first example (an
            # event learnt before any output would put a role-only or empty event's shape on the fast path)
            if self.output_started and n == 1 and not finish and self._learns < _MAX_LEARNS and not self._buf:
                self._learns += 1
                self._learn(raw, block)
            return block
        return self._slow(block)

    def _learn(self, raw: bytes, out: bytes) -> bool:
        """Remember the envelope of `raw`, one ordinary event relayed as `out`, when it has exactly one text
        string and no swap of the model or field names could reach into the text (True)."""
        found = text_envelope(raw)
        if found is None:
            return False
        pre, text, suf = found
        swaps = self._replacements + self._finish_renames
        for old, _ in swaps:  # a loop, not any(genexpr): once a stream, but every stream
            n = len(old)
            if _straddles_near(old, pre[-n:], suf[:n]):
                return False
        pre_out, suf_out = pre, suf
        for old, new in swaps:
            pre_out, suf_out = pre_out.replace(old, new), suf_out.replace(old, new)
        if pre_out + text + suf_out != out:  # swaps that feed one another: not for the envelope
            return False
        if pre_out == pre and suf_out == suf:
            self._envelope = (pre, suf, None, None, len(pre), len(suf))
        else:
            self._envelope = (pre, suf, pre_out, suf_out, len(pre), len(suf))
        return True

    def _scan(self, block: bytes) -> None:
        """Count the text of a block the cheap way cannot; learn the shape of its last event from it."""
        i = block.rfind(b"\n\n", 0, len(block) - 2)
        last = i + 2 if i >= 0 else 0  # where the last event starts
        spans = [m.span(1) for m in TEXT.finditer(block)]
        self.text_bytes += sum(b - a for a, b in spans)
        mine = [sp for sp in spans if sp[0] >= last]
        if len(mine) == 1:  # one text string in the event: its envelope is everything else
            a, b = mine[0]
            k = max(last, a - 24)  # the tail of the prefix, the key of the string included
            quotes = block.count(b'"', last) - block.count(b'"', a, b)  # the envelope's (the text may have \")
            self._cal = (k - last, block[k:a], block[b:], len(block) - last - (b - a), quotes)

    # -- everything special ------------------------------------------------------------------------
    def _slow(self, block: bytes) -> bytes:
        tr = self._tr
        if tr is not None:
            return self._slow_translated(block, tr)
        out: list[bytes] = []
        for ev in self._passed(block):
            if ev is None:
                out.append(self._done_out())
                continue
            if not self.output_started and not self._closed:
                self.output_started = has_output(ev)
            out.append(ev)
        return b"".join(out)

    def _passed(self, block: bytes) -> Iterator[bytes | None]:
        """The block's events as `_event` passes them on, in order, until the stream closes; None for `[DONE]`
        (which closes it)."""
        for raw in block.split(b"\n\n"):
            if self._closed:
                return
            payload = data_of(raw)
            if payload is None:
                continue  # blank, comment (": ping"), or an event with no data
            if payload == DONE_DATA:
                self.done = True
                self._closed = True
                yield None
                return
            ev = self._event(payload)
            if ev:
                yield ev

    def _has_finish_error(self, payload: bytes) -> bool:
        for f in self._finish_errors:  # noqa: SIM110  # a loop, not any(genexpr): no generator per event
            if payload.partition(f)[1]:
                return True
        return False

    def _event(self, payload: bytes) -> bytes:
        if (
            payload[:1] == b"{"
            and payload[-1:] == b"}"
            and not has_usage(payload)
            and not payload.partition(b'"error"')[1]
            and not self._has_finish_error(payload)
        ):  # an ordinary chunk in a block with something special elsewhere: no need to parse it
            self.content_events += 1
            self.text_bytes += text_bytes(payload)
            return self._rewrite(payload)
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self._fail(UpstreamProtocolError("the engine sent an SSE event that is not valid JSON"))
        if not isinstance(obj, dict):
            return self._fail(UpstreamProtocolError("the engine sent an SSE event that is not a JSON object"))
        if ("error" in obj or obj.get("object") == "error") and "choices" not in obj:
            return self._fail(self._on_error(obj))
        for f in self._finish_errors:
            if payload.find(f) >= 0:
                reason = f.split(b'"')[-2].decode()
                return self._fail(StreamInterrupted(f"the engine ended the generation with finish_reason '{reason}'"))
        usage = usage_from(obj)
        if usage is None:
            self.content_events += 1
            self.text_bytes += text_bytes(payload)
            return self._rewrite(payload)
        self.usage = usage
        if not obj.get("choices"):
            # the usage chunk: the client's if it asked, else asked for on the gateway's own account
            return self._rewrite(payload) if self._ctx.client_wants_usage else b""
        # usage riding on a chunk that also has a choice (TabbyAPI puts the finish there): OpenAI's shape
        # is the choice first, then a usage chunk with no choices
        self.content_events += 1
        self.text_bytes += text_bytes(payload)
        u = obj.pop("usage")
        if "model" in obj:
            obj["model"] = self._ctx.public_model
        out = self._rewrite(orjson.dumps(obj))
        if self._ctx.client_wants_usage:
            obj["choices"] = []
            obj["usage"] = u
            out += b"data: " + orjson.dumps(obj) + b"\n\n"
        return out

    def _rewrite(self, payload: bytes) -> bytes:
        for old, new in self._replacements:
            payload = payload.replace(old, new)
        for old, new in self._finish_renames:
            payload = payload.replace(old, new)
        return b"data: " + payload + b"\n\n"

    # -- the end of the body --------------------------------------------------------------------------
    def _last(self, rest: bytes) -> bytes:
        """An event the engine did not terminate: relayed if it is whole JSON; a partial one is an
        error, never forwarded."""
        payload = data_of(rest)
        if payload is None:
            return b""
        if payload != DONE_DATA:
            try:
                orjson.loads(payload)
            except orjson.JSONDecodeError:
                return self._fail(StreamInterrupted("the engine's stream ended in the middle of an event"))
        if payload.find(b'"finish_reason":"') >= 0 or payload.find(b'"finish_reason": "') >= 0:
            self._saw_finish = True
        return self._slow(b"data: " + payload + b"\n\n")

    def _end(self) -> bytes:
        if self.done or self._saw_finish:
            self._closed = True
            return self._done_out()
        return self._fail(StreamInterrupted("the engine's stream ended before the answer was complete"))

    def finish(self) -> bytes:
        self._env = None
        return super().finish()

    def _fail(self, err: GatewayError) -> bytes:
        self._env = None
        fed, tr = self._fed, self._tr
        if fed and tr is not None:  # a special block's events before the failure: translated first
            first = tr.feed(b"".join(fed))
            fed.clear()
            return first + super()._fail(err)
        return super()._fail(err)
