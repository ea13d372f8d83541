"""One HTTP exchange with a client, over raw ASGI: reading the body with limits, answering, and
noticing at once when the client goes away. `Call` implements the service's `ClientExchange`
(llm_gateway/exchange.py) and records the status it sent.

Raw ASGI instead of a framework's Request/Response objects: on the hot path this is measurably
cheaper (see bench/), and streaming needs direct control of `send`. Disconnects: ASGI reports them
only through `receive()`, so a watcher waits on it and cancels the handler task when the client
leaves; the handler's cleanup then closes the upstream request (engines keep generating
otherwise). Non-streamed calls arm the watcher after a short delay, so fast requests do not pay
for it. On the gateway's own server (direct_cycle.CoalescingCycle) there is no watcher: the
protocol calls the cycle's `on_disconnect` when the connection is lost, which cancels the handler the
same way, for no task per request (bench/: CPU per request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llm_gateway.access.keys import Principal
from llm_gateway.errors import PayloadTooLarge, RequestTimeout
from llm_gateway.exchange import JSON, Headers
from llm_gateway.http.direct_cycle import COALESCE, CoalescingCycle

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class Call:
    __slots__ = (
        "_body_now",
        "_by_name",
        "_conn",
        "_cycle",
        "_direct",
        "_held",
        "_timer",
        "_watcher",
        "disconnected",
        "receive",
        "rid",
        "scope",
        "send",
        "started",
        "status",
        "task",
        "who",
    )

    def __init__(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        rid: str,
        by_name: dict[bytes, bytes] | None = None,
        server_send: Send | None = None,
    ) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.rid = rid
        self.started = False
        self.status = 0
        self.disconnected = False
        self.task: asyncio.Task[Any] | None = None
        self.who: Principal | None = None  # the caller's key, once authenticated (handlers.authenticate)
        self._watcher: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        # the server's cycle (direct_cycle.CoalescingCycle), when `send` is its own method: its direct
        # chunk writer, and the body handed over at once when it has all arrived
        owner = getattr(send, "__self__", None)
        cycle = owner if isinstance(owner, CoalescingCycle) else None
        self._direct: Callable[[bytes], bool] | None = cycle.write_chunk if cycle is not None else None
        self._body_now: Callable[[], bytes | None] | None = cycle.body_now if cycle is not None else None
        #: the cycle that says when the client left (`on_disconnect`), or None: a watcher task does
        self._cycle = cycle
        self._held: tuple[int, Headers] | None = None  # a stream's head waiting for its first part (start(hold))
        self._by_name = by_name  # the request's headers by name (`header`), when the app has made them
        # the server's cycle behind `send`, or behind `server_send` when `send` wraps it (CORS): told when the
        # request shows a valid key (`authenticated`)
        conn = self._cycle if server_send is None else getattr(server_send, "__self__", None)
        self._conn: CoalescingCycle | None = conn if isinstance(conn, CoalescingCycle) else None

    def header(self, name: bytes) -> bytes | None:
        """The request's header `name` (lower-case), its first value when it was sent more than once."""
        by_name = self._by_name
        if by_name is None:  # built on the first look (a request looks up about seven): one pass in C
            by_name = self._by_name = dict(reversed(self.scope["headers"]))
        return by_name.get(name)

    def authenticated(self) -> None:
        """The request showed a valid key: its connection no longer counts as an unauthenticated one
        (hardened_protocol.py: those have a cap of their own)."""
        conn = self._conn
        if conn is not None:
            conn.authenticated()

    async def read_body(self, limit: int, timeout_s: float) -> bytes:
        length = self.header(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                n = -1
            if n > limit:
                raise PayloadTooLarge(f"request body is {n} bytes; the limit is {limit}")
        take = self._body_now
        if take is not None:
            body = take()
            if body is not None:  # all in already: no wait, no timer, no ASGI message
                if len(body) > limit:
                    raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
                return body
        try:
            async with asyncio.timeout(timeout_s):
                return await self._read_all(limit)
        except TimeoutError:
            raise RequestTimeout(f"the request body did not arrive within {timeout_s:g}s") from None

    async def _read_all(self, limit: int) -> bytes:
        receive = self.receive
        msg = await receive()
        if msg["type"] == "http.disconnect":
            self.disconnected = True
            raise asyncio.CancelledError
        body: bytes = msg.get("body", b"")
        if not msg.get("more_body"):
            if len(body) > limit:
                raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
            return body
        parts = [body]
        size = len(body)
        while msg.get("more_body"):
            msg = await receive()
            if msg["type"] == "http.disconnect":
                self.disconnected = True
                raise asyncio.CancelledError
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(f"request body is over the limit of {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    # -- disconnect watching ---------------------------------------------------------------------------
    def watch_disconnect(self, delay_s: float = 0.0) -> None:
        self.task = asyncio.current_task()
        cycle = self._cycle
        if cycle is not None:  # told by the protocol, at once and for free: no delay needed
            if cycle.disconnected:
                self._left()
            else:
                cycle.on_disconnect = self._left  # a reference cycle until stop_watching or the callback
            return
        if delay_s > 0:
            self._timer = asyncio.get_running_loop().call_later(delay_s, self._start_watcher)
        else:
            self._start_watcher()

    def _start_watcher(self) -> None:
        self._timer = None
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                self.disconnected = True
                if self.task is not None and not self.task.done():
                    self.task.cancel()
                return

    def _left(self) -> None:
        self.disconnected = True
        task = self.task
        if task is not None and not task.done():
            task.cancel()

    def stop_watching(self) -> None:
        cycle = self._cycle
        if cycle is not None:
            cycle.on_disconnect = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None
        self.task = None

    # -- answering ---------------------------------------------------------------------------------------
    async def respond(self, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
        self.started = True
        self.status = status
        headers.append((b"content-type", content_type))
        headers.append((b"content-length", b"%d" % len(body)))
        cycle = self._cycle
        if cycle is not None and cycle.respond_now(status, headers, body):
            return
        await self.send({"type": "http.response.start", "status": status, "headers": headers, COALESCE: True})
        await self.send({"type": "http.response.body", "body": body})

    async def start(self, status: int, headers: Headers, *, hold: bool = False) -> None:
        self.started = True
        self.status = status
        cycle = self._cycle
        if cycle is not None:
            if hold:
                self._held = (status, headers)  # written with the first part, by write() or end()
                return
            if cycle.start_now(status, headers, b""):
                return
        msg = {"type": "http.response.start", "status": status, "headers": headers}
        if hold:
            msg[COALESCE] = True
        await self.send(msg)

    async def _send_held(self, data: bytes, last: bool) -> None:
        """The held head with `data`, and the end when `last`."""
        status, headers = self._held  # type: ignore[misc]
        self._held = None
        if self._cycle is not None and self._cycle.start_now(status, headers, data, last):
            return
        await self.send({"type": "http.response.start", "status": status, "headers": headers, COALESCE: True})
        await self.send({"type": "http.response.body", "body": data, "more_body": not last})

    def direct_writer(self) -> Callable[[bytes], bool] | None:
        """The server's own chunk writer, for the relay's per-event loop: it writes a chunk of the started
        stream now if the server can without waiting (True), else writes nothing (False: `write` it); None
        when the server has none."""
        return self._direct

    async def write(self, data: bytes) -> None:
        if self._held is not None:
            await self._send_held(data, False)
            return
        direct = self._direct
        if direct is None or not direct(data):
            await self.send({"type": "http.response.body", "body": data, "more_body": True})

    async def end(self, data: bytes = b"") -> None:
        if self._held is not None:
            await self._send_held(data, True)
            return
        cycle = self._cycle
        if cycle is not None and cycle.write_chunk(data, True):
            return
        await self.send({"type": "http.response.body", "body": data})


class CallExchange:
    """Base of the exchanges that answer in another API's shape over a `Call` (Anthropic's, the Responses
    API's): the status, the request headers and the disconnect watch are the call's own.

    A stream of theirs is translated by the stream relay itself (`translation()`, wire/chat_events.py), so
    what the relay writes is the client's already: it goes out as it is, from the upstream connection's
    callback too (`direct_writer`, the relay's push mode), and a chunk the client's socket could not take
    is kept once, by the relay. What the service writes itself before a relay exists (a queued stream's
    comments, its failure) is OpenAI SSE, and the exchange translates that."""

    __slots__ = ("_call", "_relayed", "rid")

    def __init__(self, call: Call) -> None:
        self._call = call
        self.rid = call.rid
        self._relayed = False  # the stream's translation is the relay's: writes are the client's bytes

    def direct_writer(self) -> Callable[[bytes], bool] | None:
        """The call's own chunk writer (None when it has none): the relay's writes need no translating here."""
        return self._call.direct_writer()

    @property
    def status(self) -> int:
        return self._call.status

    @status.setter
    def status(self, value: int) -> None:
        self._call.status = value

    def header(self, name: bytes) -> bytes | None:
        return self._call.header(name)

    def watch_disconnect(self, delay_s: float = 0.0) -> None:
        self._call.watch_disconnect(delay_s)

    def stop_watching(self) -> None:
        self._call.stop_watching()
