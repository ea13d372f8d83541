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

    __slots__ = ("_buf", "_closed", "_ctx", "content_events", "done", "error", "output_started", "text_bytes", "usage")

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
        out = b"data: " + orjson.dumps({**head, "choices": ends}) + b"\n\n"
        if ctx.client_wants_usage:
            n = self.completion_estimate()
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n}
            out += b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
        return out + DONE

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

    def _fail(self, err: GatewayError) -> bytes:
        self._closed = True
        self.error = err
        return err.sse_event() + DONE

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
