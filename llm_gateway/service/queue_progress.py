"""What a streamed request hears while it waits in a deployment's queue: SSE comments with its place.

A stream that has to wait for a slot gets its answer started at once (200, `text/event-stream`) and then
a comment line every `routing.queue_progress_s`: `: queued position=N eta_s=S` (N waiters go before it;
S from the queue's drain rate, absent while unknown). Comments are part of SSE and every SDK skips them,
so clients that do not read them lose nothing, and a proxy or client with an idle timeout sees bytes.
If the wait then fails (queue timeout, every deployment down), the error goes out as the stream's one
error event and `[DONE]`, since the status has already been sent.
"""

from __future__ import annotations

from llm_gateway.errors import DONE, GatewayError
from llm_gateway.exchange import ClientExchange, Headers

SSE_HEADERS: Headers = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


class QueueProgress:
    """Started on the first report of a wait; the service then relays into the same answer."""

    __slots__ = ("_call", "_headers", "started")

    def __init__(self, call: ClientExchange, headers: Headers) -> None:
        self._call = call
        self._headers = headers
        self.started = False

    async def __call__(self, position: int, eta_s: float | None) -> None:
        if not self.started:
            self.started = True
            await self._call.start(200, [*self._headers, *SSE_HEADERS])
        eta = f" eta_s={eta_s:.1f}" if eta_s is not None else ""
        await self._call.write(f": queued position={position}{eta}\n\n".encode())

    async def fail(self, e: GatewayError) -> None:
        """The wait failed after the answer started: the error as the stream's last event."""
        await self._call.write(e.sse_event() + DONE)
        await self._call.end()
