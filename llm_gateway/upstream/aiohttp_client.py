"""The aiohttp upstream client (`server.upstream_client: aiohttp`): one shared session for every engine.

It was the production client until the gateway's own (h1_client.py) measured cheaper per request and
per relayed event (bench/); it stays as the well-known alternative. aiohttp's pool and parser cost a
fraction of httpx's per request and do not churn connections at high concurrency. Redirects are
never followed (an engine must not send the gateway's engine key elsewhere), compression is not
negotiated (engines rarely compress, and relaying identity bytes avoids a decode/encode per chunk),
and the read timeout switches from "first byte" to "idle between chunks" once the engine's headers
are in.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy
from yarl import URL

from llm_gateway.errors import (
    BackendFailure,
    ConnectFailed,
    GatewayError,
    StreamInterrupted,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from llm_gateway.upstream.base import POOL_IDLE_S, UpstreamTimeouts
from llm_gateway.upstream.watchdog import Watchdog
from llm_gateway.wire.client_body import Body, joined


def _translate(exc: BaseException, *, after_headers: bool) -> BackendFailure:
    """The client's exception as the gateway's: a failed connection is `ConnectFailed` (the backend is down)."""
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError | TimeoutError):
        what = "between chunks of its response" if after_headers else "before its first byte"
        return UpstreamTimeout(f"the engine sent nothing {what} within the configured timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return ConnectFailed(f"cannot connect to the engine: {exc.os_error.strerror or exc.os_error}")
    if isinstance(exc, aiohttp.ClientPayloadError):
        return StreamInterrupted("the engine's response ended before it was complete")
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError | ConnectionError):
        if after_headers:
            return StreamInterrupted("the engine closed the connection in the middle of its response")
        return UpstreamUnreachable("the engine closed the connection without answering")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamProtocolError(f"the engine sent an invalid HTTP response: {exc.message}")
    if isinstance(exc, aiohttp.InvalidURL):
        return UpstreamUnreachable("invalid engine URL")
    return UpstreamProtocolError(f"upstream HTTP error: {type(exc).__name__}")


class AiohttpResponse:
    __slots__ = (
        "_deadline",
        "_idle",
        "_loop",
        "_resp",
        "_streaming",
        "_waiting_since",
        "_watchdog",
        "headers",
        "status",
    )

    def __init__(
        self,
        resp: aiohttp.ClientResponse,
        t: UpstreamTimeouts,
        watchdog: Watchdog[AiohttpResponse],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._resp = resp
        self._idle = t.idle_s
        self._loop = loop
        self._deadline = loop.time() + t.total_s
        self._waiting_since: float | None = None
        self._streaming = False
        self._watchdog = watchdog
        self.status = resp.status
        self.headers: CIMultiDictProxy[str] = resp.headers
        conn = resp.connection
        if conn is not None and conn.protocol is not None:
            conn.protocol.read_timeout = t.idle_s  # whole bodies: aiohttp's own read timer
        watchdog.add(self)

    def check(self, now: float) -> None:
        waiting = self._waiting_since
        if now > self._deadline:
            self._expire("the engine's response did not complete within the total timeout")
        elif waiting is not None and now - waiting > self._idle:
            self._expire("the engine sent nothing between chunks of its response within the configured timeout")

    def _expire(self, why: str) -> None:
        self._watchdog.active.discard(self)
        self._resp.content.set_exception(aiohttp.ServerTimeoutError(why))

    async def read(self, limit: int) -> bytes:
        resp = self._resp
        try:
            length = resp.content_length
            if length is not None and length <= limit:
                return await resp.read()
            if length is not None:
                raise UpstreamProtocolError(f"the engine's response is larger than {limit} bytes")
            parts: list[bytes] = []
            size = 0
            async for chunk in resp.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise UpstreamProtocolError(f"the engine's response is larger than {limit} bytes")
                parts.append(chunk)
            return b"".join(parts)
        except GatewayError:
            raise
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise _translate(e, after_headers=True) from None

    async def read_chunk(self) -> bytes:
        if not self._streaming:
            self._streaming = True
            conn = self._resp.connection
            if conn is not None and conn.protocol is not None:
                conn.protocol.read_timeout = None  # streams: the watchdog times the silences instead
        self._waiting_since = self._loop.time()
        try:
            return await self._resp.content.readany()
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise _translate(e, after_headers=True) from None
        finally:
            self._waiting_since = None

    def close(self) -> None:
        self._watchdog.active.discard(self)
        resp = self._resp
        if resp.content.is_eof():
            resp.release()
        else:
            resp.close()  # drops the connection: the engine sees the client go away and stops generating


class AiohttpUpstream:
    """Shared session; `pool_size` 0 means no cap (the gateway's own backpressure bounds it)."""

    def __init__(self, *, pool_size: int = 0, keepalive_s: float = POOL_IDLE_S) -> None:
        self._connector = aiohttp.TCPConnector(
            limit=pool_size,
            limit_per_host=0,
            keepalive_timeout=keepalive_s,
            ttl_dns_cache=60,
            family=socket.AF_UNSPEC,
        )
        self._session = self._new_session(self._connector)
        #: for requests that say `Connection: close`, which aiohttp would pool all the same (it reads only the
        #: response's): a session whose connections are never reused, made on the first such request
        self._closing: aiohttp.ClientSession | None = None
        self._timeouts: dict[UpstreamTimeouts, aiohttp.ClientTimeout] = {}
        self._watchdog: Watchdog[AiohttpResponse] = Watchdog()
        self._urls: dict[str, URL] = {}  # parsed once: a handful of backend URLs and paths

    @staticmethod
    def _new_session(connector: aiohttp.TCPConnector) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
            raise_for_status=False,
        )

    def _session_for(self, headers: Mapping[str, str]) -> aiohttp.ClientSession:
        if not any(k.lower() == "connection" and v.lower() == "close" for k, v in headers.items()):
            return self._session
        if self._closing is None:
            self._closing = self._new_session(aiohttp.TCPConnector(force_close=True, family=socket.AF_UNSPEC))
        return self._closing

    def _client_timeout(self, t: UpstreamTimeouts) -> aiohttp.ClientTimeout:
        ct = self._timeouts.get(t)
        if ct is None:
            # no `total` here (aiohttp would enter a timer context on every read): the watchdog keeps it
            ct = aiohttp.ClientTimeout(total=None, sock_connect=t.connect_s, sock_read=t.first_byte_s)
            self._timeouts[t] = ct
        return ct

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Body | None,
        timeouts: UpstreamTimeouts,
    ) -> AiohttpResponse:
        u = self._urls.get(url)
        if u is None:
            u = URL(url)
            if len(self._urls) < 4096:
                self._urls[url] = u
        kw: dict[str, Any] = {"headers": headers, "allow_redirects": False, "timeout": self._client_timeout(timeouts)}
        if body is not None:
            kw["data"] = joined(body)
        try:
            resp = await self._session_for(headers).request(method, u, **kw)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise _translate(e, after_headers=False) from None
        return AiohttpResponse(resp, timeouts, self._watchdog, asyncio.get_running_loop())

    async def aclose(self) -> None:
        self._watchdog.close()
        await self._session.close()
        if self._closing is not None:
            await self._closing.close()
