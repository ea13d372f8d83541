"""The request/response cycle the gateway's server runs: uvicorn's, with the app's answers written directly.

Each request's cycle is a `CoalescingCycle` (the protocol, hardened_protocol.py, makes it one): a whole answer
(`Call.respond`, whose start message says `COALESCE`) leaves in one write, its head held back until its body comes,
where uvicorn writes the head and the body apart: one send syscall per answer instead of two (bench/profile.sh: the
syscalls are most of what uvicorn costs here). `Call` writes its answers through `respond_now`, `start_now` and
`write_chunk(last=True)`: the bytes uvicorn's `send` would write, checked as it checks them, in one write, without
the ASGI messages, uvicorn's per-header loop and regexes or the capture (they fall back to `send` whenever it must
do something else). A stream's events are written by `write_chunk`, which frames and writes a chunk directly when
nothing else is pending, instead of an ASGI message and uvicorn's checks per event; `body_now` hands over a body
that has all arrived, as `receive` would, without its message and the waits it would make (three coroutines a
request). A client that goes away is told to the cycle's `on_disconnect` callback from the protocol's
`connection_lost`, where ASGI would need a task per request waiting on `receive()` for it. The app reaches these
through its `send` (the cycle's bound method: `send.__self__`), never through the scope: the cycle holds the scope,
and a scope holding the cycle's methods would make every request a reference cycle for the garbage collector (tens
of ms of pauses at a thousand requests a second, bench/). It subclasses uvicorn's private RequestResponseCycle
(from uvicorn_private.py, which lists the fields relied on here; tests/unit/test_uvicorn_private.py checks them,
tests/unit/test_http_protocol.py drives every override).

An answer that starts before the request's body has all arrived (an early 401, 408 or 413) says `connection:
close`, and the connection then closes by the protocol's lingering close, not uvicorn's plain one: the client,
perhaps still uploading, reads the answer instead of a reset, and cannot keep the connection by trickling the rest
of a body (hardened_protocol.py). The protocol is the cycle's `conn` while the request is being answered; through
it the app says that the request showed a valid key (`authenticated`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llm_gateway.http.uvicorn_private import HEADER_RE, HEADER_VALUE_RE, STATUS_LINE, RequestResponseCycle

#: the bytes uvicorn's `send` refuses in header names and values: its two regexes are single character
#: classes, so deleting these bytes (`translate`, a table lookup a byte) tells what a search would, at
#: half its cost
_NAME_REFUSED = bytes(b for b in range(256) if HEADER_RE.match(bytes((b,))))
_VALUE_REFUSED = bytes(b for b in range(256) if HEADER_VALUE_RE.match(bytes((b,))))

_SIZE_LINES_N = 4096
#: the size lines of the chunks of a stream's events, which are almost all shorter than this
_SIZE_LINES = tuple(b"%x\r\n" % n for n in range(_SIZE_LINES_N))
#: a body or chunk this long (a Response echoing an agent's tools and system prompt: tens of KB) goes to the socket
#: beside its head or framing (`writelines`: uvloop's writev), not copied into one buffer with them; shorter ones are
#: cheaper to copy than to send in pieces
WRITEV_BYTES = 16 * 1024

#: a key of an ASGI `http.response.start` message: hold the head back, write it with the first body
COALESCE = "llm_gateway.coalesce"


class _Capture:
    """Stands in for the transport while uvicorn's `send` runs: keeps what it writes, to write it as one."""

    __slots__ = ("parts", "real")

    def __init__(self, real: Any, parts: list[bytes] | None = None) -> None:
        self.real = real
        self.parts: list[bytes] = parts if parts is not None else []

    def write(self, data: bytes) -> None:
        self.parts.append(data)

    def writelines(self, data: Any) -> None:  # kept in order with the writes, as they are
        self.parts.extend(data)

    def flush(self) -> None:
        if self.parts:
            self.real.write(b"".join(self.parts))
            self.parts = []

    def close(self) -> None:
        self.flush()
        self.real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class _LingeringClose:
    """Stands in for the transport of an answer given before the request's body ended: its `close` is the
    protocol's lingering close."""

    __slots__ = ("close", "real")

    def __init__(self, real: Any, close: Callable[[], None]) -> None:
        self.real = real
        self.close = close

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


