"""A small HTTP/1.1 server on raw asyncio, built for byte-exact responses.

Owns request parsing (Content-Length and chunked bodies, ``Expect: 100-continue``,
keep-alive, pipelined requests handled one at a time), response writing (status line and
headers exactly as given, chunked framing, flow control) and the ways a connection can
end: normal close, idle keep-alive timeout, and abort with RST (SO_LINGER 0).
A client that goes away cancels the task serving its request; the task's ``finally``
blocks do the bookkeeping. Nothing here knows about LLM engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import parse_qsl, unquote

MAX_HEAD = 64 * 1024
MAX_BODY = 64 * 1024 * 1024
HIGH_WATER = 256 * 1024
INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)


class BadRequest(Exception):
    """The bytes on the wire are not a request we can parse."""


def reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


@dataclass(eq=False)
class Request:
    """One parsed request plus the state of its response."""

    method: str
    target: str
    path: str
    query: dict[str, str]
    version: str
    headers: dict[str, str]
    body: bytes
    conn: Connection
    keep_alive: bool
    started: bool = False
    finished: bool = False
    chunked: bool = False
    status: int = 0
    #: Set when the emulator itself ends the connection (faults), so it is not
    #: counted as a client disconnect.
    server_closed: bool = False
    state: dict[str, Any] = field(default_factory=dict)

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason(status)}"]
        lines.extend(f"{k}: {v}" for k, v in headers)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """Write a complete response; ``headers`` must carry Content-Length (or none at all)."""
        self.status = status
        self.started = True
        if self.method == "HEAD":
            body = b""
        self.conn.write(self._head(status, headers) + body)
        self.finished = True
        if any(k.lower() == "connection" and v.lower() == "close" for k, v in headers):
            self.keep_alive = False
        await self.conn.drain()

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Write the head of a streamed response (``Transfer-Encoding: chunked`` expected)."""
        self.status = status
        self.started = True
        self.chunked = any(k.lower() == "transfer-encoding" and v.lower() == "chunked" for k, v in headers)
        self.conn.write(self._head(status, headers))
        await self.conn.drain()

    async def write(self, data: bytes) -> None:
        """Write one piece of a streamed body, framed as a chunk when chunked."""
        if self.write_now(data):
            await self.conn.drain()

    def write_now(self, data: bytes) -> bool:
        """Write without waiting; True when the caller should ``await conn.drain()``."""
        if data:
            if self.chunked:
                self.conn.write(b"%x\r\n%b\r\n" % (len(data), data))
            else:
                self.conn.write(data)
        return self.conn.must_drain

    def write_raw(self, data: bytes) -> None:
        self.conn.write(data)

    async def end(self) -> None:
        if self.chunked and not self.finished:
            self.conn.write(b"0\r\n\r\n")
        self.finished = True
        await self.conn.drain()

    def abort(self) -> None:
        """Reset the connection (RST): SO_LINGER 0, then abort."""
        self.server_closed = True
        self.conn.abort()

    def close(self) -> None:
        """Close the connection cleanly (FIN) after what was written."""
        self.server_closed = True
        self.keep_alive = False
        self.conn.close(killed=True)


Handler = Callable[[Request], Awaitable[None]]


