"""Raw HTTP/1.1 streaming on an asyncio.Protocol, for board_client.py's paced-stream modes: one streamed request
per connection, its chunked body decoded here and its SSE frames checked by stream_client.SSEReader, each read
timed (time to first body byte, the gaps between reads). Several times cheaper per read than aiohttp, so the
load core reads tens of thousands of paced events a second.
"""

from __future__ import annotations

import asyncio
import time

import stream_client as sc


class StreamStats:
    def __init__(self) -> None:
        self.ttfts: list[float] = []
        self.gaps: list[float] = []  # every gap between reads after the first byte, good streams only
        self.max_gaps: list[float] = []  # per good stream
        self.errors: dict[str, int] = {}
        self.open = self.peak_open = self.done = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1


class Dechunk:
    """Incremental HTTP/1.1 chunked-body decoder (`done` once the last chunk came)."""

    __slots__ = ("_buf", "_left", "done")

    def __init__(self) -> None:
        self._buf = b""
        self._left = 0  # > 0: data bytes still due in this chunk; -1: the CRLF after a chunk's data
        self.done = False

    def feed(self, data: bytes) -> bytes:
        buf, out, i = self._buf + data if self._buf else data, [], 0
        while not self.done:
            if self._left > 0:
                take = min(self._left, len(buf) - i)
                out.append(buf[i : i + take])
                i += take
                self._left -= take
                if self._left:
                    break
                self._left = -1
            if self._left == -1:
                if len(buf) - i < 2:
                    break
                i, self._left = i + 2, 0
            nl = buf.find(b"\r\n", i)
            if nl < 0:
                break
            size = int(buf[i:nl].split(b";")[0], 16)
            i = nl + 2
            if size == 0:
                self.done = True
            self._left = size
        self._buf = buf[i:]
        return b"".join(out)


class StreamConn(asyncio.Protocol):
    """One streamed request on its own connection: headers, then the SSE body, timed per read."""

    def __init__(self, req: bytes, st: StreamStats, tokens: int, done: asyncio.Future[None]) -> None:
        self.req, self.st, self.tokens, self.done = req, st, tokens, done
        self.head = b""
        self.status = 0
        self.body: Dechunk | None = None
        self.sse = sc.SSEReader("chat")
        self.gaps: list[float] = []
        self.t0 = self.first = self.last = 0.0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not a subclass
        self.t0 = time.perf_counter()
        transport.write(self.req)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        if self.body is None:
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.head[:end].lower(), self.head[end + 4 :]
            self.status = int(head[9:12])
            if self.status != 200 or b"text/event-stream" not in head or b"chunked" not in head:
                self.finish(f"status_{self.status}" if self.status != 200 else "not_chunked_event_stream")
                return
            self.body = Dechunk()
            if not data:
                return
        if self.first == 0.0:
            self.first = now
            self.st.open += 1
            self.st.peak_open = max(self.st.peak_open, self.st.open)
        else:
            self.gaps.append(now - self.last)
        self.last = now
        self.sse.feed(self.body.feed(data))
        if self.body.done:
            kind = self.sse.finish()
            self.finish(kind or ("lost_frames" if self.sse.deltas != self.tokens else None))

    def connection_lost(self, exc: Exception | None) -> None:
        self.finish("connection_lost")

    def finish(self, error: str | None) -> None:
        if self.done.done():
            return
        st = self.st
        if self.first:
            st.open -= 1
        if error:
            st.error(error)
        else:
            st.ttfts.append(self.first - self.t0)
            st.gaps += self.gaps
            st.max_gaps.append(max(self.gaps, default=0.0))
            st.done += 1
        self.done.set_result(None)
        if self.transport is not None:
            self.transport.close()
