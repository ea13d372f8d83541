"""uvicorn's httptools protocol, hardened against slow and hostile clients.

Adds what uvicorn leaves out: a deadline for the request headers (a client that trickles bytes is
cut off with 408, holding no worker), a cap on header size (431, checked while the headers are
still arriving, before the parser buffers them), and a cap on open connections (503 and close).
The body has its own read timeout and size cap in `Call.read_body`.

Header counting restarts only when both the request was parsed to its end and its response is
complete: an app that answers early (401, 413) leaves the rest of the body to arrive, and those
bytes are body, not the next request's headers; once that body has ended, the header deadline
covers the idle connection again (uvicorn's keep-alive timer was cancelled by the body bytes).
This subclasses uvicorn's private HttpToolsProtocol, which is why uvicorn is pinned exactly
(constraints.txt) and why tests/unit/test_http_protocol.py drives every override fast.

Each request's cycle is a `CoalescingCycle`: a whole answer (`Call.respond`, whose start message
says `COALESCE`) leaves in one write, its head held back until its body comes, where uvicorn writes
the head and the body apart: one send syscall per answer instead of two (bench/profile.sh: the
syscalls are most of what uvicorn costs here). `Call` writes its answers through `respond_now`,
`start_now` and `write_chunk(last=True)`: the bytes uvicorn's `send` would write, checked as it checks
them, in one write, without the ASGI messages, uvicorn's per-header loop and regexes or the capture (they
fall back to `send` whenever it must do something else). A stream's events are written by `write_chunk`, which
frames and writes a chunk directly when nothing else is pending, instead of an ASGI message and
uvicorn's checks per event; `body_now` hands over a body that has all arrived, as `receive` would, without
its message and the waits it would make (three coroutines a request). A client that goes
away is told to the cycle's `on_disconnect` callback from the protocol's `connection_lost`, where ASGI
would need a task per request waiting on `receive()` for it. The app reaches
these through its `send` (the cycle's bound method: `send.__self__`), never through the scope: the
cycle holds the scope, and a scope holding the cycle's methods would make every request a reference
cycle for the garbage collector (tens of ms of pauses at a thousand requests a second, bench/).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)
from uvicorn.server import ServerState

_REASON = {
    400: b"Bad Request",
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def _response(status: int, code: str, message: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    return (
        b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
        % (status, _REASON[status], len(body))
    ) + body


LINGER_S = 2.0
LINGER_MAX_BYTES = 16 * 1024 * 1024


class _Refused(Exception):
    pass


#: the bytes uvicorn's `send` refuses in header names and values: its two regexes are single character
#: classes, so deleting these bytes (`translate`, a table lookup a byte) tells what a search would, at
#: half its cost
_NAME_REFUSED = bytes(b for b in range(256) if HEADER_RE.match(bytes((b,))))
_VALUE_REFUSED = bytes(b for b in range(256) if HEADER_VALUE_RE.match(bytes((b,))))

_SIZE_LINES_N = 4096
#: the size lines of the chunks of a stream's events, which are almost all shorter than this
_SIZE_LINES = tuple(b"%x\r\n" % n for n in range(_SIZE_LINES_N))

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

    def flush(self) -> None:
        if self.parts:
            self.real.write(b"".join(self.parts))
            self.parts = []

    def close(self) -> None:
        self.flush()
        self.real.close()

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

    async def _send(self, message: Any) -> None:
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

    def respond_now(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole answer, its headers carrying its content-length, in one write; False: nothing written
        (`send` it)."""
        content = self._head(status, headers)
        if content is None:
            return False
        self.chunked_encoding = False
        self.expected_content_length = 0
        content += (b"\r\n", body)
        self.transport.write(b"".join(content))
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
        if data:
            content += (b"%x\r\n" % len(data), data, b"\r\n")
        if last:
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
            # a chunk's size line from a table: cheaper than formatting it (bytes' % parses its format)
            self.transport.write((_SIZE_LINES[n] if n < _SIZE_LINES_N else b"%x\r\n" % n) + data + b"\r\n")
            return True
        self.transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        self._complete()
        return True


#: uvicorn's two loggers, looked up once: its `__init__` looks both up for every connection, each
#: `logging.getLogger` taking the logging module's lock (a third of what a new connection costs in
#: uvicorn's Python code, bench/README.md); a logger, once made, is never replaced, so these are the same objects
_ERROR_LOGGER = logging.getLogger("uvicorn.error")
_ACCESS_LOGGER = logging.getLogger("uvicorn.access")


