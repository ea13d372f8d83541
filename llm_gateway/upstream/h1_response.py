"""One exchange of the gateway's HTTP/1.1 client (h1_client.py): the status and headers once in, then the
body as it arrives, pulled (`read_chunk`, `read`) or pushed (`pipe`: each chunk handed to a sink inside
the connection's callback, no task switch per chunk), timed by the shared watchdog, bounded (past
`HIGH_WATER` unread bytes the connection stops reading until the reader catches up).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from llm_gateway.errors import BackendFailure, UpstreamProtocolError, UpstreamTimeout
from llm_gateway.upstream.base import UpstreamTimeouts
from llm_gateway.upstream.watchdog import Watchdog


class Connection(Protocol):
    """What an exchange needs of the connection carrying it (h1_client.py's `Connection`): pausing and resuming
    its reads, letting go of it, and dropping it mid-body. Declared here, so the exchange does not import
    the client that imports it."""

    transport: asyncio.Transport | None
    exchange: H1Response | None

    def drop(self) -> None: ...


HIGH_WATER = 1 << 20  # bytes of unread body before the connection stops reading from the engine


class Headers(dict[str, str]):
    """Response headers: names stored lower-case, looked up case-insensitively; repeats joined by ", "."""

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return dict.get(self, name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class H1Response:
    """One exchange: the status and headers once in, the body as it arrives."""

    __slots__ = (
        "_chunks",
        "_conn",
        "_deadline",
        "_eof",
        "_error",
        "_first_byte_by",
        "_idle",
        "_loop",
        "_paused",
        "_size",
        "_waiter",
        "_waiting_since",
        "_watchdog",
        "fed",
        "headers",
        "headers_in",
        "sink",
        "status",
    )

    def __init__(
        self, conn: Connection, t: UpstreamTimeouts, watchdog: Watchdog[H1Response], loop: asyncio.AbstractEventLoop
    ) -> None:
        now = loop.time()
        self._conn: Connection | None = conn
        self._loop = loop
        self._idle = t.idle_s
        self._deadline = now + t.total_s
        self._first_byte_by: float | None = now + t.first_byte_s
        self._watchdog = watchdog
        self._chunks: list[bytes] = []
        self._size = 0
        self._eof = False
        self._paused = False
        self._error: BackendFailure | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._waiting_since: float | None = None
        #: push mode (`pipe`): the sink each chunk goes to; the connection calls it itself (h1_client.py),
        #: so a relayed event costs no call here
        self.sink: Callable[[bytes], bool] | None = None
        #: a chunk was pushed since the watchdog's last tick, which clears it and times a silence from the last
        #: tick that found it set: a clock read per event saved for up to one tick (PERIOD_S) on the idle timeout
        #: (a flag set, not a count incremented: three bytecodes an event, not seven)
        self.fed = False
        self.headers = Headers()
        self.headers_in = False
        self.status = 0
        watchdog.add(self)

    # -- fed by the connection -----------------------------------------------------------------------
    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    def headers_done(self, status: int) -> None:
        self.status = status
        self.headers_in = True
        self._first_byte_by = None
        self._wake()

    def feed(self, data: bytes) -> None:
        sink = self.sink
        if sink is not None:  # push mode: the chunk is the sink's, here, with no task switch
            # (Connection.data_received runs a copy of this branch inline, one call less a relayed event)
            try:
                if sink(data):
                    self.fed = True
                    return
            except Exception as e:
                self.sink_failed(e)
                return
            self.unpipe()
            return
        self._chunks.append(data)
        self._size += len(data)
        if self._size > HIGH_WATER and not self._paused and self._conn is not None and self._conn.transport:
            self._paused = True
            self._conn.transport.pause_reading()
        self._wake()

    def unpipe(self) -> None:
        """The sink said stop: the task that piped carries on (pull mode)."""
        self.sink = None
        self._waiting_since = None
        self._wake()

    def sink_failed(self, e: Exception) -> None:
        """The sink's own failure: raised in the task that piped."""
        self.sink = None
        w, self._waiter = self._waiter, None
        if w is not None and not w.done():
            w.set_exception(e)

    def complete(self) -> None:
        self.sink = None
        self._waiting_since = None
        self._eof = True
        self._conn = None
        self._watchdog.active.discard(self)
        self._wake()

    def fail(self, err: BackendFailure) -> None:
        self.sink = None
        self._waiting_since = None
        if self._error is None and not self._eof:
            self._error = err
        self._watchdog.active.discard(self)
        self._wake()

    def check(self, now: float) -> None:
        first = self._first_byte_by
        if now > self._deadline:
            self._expire(UpstreamTimeout("the engine's response did not complete within the total timeout"))
        elif first is not None and now > first:
            self._expire(UpstreamTimeout("the engine sent nothing before its first byte within the configured timeout"))
        elif self._waiting_since is None:
            return
        elif self.fed:  # pushed chunks since the last tick: the silence starts now
            self.fed = False
            self._waiting_since = now
        elif now - self._waiting_since > self._idle:
            self._expire(UpstreamTimeout("the engine sent nothing between chunks of its response within the timeout"))

    def _expire(self, err: UpstreamTimeout) -> None:
        self.fail(err)
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.exchange = None
            conn.drop()

    def loop_time(self) -> float:
        return self._loop.time()

    # -- read by the gateway -------------------------------------------------------------------------
    async def wait_headers(self) -> None:
        while not self.headers_in:
            if self._error is not None:
                raise self._error
            self._waiter = self._loop.create_future()
            await self._waiter

    async def _more(self) -> None:
        self._waiting_since = self._loop.time()
        try:
            self._waiter = self._loop.create_future()
            await self._waiter
        finally:
            self._waiting_since = None

    def _take(self) -> bytes:
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        if self._paused:
            self._paused = False
            conn = self._conn
            if conn is not None and conn.transport is not None:
                conn.transport.resume_reading()
        return data

    def buffered(self) -> bool:
        """Is a chunk in hand (`read_chunk` answers without waiting)?"""
        return bool(self._chunks)

    async def read_chunk(self) -> bytes:
        while True:
            if self._chunks:
                return self._take()
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            await self._more()

    async def read(self, limit: int) -> bytes:
        length = self.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise UpstreamProtocolError(f"the engine's response is larger than {limit} bytes")
        parts: list[bytes] = []
        size = 0
        while chunk := await self.read_chunk():
            size += len(chunk)
            if size > limit:
                raise UpstreamProtocolError(f"the engine's response is larger than {limit} bytes")
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def pipe(self, sink: Callable[[bytes], bool]) -> asyncio.Future[None] | None:
        """Push mode: from now on each chunk goes to `sink(chunk)` as it arrives, inside the connection's
        callback, with no future and no task switch per chunk (the costliest Python part of a relayed
        event, bench/profile.sh); `sink` takes the chunk whatever it returns, and returns False to
        stop. The future it returns is done when piping stopped, the body ended or failed (then
        `read_chunk` says which), and raises what `sink` raised. None: there is something to read
        first (buffered chunks, the end, a failure): `read_chunk` it."""
        if self._chunks or self._eof or self._error is not None:
            return None
        self.sink = sink
        self._waiting_since = self._loop.time()
        w = self._waiter = self._loop.create_future()
        return w

    def close(self) -> None:
        self.sink = None
        self._watchdog.active.discard(self)
        conn, self._conn = self._conn, None
        if conn is not None and not self._eof:  # mid-body: drop the connection, the engine sees the client leave
            conn.exchange = None
            conn.drop()