class CoalescingCycle(RequestResponseCycle):
    """uvicorn's request/response cycle; a response start that says `COALESCE` is written with the
    body message that follows it, in one write."""

    _held: list[bytes] | None = None
    #: called once when the client goes away before the answer is complete (set and cleared by the app)
    on_disconnect: Callable[[], None] | None = None
    #: `write_chunk` may frame and write a chunk itself: a chunked response started, not complete, its head not
    #: held, the client not gone (`_chunks_direct()`); one flag read per event instead of six, kept by what
    #: changes those: `start_now`, `_complete`, `send` and the protocol's `connection_lost`
    _direct = False
    #: the connection's protocol (hardened_protocol.GatewayProtocol) until the answer is complete; None otherwise
    conn: Any = None

    def authenticated(self) -> None:
        """The request showed a valid key: its connection leaves the cap of unauthenticated ones."""
        conn = self.conn
        if conn is not None:
            conn.authenticated()

    def _answer_starts(self) -> None:
        """An answer before the request's body has all arrived: the connection closes after it, lingering."""
        if self.more_body and self.conn is not None and not isinstance(self.transport, _LingeringClose):
            self.keep_alive = False
            self.transport = _LingeringClose(self.transport, self.conn.close_lingering)  # type: ignore[assignment]

    def _chunks_direct(self) -> bool:
        return (
            self.response_started
            and self.chunked_encoding is True
            and not self.response_complete
            and self._held is None
            and not self.disconnected
        )

    async def send(self, message: Any) -> None:
        try:
            await self._send(message)
        finally:
            self._direct = self._chunks_direct()
            if self.response_complete:
                self.conn = None  # no reference cycle left behind by an answered request

    async def _send(self, message: Any) -> None:
        if self.more_body and not self.response_started and message["type"] == "http.response.start":
            self._answer_starts()
        held = self._held
        if held is None and not (message["type"] == "http.response.start" and message.get(COALESCE)):
            await super().send(message)
            return
        self._held = None
        cap = _Capture(self.transport, held)
        self.transport = cap  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = cap.real
        if held is None:  # the head: held until the body
            self._held = cap.parts
        else:
            cap.flush()

    # -- the app's answers written directly (Call): what uvicorn's `send` writes, one write, no messages --
    def _head(self, status: int, headers: list[tuple[bytes, bytes]]) -> list[bytes] | None:
        """The status line and headers as uvicorn's `send` writes them, checked as it checks them; None when
        `send` must write them itself: the response started, the client gone, its socket full, the access
        log on, a 100-continue pending, a HEAD request, or the app's own framing or connection headers."""
        if (
            self.response_started
            or self.disconnected
            or self.flow.write_paused
            or self.access_log
            or self.waiting_for_100_continue
            or self.scope["method"] == "HEAD"
        ):
            return None
        if self.more_body:
            self._answer_starts()
        content = [STATUS_LINE[status]]
        # "name: value" lines joined in C (map over the pairs), not a Python loop over a dozen headers
        if self.default_headers:
            content += (b"\r\n".join(map(b": ".join, self.default_headers)), b"\r\n")
        if headers:
            content += (b"\r\n".join(map(b": ".join, headers)), b"\r\n")
            names, values = zip(*headers, strict=True)  # in C too, where two list comprehensions were
            joined = b"\n".join(names)
            all_names, all_values = b"".join(names), b"\t".join(values)
            if (
                len(all_names.translate(None, _NAME_REFUSED)) != len(all_names)
                or len(all_values.translate(None, _VALUE_REFUSED)) != len(all_values)
                or joined.find(b"connection") >= 0  # `find`, not `in`: see adapters/sse_relay.py
                or joined.find(b"transfer-encoding") >= 0
            ):
                return None  # uvicorn's send raises for a bad one, and reads the framing ones
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        self.response_started = True
        self.waiting_for_100_continue = False
        return content

    def _complete(self) -> None:
        self.response_complete = True
        self._direct = False
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()
        self.conn = None  # no reference cycle left behind by an answered request

    def respond_now(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole answer, its headers carrying its content-length, in one write; False: nothing written
        (`send` it)."""
        content = self._head(status, headers)
        if content is None:
            return False
        self.chunked_encoding = False
        self.expected_content_length = 0
        if len(body) < WRITEV_BYTES:
            content += (b"\r\n", body)
            self.transport.write(b"".join(content))
        else:
            content.append(b"\r\n")
            self.transport.writelines((b"".join(content), body))
        self._complete()
        return True

    def start_now(self, status: int, headers: list[tuple[bytes, bytes]], data: bytes, last: bool = False) -> bool:
        """The head of a chunked answer with its first part (if any), and its end when `last`, in one
        write; False: nothing written (`send` it)."""
        content = self._head(status, headers)
        if content is None:
            return False
        self.chunked_encoding = True
        self.expected_content_length = 0
        content.append(b"transfer-encoding: chunked\r\n\r\n")
        end = b"\r\n0\r\n\r\n" if last else b"\r\n"
        if len(data) >= WRITEV_BYTES:
            content.append(b"%x\r\n" % len(data))
            self.transport.writelines((b"".join(content), data, end))
        else:
            if data:
                content += (b"%x\r\n" % len(data), data, end)
            elif last:
                content.append(b"0\r\n\r\n")
            self.transport.write(b"".join(content))
        if last:
            self._complete()
        else:
            self._direct = True
        return True

    def body_now(self) -> bytes | None:
        """The request's whole body, taken as uvicorn's `receive` takes it, once it has all been parsed; None
        (nothing taken: `receive` it, with a timeout) while more is to come, with a 100-continue still owed
        (`receive` writes it), or once the client is gone or the answer complete (`receive` says disconnect)."""
        if self.more_body or self.waiting_for_100_continue or self.disconnected or self.response_complete:
            return None
        self.flow.resume_reading()  # as `receive` does: a body over uvicorn's high-water mark paused reading
        self.message_event.clear()
        body = bytes(self.body)
        self.body = bytearray()
        return body

    def write_chunk(self, data: bytes, last: bool = False) -> bool:
        """Write one chunk of a started chunked response now, framed as uvicorn's `send` frames it, without
        an ASGI message per event, and with `last` the response's end too (in the same write); False
        (nothing written) when `send` must do it: no response started or it is complete, not chunked, its
        head held, the client gone, or its socket's buffer full (`send` waits for it to drain)."""
        if not self._direct or self.flow.write_paused or not (data or last):
            return False
        if not last:
            n = len(data)
            if n < _SIZE_LINES_N:  # a chunk's size line from a table: cheaper than formatting it (bytes' % parses it)
                self.transport.write(_SIZE_LINES[n] + data + b"\r\n")
            elif n < WRITEV_BYTES:
                self.transport.write(b"".join((b"%x\r\n" % n, data, b"\r\n")))
            else:  # a large chunk (a Response frame echoing an agent's tools: tens of KB): its framing beside it
                self.transport.writelines((b"%x\r\n" % n, data, b"\r\n"))
            return True
        if len(data) >= WRITEV_BYTES:
            self.transport.writelines((b"%x\r\n" % len(data), data, b"\r\n0\r\n\r\n"))
        else:
            self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        self._complete()
        return True