class Connection(asyncio.Protocol):
    """One client connection; serves its requests one after the other."""

    def __init__(
        self,
        handler: Handler,
        on_open: Callable[[Connection], None],
        on_close: Callable[[Connection], None],
        idle_timeout: Callable[[], float | None],
    ) -> None:
        self._handler = handler
        self._on_open = on_open
        self._on_close = on_close
        self._idle_timeout = idle_timeout
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._task: asyncio.Task[None] | None = None
        self._paused: asyncio.Future[None] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._continue_sent = False
        self.closed = False
        self.server_killed = False  # the emulator ended this connection on purpose
        self.requests_served = 0

    # ---- asyncio.Protocol -------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.transport.set_write_buffer_limits(high=HIGH_WATER)
        self._on_open(self)
        self._arm_idle()

    def data_received(self, data: bytes) -> None:
        self._buf += data
        if self._task is None:
            self._dispatch()

    def eof_received(self) -> bool | None:
        return None  # a client that half-closes is treated as gone

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self._idle is not None:
            self._idle.cancel()
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._on_close(self)

    def pause_writing(self) -> None:
        if self._paused is None or self._paused.done():
            self._paused = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._paused is not None and not self._paused.done():
            self._paused.set_result(None)

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The task serving the current request, if any."""
        return self._task

    # ---- writing ----------------------------------------------------------
    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    @property
    def must_drain(self) -> bool:
        fut = self._paused
        return fut is not None and not fut.done() and not self.closed

    async def drain(self) -> None:
        fut = self._paused
        if fut is not None and not fut.done() and not self.closed:
            await fut

    def abort(self) -> None:
        if self.transport is None or self.closed:
            return
        self.server_killed = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    def close(self, killed: bool = False) -> None:
        if self.transport is not None and not self.closed:
            self.server_killed = self.server_killed or killed
            self.transport.close()

    # ---- request cycle ----------------------------------------------------
    def _arm_idle(self) -> None:
        timeout = self._idle_timeout()
        if timeout is None or timeout <= 0 or self.closed:
            return
        loop = asyncio.get_running_loop()
        self._idle = loop.call_later(timeout, self._idle_expired)

    def _idle_expired(self) -> None:
        if self._task is None and not self._buf:
            self.close()

    def _dispatch(self) -> None:
        if self.closed or self._task is not None:
            return
        try:
            req = self._parse()
        except BadRequest as exc:
            body = str(exc).encode()
            self.write(
                b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (len(body), body)
            )
            self.close()
            return
        if req is None:
            return
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._task = asyncio.get_running_loop().create_task(self._serve(req))

    async def _serve(self, req: Request) -> None:
        try:
            await self._handler(req)
        except asyncio.CancelledError:
            pass
        except Exception:  # a bug in an engine module: answer like uvicorn does, keep serving
            traceback.print_exc()
            if not req.started:
                self.write(INTERNAL_ERROR)
            req.keep_alive = False
        finally:
            self._task = None
            self.requests_served += 1
            if not self.closed:
                if not req.keep_alive or not req.finished:
                    self.close()
                elif self._buf:
                    asyncio.get_running_loop().call_soon(self._dispatch)
                else:
                    self._arm_idle()

    def _parse(self) -> Request | None:
        buf = self._buf
        while buf.startswith(b"\r\n"):  # tolerate stray CRLF between requests
            del buf[:2]
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if len(buf) > MAX_HEAD:
                raise BadRequest("request head too large")
            return None
        head = bytes(buf[:end]).decode("latin-1")
        lines = head.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            raise BadRequest("malformed request line")
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise BadRequest("malformed header line")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = _dechunk(buf, start)
            if parsed is None:
                self._maybe_continue(headers)
                return None
            body, consumed = parsed
        else:
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                raise BadRequest("bad content-length") from None
            if length < 0 or length > MAX_BODY:
                raise BadRequest("bad content-length")
            if len(buf) < start + length:
                self._maybe_continue(headers)
                return None
            body, consumed = bytes(buf[start : start + length]), start + length
        del buf[:consumed]
        self._continue_sent = False
        path, _, qs = target.partition("?")
        conn_hdr = headers.get("connection", "").lower()
        keep = "close" not in conn_hdr if version == "HTTP/1.1" else "keep-alive" in conn_hdr
        return Request(
            method=method.upper(),
            target=target,
            path=unquote(path) or "/",
            query=dict(parse_qsl(qs, keep_blank_values=True)),
            version=version,
            headers=headers,
            body=body,
            conn=self,
            keep_alive=keep,
        )

    def _maybe_continue(self, headers: dict[str, str]) -> None:
        if not self._continue_sent and headers.get("expect", "").lower() == "100-continue":
            self._continue_sent = True
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _dechunk(buf: bytearray, pos: int) -> tuple[bytes, int] | None:
    """Decode a chunked body starting at ``pos``; None while incomplete."""
    out = bytearray()
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return None
        size_txt = bytes(buf[pos:eol]).split(b";", 1)[0].strip()
        try:
            size = int(size_txt, 16)
        except ValueError:
            raise BadRequest("bad chunk size") from None
        pos = eol + 2
        if size == 0:
            end = buf.find(b"\r\n\r\n", pos - 2)
            if end < 0:
                return None
            return bytes(out), end + 4
        if len(buf) < pos + size + 2:
            return None
        out += buf[pos : pos + size]
        pos += size + 2
        if len(out) > MAX_BODY:
            raise BadRequest("body too large")
