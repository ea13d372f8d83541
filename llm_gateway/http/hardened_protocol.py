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

Each request's cycle is a `CoalescingCycle` (direct_cycle.py: the app's answers written directly); the
protocol makes uvicorn's cycle one before its task runs, and tells it when the client has gone.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from llm_gateway.http.direct_cycle import CoalescingCycle

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
