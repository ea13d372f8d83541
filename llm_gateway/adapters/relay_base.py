"""What every stream relay shares: its state, how it fails, the event-size cap, how it ends.

A relay turns one engine response body into OpenAI SSE as the bytes arrive: `SSERelay` for the
engines that speak OpenAI SSE themselves, `OllamaRelay` for Ollama's NDJSON. Both keep the state the
service reads after each `feed()` (`usage`, `content_events`, `text_bytes`, `error`, `done`,
`output_started`), hold an incomplete event over to the next chunk (refusing one past
`MAX_EVENT_BYTES`: an engine must not make the gateway buffer without bound), fail at most once (one
error event, then `[DONE]`, then nothing more), and end the same way: the leftover of the body is
read as a last event, and a stream that has not finished cleanly by then ends with an error event.
Subclasses supply `_last()` (the leftover) and `_end()` (what the end of the body means) and their
own `feed()`.

When the engine never reports usage (the stream was cut, or the client left), the completion is
estimated from what was passed on: `completion_estimate()`. Most engines send one token per event,
and then the events are the count (exact, whatever the tokens' length). Events that carry more text
than `BATCHED_BYTES_PER_EVENT` on average hold several tokens each (vLLM and SGLang with
`--stream-interval`, or vLLM's frontend merging tokens when it falls behind): then the generated
text's bytes at `BYTES_PER_TOKEN` (the prompt estimate's ratio) are the count, never fewer than the
events, so such streams are not billed a fraction of what was generated.

A stream that relays more than the key's reservation allows (an engine that ignored `max_tokens`) is
ended by the service with `cut()`: each choice's end with finish reason `length` (what an engine sends
when it stops at `max_tokens`), the usage so far where the client asked for it, then `[DONE]`.

A stream for a client of another API (Anthropic's Messages, the Responses API) is translated on its
way: `translate()` hands the relay the stream's `ChatTranslation` (wire/chat_events.py) before the first
chunk, and from then on what the relay returns is the translation's output, never OpenAI SSE. The relay
drives it with what it already holds: the engine's events as bytes (`_pass`: parsed once, by the
translation), the chunks it makes itself as objects (`_chunk_out`), `[DONE]` (`_done_out`) and a failure
as the gateway's error (`_fail`). A plain stream pays one test per special block for this.

A whole answer that turns out to be a failed generation (an engine's `abort`/`error` finish reason,
Ollama's `done: false`) is raised as a `ChargedError`: the error carries what the generation spent,
the engine's counts or, when it gave none, `estimate_tokens()` of its text, for the service to bill.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import StreamRelay
from llm_gateway.errors import DONE, EngineErrorAnswer, GatewayError, UpstreamProtocolError
from llm_gateway.types import CallContext, Usage
from llm_gateway.wire.chat_events import ChatTranslation

MAX_EVENT_BYTES = 16 * 1024 * 1024
#: bytes of generated text per token, for the estimate of an unfinished stream (as for prompts)
BYTES_PER_TOKEN = 4
#: past this much text per event on average, events carry several tokens (1.5 tokens' worth: one
#: token of English is about 4 bytes, few are longer than 6)
BATCHED_BYTES_PER_EVENT = 6


class ChargedError(EngineErrorAnswer):
    """An error found in an answer after the engine generated it: `usage` is what it spent, to be billed
    (the service reads it off the error)."""

    def __init__(self, message: str, *, usage: Usage, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.usage = usage


def estimate_tokens(text_bytes: int) -> int:
    """Tokens of generated text that the engine did not count, at `BYTES_PER_TOKEN` (rounded up)."""
    return -(-text_bytes // BYTES_PER_TOKEN)


class RelayBase(ABC):
    """One stream's state; see the module docstring. Implements the `StreamRelay` protocol."""

    __slots__ = (
        "_buf",
        "_closed",
        "_ctx",
        "_tr",
        "content_events",
        "done",
        "error",
        "output_started",
        "text_bytes",
        "usage",
    )

    #: the start of the error message for an event past the cap ("... over N bytes")
    oversized: ClassVar[str] = "the engine sent an event"

    def __init__(self, ctx: CallContext) -> None:
        self._ctx = ctx
        self._buf = b""  # the incomplete event held over to the next chunk
        self._closed = False  # ended or failed: nothing more is passed on
        self.done = False  # the engine ended the stream cleanly
        self.usage: Usage | None = None
        self.error: GatewayError | None = None
        self.content_events = 0
        #: bytes of generated text (content, text, reasoning, tool-call arguments) passed on, as sent
        self.text_bytes = 0
        #: True once the relay has passed on generated output (non-empty text, reasoning, or a tool call)
        self.output_started = False
        self._tr: ChatTranslation | None = None  # the client's API, when it is not OpenAI's (`translate`)

    def translate(self, tr: ChatTranslation) -> None:
        """Answer in another API from the first chunk on: what the relay returns is `tr`'s output."""
        self._tr = tr

    # -- what the relay passes on, as OpenAI SSE or to the translation ----------------------------------
    def _pass(self, events: bytes) -> bytes:
        """Whole OpenAI SSE events as the engine sent them (its names swapped where they must be)."""
        tr = self._tr
        return events if tr is None or not events else tr.feed(events)

    def _chunk_out(self, obj: dict[str, Any]) -> bytes:
        """A chunk the relay made (or parsed and changed)."""
        tr = self._tr
        return b"data: " + orjson.dumps(obj) + b"\n\n" if tr is None else tr.event(obj)

    def _done_out(self) -> bytes:
        """The end of the stream: `[DONE]`."""
        tr = self._tr
        return DONE if tr is None else tr.end()

    def cut(self, choices: int, prompt_tokens: int) -> bytes:
        """End the stream at what the key may spend: finish reason `length` for each of `choices`, the usage
        (estimated) where the client asked for it, `[DONE]`; nothing after it."""
        self.done = self._closed = True
        ctx = self._ctx
        chat = ctx.endpoint == "chat"
        head = {
            "id": ("chatcmpl-" if chat else "cmpl-") + ctx.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": ctx.public_model,
        }
        end: dict[str, Any] = {"delta": {}} if chat else {"text": ""}
        ends = [{"index": i, **end, "finish_reason": "length"} for i in range(choices)]
        out = self._chunk_out({**head, "choices": ends})
        if ctx.client_wants_usage:
            n = self.completion_estimate()
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
            out += self._chunk_out({**head, "choices": [], "usage": usage})
        return out + self._done_out()

    def completion_estimate(self) -> int:
        """Completion tokens passed on so far, for a stream whose engine never reported its usage."""
        events, text = self.content_events, self.text_bytes
        if text <= BATCHED_BYTES_PER_EVENT * events:
            return events  # one token per event
        return max(events, -(-text // BYTES_PER_TOKEN))

    @abstractmethod
    def feed(self, data: bytes) -> bytes:
        """Bytes for the client now (possibly empty); an in-band engine error becomes one error event."""

    def _hold(self, buf: bytes) -> bytes:
        """Keep an incomplete event for the next chunk; one past the cap fails the stream."""
        if len(buf) > MAX_EVENT_BYTES:
            return self._fail(UpstreamProtocolError(f"{self.oversized} over {MAX_EVENT_BYTES} bytes"))
        self._buf = buf
        return b""

    def fail(self, err: GatewayError) -> bytes:
        """The stream failed after its first byte (the engine's connection broke): its error event and
        the end, in the client's API; nothing after it."""
        return self._fail(err)

    def _fail(self, err: GatewayError) -> bytes:
        self._closed = True
        self.error = err
        tr = self._tr
        return err.sse_event() + DONE if tr is None else tr.fail(err)

    def finish(self) -> bytes:
        """At the engine's end of body: the last event, then `[DONE]`, or an error event if the stream
        did not end cleanly. Nothing after the relay ended or failed."""
        if self._closed:
            return b""
        rest, self._buf = self._buf, b""
        out = self._last(rest) if rest.strip() else b""
        if self._closed:
            return out
        return out + self._end()

    @abstractmethod
    def _last(self, rest: bytes) -> bytes:
        """The leftover of the body (an event without its terminator), as bytes for the client."""

    @abstractmethod
    def _end(self) -> bytes:
        """The end of the body on a relay that has not ended yet: `[DONE]`, or an error event."""


def usage_or_estimate(relay: StreamRelay, prompt_estimate: int) -> tuple[int, int, bool]:
    """(prompt, completion, estimated) of a finished stream: the engine's usage, or when it never reported
    one (a cut stream, a client that left) the prompt estimate and what was relayed."""
    u = relay.usage
    if u is not None:
        return u.prompt_tokens, u.completion_tokens, False
    return prompt_estimate, relay.completion_estimate(), True
