"""A small HTTP/1.1 client for engines: asyncio protocols, llhttp's parser (httptools), a keep-alive pool.

Why not aiohttp: on the gateway's hot path aiohttp's request and response objects (URL and header
multidicts, payload writers, stream readers, timer contexts) cost about a quarter of the gateway's CPU
per request (bench/profile.sh), for features the gateway never uses against an engine: redirects,
cookies, compression, proxies, multipart. This client does only what the gateway needs: one request
per connection at a time, the request written in one `write` (a body of `WRITEV_BYTES` or more, or a `Spliced`
one, beside its head in one `writelines`: uvloop's writev, not a copy of a coding agent's 74 KB into one buffer),
the response parsed by httptools (llhttp, the parser Node.js uses; uvicorn already depends on it), body bytes
handed over as they arrive without copies, connections kept per origin (scheme, host, port) and reused while the engine
keeps them alive. A request that says `Connection: close` (an adapter asks for that where its engine closes
the connection after such an answer anyway) never returns its connection to the pool. A response holds its
connection until its body ends or `close()` drops it, so an engine sees a client that left (and stops
generating) at once.

Timeouts follow the gateway's contract (upstream/base.py): `connect_s` for the TCP connect,
`first_byte_s` until the status line and headers, `idle_s` between body chunks while someone waits
for them, `total_s` for the whole exchange. One watchdog task (four checks a second) times every open
exchange instead of a timer per request or per chunk. Failures become the gateway's errors where they
happen: no connection is `ConnectFailed` (the backend is down), a connection closed before an answer
is `UpstreamUnreachable`, one closed mid-body is `StreamInterrupted`, a reply that is not HTTP is
`UpstreamProtocolError`. A request that met a kept-alive connection's close before any byte of an answer is
sent once more on a new connection, whatever its method: no byte of the engine's came, so nothing of it
reached anyone, and the request is the same again. The buffer of a body nobody reads is bounded: past
`HIGH_WATER` bytes the connection stops reading (TCP pushes back on the engine) until the reader catches up.
The exchange itself (status, headers, the body pulled or pushed) is h1_response.py; the one timer task
for every open exchange is watchdog.py, shared with the aiohttp client.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

import httptools

from llm_gateway.errors import (
    BackendFailure,
    ConnectFailed,
    StreamInterrupted,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from llm_gateway.upstream.base import POOL_IDLE_S, UpstreamTimeouts
from llm_gateway.upstream.h1_response import HIGH_WATER, H1Response, Headers
from llm_gateway.upstream.watchdog import Watchdog
from llm_gateway.wire.client_body import Body, Spliced

__all__ = ["HIGH_WATER", "H1Response", "H1Upstream", "Headers"]

MAX_HEADER_BYTES = 64 * 1024
#: a request body this long goes to the socket beside its head (`writelines`), not joined with it: a copy of a
#: coding agent's 74 KB costs more than a second buffer in one writev; a shorter one is cheaper joined
WRITEV_BYTES = 16 * 1024


class _ReusedConnectionClosed(UpstreamUnreachable):
    """A kept-alive connection closed before a byte of the answer came: the engine closed it as idle while the
    request was on its way, or had closed it after its last answer without saying so (a race no pool can rule
    out: the close is in flight when the connection is taken). `send` sends the request once more on a new
    connection, POSTs included. A generation is safe to send again here: no engine byte came, so the client
    has nothing of this attempt, whatever else it has been sent (a queued stream's 200 and comments), and an
    engine that had taken the request and died refuses the new connection (`ConnectFailed`: the backend is
    marked down). This never leaves this module."""


class _Origin:
    """One engine address: how to reach it and its idle keep-alive connections."""

    __slots__ = ("host", "host_header", "idle", "port", "ssl")

    def __init__(self, host: str, port: int, host_header: bytes, tls: ssl.SSLContext | None) -> None:
        self.host, self.port, self.host_header, self.ssl = host, port, host_header, tls
        #: insertion-ordered, so `popitem()` is the most recently used; a dict, so a connection the engine
        #: closes leaves it in O(1) (thousands close together when an engine's keep-alive runs out)
        self.idle: dict[Connection, None] = {}


class Connection(asyncio.Protocol):
    """One TCP connection to an engine, carrying at most one exchange at a time."""

    __slots__ = (
        "_body",
        "_header_bytes",
        "_more",
        "closed",
        "exchange",
        "idle_since",
        "origin",
        "parser",
        "reusable",
        "transport",
        "until_close",
    )

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.exchange: H1Response | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.until_close = False  # the body has neither a length nor chunks: it ends with the connection
        self.reusable = True  # False: the exchange at hand said `Connection: close`, the connection ends with it
        self._header_bytes = 0
        self.idle_since = 0.0
        #: the body parsed from the read at hand, handed to the exchange as one piece when the read is parsed
        #: (a busy gateway reads several of an engine's chunks at once; one feed, one relayed write): its first
        #: chunk, and the chunks after it (a read of one chunk, the usual one, makes no list calls)
        self._body: bytes | None = None
        self._more: list[bytes] = []

    # -- asyncio.Protocol -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:  # bytes nobody asked for on an idle connection: it cannot be reused
            self.drop()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._flush_body()  # what came before the fault was the engine's
            self._fail(UpstreamProtocolError(f"the engine sent an invalid HTTP response: {e}"))
            return
        piece = self._body
        if piece is not None:  # `_flush_body` and the exchange's `feed`, inline: once per read of a stream
            self._body = None
            more = self._more
            if more:
                piece = b"".join((piece, *more))
                more.clear()
            ex = self.exchange
            if ex is None:
                return
            sink = ex.sink
            if sink is None:
                ex.feed(piece)
                return
            # H1Response.feed's push branch, copied here on purpose: a call less per relayed event; keep the two alike
            try:
                if sink(piece):
                    ex.fed = True
                    return
            except Exception as e:
                ex.sink_failed(e)
                return
            ex.unpipe()

    def _flush_body(self) -> None:
        data = self._body
        if data is not None:
            self._body = None
            more = self._more
            if more:
                data = b"".join((data, *more))
                more.clear()
            ex = self.exchange
            if ex is not None:
                ex.feed(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        ex = self.exchange
        if ex is not None:
            self.exchange = None
            if ex.headers_in and self.until_close and exc is None:
                ex.complete()
            elif ex.headers_in:
                ex.fail(StreamInterrupted("the engine closed the connection in the middle of its response"))
            elif self.idle_since and not self._header_bytes:  # kept alive before, and nothing of an answer
                ex.fail(_ReusedConnectionClosed("the engine closed the connection without answering"))
            else:
                ex.fail(UpstreamUnreachable("the engine closed the connection without answering"))
        self.origin.idle.pop(self, None)
        # the parser and the transport point back at this protocol: let go of both, so a closed connection
        # is freed by its refcount, not left in reference cycles for the collector (thousands per round
        # of bench/streams.py grew the RSS)
        self.parser = None  # type: ignore[assignment]
        self.transport = None

    # -- httptools callbacks -------------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > MAX_HEADER_BYTES:
            raise httptools.HttpParserError("the response headers are too large")
        ex = self.exchange
        if ex is None:
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = dict.get(ex.headers, key)
        dict.__setitem__(ex.headers, key, text if old is None else old + ", " + text)

    def on_headers_complete(self) -> None:
        ex = self.exchange
        if ex is None:
            return
        status = self.parser.get_status_code()
        if status < 200:  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            ex.headers.clear()
            return
        h = ex.headers
        self.until_close = dict.get(h, "content-length") is None and "chunked" not in (
            dict.get(h, "transfer-encoding") or ""
        )
        ex.headers_done(status)

    def on_body(self, body: bytes) -> None:
        if self.exchange is not None:
            if self._body is None:
                self._body = body
            else:
                self._more.append(body)

    def on_message_complete(self) -> None:
        ex = self.exchange
        if ex is None or not ex.headers_in:
            return
        if self._body is not None:
            self._flush_body()
            if self.exchange is not ex:  # the exchange's sink let go of it while taking the body
                return
        self.exchange = None
        keep = self.reusable and self.parser.should_keep_alive() and not self.until_close
        ex.complete()
        if keep and not self.closed:
            self._header_bytes = 0
            self.idle_since = ex.loop_time()
            self.origin.idle[self] = None
        else:
            self.drop()

    # -- the client's side ---------------------------------------------------------------------------
    def start(
        self, exchange: H1Response, request: bytes | tuple[bytes | memoryview, ...], reusable: bool = True
    ) -> None:
        """`request`: its bytes, or its head and a large body's pieces, written together without joining them."""
        self.exchange = exchange
        self._header_bytes = 0
        self.reusable = reusable
        if isinstance(request, bytes):
            self.transport.write(request)  # type: ignore[union-attr]  # set once connected
        else:
            self.transport.writelines(request)  # type: ignore[union-attr]

    def _fail(self, err: BackendFailure) -> None:
        ex = self.exchange
        self.exchange = None
        if ex is not None:
            ex.fail(err)
        self.drop()

    def drop(self) -> None:
        """Close the connection (a FIN: the engine sees its client leave)."""
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class H1Upstream:
    """The gateway's HTTP/1.1 client: `send()` returns once the engine's headers are in (upstream/base.py)."""

    def __init__(self, *, keepalive_s: float = POOL_IDLE_S) -> None:
        self._urls: dict[str, tuple[_Origin, bytes]] = {}  # url -> (its origin, the path it asks for)
        self._origins: dict[tuple[str, str, int], _Origin] = {}
        self._watchdog: Watchdog[H1Response] = Watchdog()
        self._tls: ssl.SSLContext | None = None
        self._keepalive_s = keepalive_s  # an idle connection older than this is closed, not reused

    def _resolve(self, url: str) -> tuple[_Origin, bytes]:
        hit = self._urls.get(url)
        if hit is not None:
            return hit
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise UpstreamUnreachable("invalid engine URL")
        port = u.port or (443 if u.scheme == "https" else 80)
        key = (u.scheme, u.hostname, port)
        origin = self._origins.get(key)
        if origin is None:
            tls = None
            if u.scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context()
                tls = self._tls
            default = (u.scheme == "http" and port == 80) or (u.scheme == "https" and port == 443)
            host = u.hostname if ":" not in u.hostname else f"[{u.hostname}]"
            origin = _Origin(u.hostname, port, (host if default else f"{host}:{port}").encode("idna"), tls)
            self._origins[key] = origin
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hit = (origin, path.encode("latin-1"))
        if len(self._urls) < 4096:
            self._urls[url] = hit
        return hit

    async def _connection(self, origin: _Origin, t: UpstreamTimeouts, loop: asyncio.AbstractEventLoop) -> Connection:
        idle = origin.idle
        if idle:
            too_old = loop.time() - self._keepalive_s
            while idle:
                conn = idle.popitem()[0]  # the most recently used: least likely to have been closed by the engine
                if conn.idle_since < too_old:
                    conn.drop()
                elif not conn.closed and conn.transport is not None and not conn.transport.is_closing():
                    return conn
        return await self._connect(origin, t, loop)

    async def _connect(self, origin: _Origin, t: UpstreamTimeouts, loop: asyncio.AbstractEventLoop) -> Connection:
        try:
            async with asyncio.timeout(t.connect_s):
                _, proto = await loop.create_connection(
                    lambda: Connection(origin), origin.host, origin.port, ssl=origin.ssl
                )
        except TimeoutError:
            raise UpstreamTimeout("the engine did not accept a connection within the connect timeout") from None
        except OSError as e:
            raise ConnectFailed(f"cannot connect to the engine: {e.strerror or e}") from None
        return proto

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Body | None,
        timeouts: UpstreamTimeouts,
    ) -> H1Response:
        origin, path = self._resolve(url)
        head = [method.encode("ascii"), b" ", path, b" HTTP/1.1\r\nhost: ", origin.host_header, b"\r\n"]
        reusable = True
        for k, v in headers.items():
            head += (k.encode("latin-1"), b": ", v.encode("latin-1"), b"\r\n")
            if len(k) == 10 and k.lower() == "connection" and v.lower() == "close":
                reusable = False  # RFC 9112 9.6: no request follows on a connection that said close
        request: bytes | tuple[bytes | memoryview, ...]
        if body is None:
            head.append(b"\r\n")
            request = b"".join(head)
        elif isinstance(body, Spliced):  # the client's bytes and the added fields: written as they are, after the head
            head += (b"content-length: ", b"%d" % body.size, b"\r\n\r\n")
            request = (b"".join(head), *body.parts)
        elif len(body) < WRITEV_BYTES:
            head += (b"content-length: ", b"%d" % len(body), b"\r\n\r\n", body)
            request = b"".join(head)
        else:  # a coding agent's request: its head and body go out together, the body not copied
            head += (b"content-length: ", b"%d" % len(body), b"\r\n\r\n")
            request = (b"".join(head), body)
        loop = asyncio.get_running_loop()  # once a request: in 3.11 each look-up is a getpid() syscall
        conn = await self._connection(origin, timeouts, loop)
        resp = H1Response(conn, timeouts, self._watchdog, loop)
        conn.start(resp, request, reusable)
        try:
            await resp.wait_headers()
        except _ReusedConnectionClosed:
            resp.close()
            return await self._resend(origin, request, reusable, timeouts, loop)
        except BaseException:  # a failure, or the client left while waiting: the engine sees it leave
            resp.close()
            raise
        return resp

    async def _resend(
        self,
        origin: _Origin,
        request: bytes | tuple[bytes | memoryview, ...],
        reusable: bool,
        timeouts: UpstreamTimeouts,
        loop: asyncio.AbstractEventLoop,
    ) -> H1Response:
        """`request` met a kept-alive connection's close before any byte of an answer: send it once more, on a
        new connection (`_ReusedConnectionClosed` says why that is safe). The prober's GETs were the first
        reason (one that met an engine's idle close took a healthy backend down); a queued stream that took the
        connection llama-server was closing after its last stream the second. The steps are `send`'s own, which
        keeps them inline (a coroutine less a request)."""
        conn = await self._connect(origin, timeouts, loop)
        resp = H1Response(conn, timeouts, self._watchdog, loop)
        conn.start(resp, request, reusable)
        try:
            await resp.wait_headers()
        except BaseException:
            resp.close()
            raise
        return resp

    async def aclose(self) -> None:
        self._watchdog.close()
        for origin in self._origins.values():
            while origin.idle:
                origin.idle.popitem()[0].drop()