class GatewayProtocol(HttpToolsProtocol):
    max_connections = 16384
    header_timeout_s = 15.0
    max_header_bytes = 32 * 1024

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # HttpToolsProtocol.__init__ of uvicorn 0.54.0 (pinned, constraints.txt), field for field, but for
        # the loggers looked up once (above); tests/unit/test_http_protocol.py checks that the two agree
        if not config.loaded:
            config.load()
        self.config = config
        self.app = config.loaded_app
        self.loop = _loop or asyncio.get_event_loop()
        self.logger = _ERROR_LOGGER
        self.access_logger = _ACCESS_LOGGER
        self.access_log = _ACCESS_LOGGER.hasHandlers()
        self.parser = httptools.HttpRequestParser(self)
        self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.ws_protocol_class = config.ws_protocol_class
        self.root_path = config.root_path
        self.asgi_version = config.asgi_version
        self.limit_concurrency = config.limit_concurrency
        self.app_state = app_state
        self.timeout_keep_alive_task = None
        self.timeout_keep_alive = config.timeout_keep_alive
        self.server_state = server_state
        self.connections = server_state.connections
        self.tasks = server_state.tasks
        self.transport = None  # type: ignore[assignment]
        self.flow = None  # type: ignore[assignment]
        self.server = None
        self.client = None
        self.scheme = None
        self.pipeline = deque()
        self.scope = None  # type: ignore[assignment]
        self.headers = None  # type: ignore[assignment]
        self.expect_100_continue = False
        self.cycle = None  # type: ignore[assignment]
        # the gateway's own
        self._awaiting_headers = True
        self._header_bytes = 0
        self._message_parsed = False  # the current request has been parsed to its end
        self._response_done = False  # ... and answered
        self._header_timer: asyncio.TimerHandle | None = None
        self._draining = False
        self._drained = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            self._refuse(503, "too_many_connections", "The gateway has too many open connections; retry shortly.")
            return
        self._arm()

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_header_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._awaiting_headers and not self.transport.is_closing():
            if self._header_bytes:
                self._refuse(408, "request_timeout", "The request headers did not arrive in time.")
            else:
                self.transport.close()  # an idle connection that never sent a request

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer and close, lingering: what the client is still sending is read and thrown away for a
        moment, so that it reads the answer instead of a connection reset (as nginx's lingering_close)."""
        self._disarm()
        transport = self.transport
        if transport.is_closing() or self._draining:
            return
        transport.write(_response(status, code, message))
        self._draining = True
        try:
            transport.write_eof()
        except (OSError, NotImplementedError, RuntimeError):
            transport.close()
            return
        self.loop.call_later(LINGER_S, transport.close)

    def send_400_response(self, msg: str) -> None:
        """A request the HTTP parser rejects (bad framing, bogus Content-Length): the OpenAI envelope,
        not uvicorn's plain-text answer."""
        self._refuse(400, "invalid_http", f"The HTTP request could not be parsed: {msg}")

    def data_received(self, data: bytes) -> None:
        if self._draining:
            self._drained += len(data)
            if self._drained > LINGER_MAX_BYTES:
                self.transport.close()
            return
        if not self._awaiting_headers:
            super().data_received(data)
            return
        self._header_bytes += len(data)
        super().data_received(data)
        if self._awaiting_headers and self._header_bytes > self.max_header_bytes:
            self._refuse(
                431,
                "request_header_fields_too_large",
                f"The request headers are larger than {self.max_header_bytes} bytes.",
            )

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._awaiting_headers = True
        self._message_parsed = self._response_done = False
        self._arm()

    def _parsed_header_bytes(self) -> int:
        """The size of the request's headers as parsed: the URL, and each header with its ": " and CRLF."""
        return len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)

    def on_headers_complete(self) -> None:
        self._awaiting_headers = False
        received, self._header_bytes = self._header_bytes, 0
        self._disarm()
        # headers over the cap that all came in one read (a read that ended with them is refused in
        # `data_received`); counted only when the reads since the request began could hold that many
        if received > self.max_header_bytes and self._parsed_header_bytes() > self.max_header_bytes:
            self._refuse(
                431,
                "request_header_fields_too_large",
                f"The request headers are larger than {self.max_header_bytes} bytes.",
            )
            raise _Refused  # stops the parser; uvicorn's 400 for it is a no-op on a closing transport
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is not None and type(cycle) is RequestResponseCycle:
            cycle.__class__ = CoalescingCycle  # before its task runs: `send` is looked up when the app starts

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._message_parsed = True
        if self._response_done:  # answered before its body ended: now the connection is idle
            self._await_next_request()
            self._arm()

    def on_response_complete(self) -> None:
        self._response_done = True
        if self._message_parsed:
            self._await_next_request()
        super().on_response_complete()

    def _await_next_request(self) -> None:
        self._awaiting_headers = True
        self._header_bytes = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        cycle = self.cycle
        if cycle is not None and cycle.disconnected:
            cycle._direct = False  # type: ignore[attr-defined]  # a CoalescingCycle's
            left = getattr(cycle, "on_disconnect", None)
            if left is not None:
                cycle.on_disconnect = None  # type: ignore[attr-defined]  # a CoalescingCycle's
                left()


def protocol_class(max_connections: int, header_timeout_s: float, max_header_bytes: int) -> type[GatewayProtocol]:
    return type(
        "ConfiguredGatewayProtocol",
        (GatewayProtocol,),
        {
            "max_connections": max_connections,
            "header_timeout_s": header_timeout_s,
            "max_header_bytes": max_header_bytes,
        },
    )
