"""uvicorn's httptools protocol, hardened against slow and hostile clients.

Adds what uvicorn leaves out: a deadline for the request headers (a client that trickles bytes is
cut off with 408, holding no worker), a cap on header size (431, checked while the headers are
still arriving, before the parser buffers them), and a cap on open connections (503 and close).
The body has its own read timeout and size cap in `Call.read_body` (the admin API's in its gate).

Every state of a connection has a deadline: waiting for a request's headers (`header_timeout_s`, which
also closes a connection that never sends a byte), idle between requests (uvicorn's keep-alive timer),
the body (the app's read timeout), and after an answer that left before the request's body had all
arrived (401, 408, 413, ...): that answer says `connection: close` (direct_cycle.py) and the connection
closes after a short linger, whatever the client sends next, where uvicorn would wait for the rest of
a body that may never come (red-team H4).

Connections that have not yet shown a key have a cap of their own (`max_unauthenticated`, from
`server.max_unauthenticated_connections`), below `max_connections`: a new connection past it drops the
oldest of them (one not in the middle of a request, if any), so parked connections can never fill
`max_connections` and starve keyed clients. A connection counts as authenticated from the moment a request
on it presents a valid key (`Call.authenticated`, or the admin gate's check of an admin key).

This subclasses uvicorn's private HttpToolsProtocol (imported, with every other private part of uvicorn the
gateway uses, from uvicorn_private.py, which lists what it relies on; tests/unit/test_uvicorn_private.py checks
that list, tests/unit/test_http_protocol.py drives every override fast).

Each request's cycle is a `CoalescingCycle` (direct_cycle.py: the app's answers written directly); the
protocol makes uvicorn's cycle one before its task runs (`uvicorn_private.adopt_cycle`: why a class swap), and
tells it when the client has gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httptools
import orjson
from uvicorn import Config

from llm_gateway.http.direct_cycle import CoalescingCycle
from llm_gateway.http.uvicorn_private import HIGH_WATER_LIMIT, HttpToolsProtocol, ServerState, adopt_cycle

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


#: uvicorn's two loggers, looked up once: its `__init__` looks both up for every connection, each
#: `logging.getLogger` taking the logging module's lock (a third of what a new connection costs in
#: uvicorn's Python code, bench/README.md); a logger, once made, is never replaced, so these are the same objects
_ERROR_LOGGER = logging.getLogger("uvicorn.error")
_ACCESS_LOGGER = logging.getLogger("uvicorn.access")


class GatewayProtocol(HttpToolsProtocol):
    max_connections = 16384
    max_unauthenticated = 1024
    header_timeout_s = 15.0
    max_header_bytes = 32 * 1024
    #: the connections of this server that have not shown a key yet, oldest first (a dict: ordered, O(1)
    #: removal); each configured class (`protocol_class`) has its own
    unauthenticated: dict[GatewayProtocol, None] = {}  # replaced per class by protocol_class

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        # HttpToolsProtocol.__init__ of uvicorn 0.54 (uvicorn_private.PROTOCOL_STATE), field for field, but for
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
        unauthenticated = self.unauthenticated
        if len(unauthenticated) >= self.max_unauthenticated:
            self._drop_oldest_unauthenticated()
        unauthenticated[self] = None
        self._arm()

    def _drop_oldest_unauthenticated(self) -> None:
        """Make room for a new connection among those that showed no key: drop the oldest that is not in the
        middle of a request (parked on its headers, idle, lingering), else the oldest of all. Aborted, not
        closed: a client that reads nothing would keep a closed connection (and its slot) until its unsent
        answer drained."""
        unauthenticated = self.unauthenticated
        victim = next(iter(unauthenticated))
        for conn in unauthenticated:
            cycle = conn.cycle
            if cycle is None or cycle.response_complete:
                victim = conn
                break
        del unauthenticated[victim]
        # out of the server's connections now, not when the loop reports it lost: a burst of new connections
        # taken in one loop iteration (accept_drain.py) would otherwise count every one it dropped
        self.connections.discard(victim)
        victim._disarm()
        victim.transport.abort()

    def authenticated(self) -> None:
        """A request on this connection showed a valid key: it no longer counts against the cap of the
        unauthenticated ones."""
        self.unauthenticated.pop(self, None)

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
        """Answer and close, lingering (`close_lingering`)."""
        if self.transport.is_closing() or self._draining:
            return
        self.transport.write(_response(status, code, message))
        self.close_lingering()

    def close_lingering(self) -> None:
        """Close after what was written: what the client is still sending is read and thrown away for a
        moment, so that it reads the answer instead of a connection reset (as nginx's lingering_close)."""
        self._disarm()
        transport = self.transport
        if transport.is_closing() or self._draining:
            return
        self._draining = True
        self._unset_keepalive_if_required()
        try:
            transport.write_eof()
        except (OSError, NotImplementedError, RuntimeError):
            transport.close()
            return
        self.loop.call_later(LINGER_S, self._end_linger)

    def _end_linger(self) -> None:
        transport = self.transport
        if transport.is_closing():
            return
        if transport.get_write_buffer_size():
            transport.abort()  # the client read nothing of the answer in all that time
        else:
            transport.close()

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
        self._arm()  # bytes of a request's head (they cancelled uvicorn's keep-alive timer): this deadline guards them
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
        if cycle is not None and adopt_cycle(cycle, CoalescingCycle):  # before its task runs
            cycle.conn = self  # for early answers, and to be told the request showed a valid key

    def on_body(self, body: bytes) -> None:
        """uvicorn's, except that the body's first piece is kept as it came (a `bytes`), not copied into the
        cycle's bytearray: a body that arrives in one piece, as most do, reaches the app without a copy (the
        cycle's `body_now` and uvicorn's `receive` take it with `bytes(...)`, which returns a `bytes` itself).
        A second piece makes it a bytearray, as uvicorn's would be (issue 36: two copies of a 74 KB agent
        request, ~150k instructions of its ~2.5 M)."""
        cycle = self.cycle
        if (self.parser.should_upgrade() and self._should_upgrade()) or cycle.response_complete:
            return
        held: bytes | bytearray = cycle.body
        if not held:
            cycle.body = held = body  # type: ignore[assignment]  # read only by bytes(...) and len(...)
        elif type(held) is bytes:
            cycle.body = held = bytearray(held)
            held += body
        else:
            held += body
        if len(held) > HIGH_WATER_LIMIT:
            self.flow.pause_reading()
        cycle.message_event.set()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._message_parsed = True
        if self._response_done:  # answered before its body ended: now the connection is idle
            self._await_next_request()
            self._arm()

    def on_response_complete(self) -> None:
        self._response_done = True
        if self._draining:  # answered early, closing: no keep-alive, no next request
            self.server_state.total_requests += 1
            return
        if self._message_parsed:
            self._await_next_request()
        super().on_response_complete()

    def _await_next_request(self) -> None:
        self._awaiting_headers = True
        self._header_bytes = 0

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.unauthenticated.pop(self, None)
        super().connection_lost(exc)
        cycle = self.cycle
        if not isinstance(cycle, CoalescingCycle):  # none yet, or one that is not the gateway's (an upgrade)
            return
        cycle.conn = None
        if cycle.disconnected:
            cycle._direct = False
            left = cycle.on_disconnect
            if left is not None:
                cycle.on_disconnect = None
                left()


def protocol_class(
    max_connections: int, header_timeout_s: float, max_header_bytes: int, max_unauthenticated: int | None = None
) -> type[GatewayProtocol]:
    """The protocol of one server, with its limits and its own set of unauthenticated connections."""
    return type(
        "ConfiguredGatewayProtocol",
        (GatewayProtocol,),
        {
            "max_connections": max_connections,
            "max_unauthenticated": max_unauthenticated or max(1, max_connections // 2),
            "header_timeout_s": header_timeout_s,
            "max_header_bytes": max_header_bytes,
            "unauthenticated": {},
        },
    )
