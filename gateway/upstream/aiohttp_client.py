"""The production upstream client: one shared aiohttp session for every engine.

Chosen by measurement (bench/): aiohttp's pool and parser cost a fraction of httpx's per request and
do not churn connections at high concurrency. Redirects are never followed (an engine must not send
the gateway's engine key elsewhere), compression is not negotiated (engines rarely compress, and
relaying identity bytes avoids a decode/encode per chunk), and the read timeout switches from
"first byte" to "idle between chunks" once the engine's headers are in.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from multidict import CIMultiDictProxy

from gateway.errors import (
    GatewayError,
    StreamInterrupted,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.upstream.base import UpstreamTimeouts


def _translate(exc: BaseException, *, after_headers: bool) -> GatewayError:
    if isinstance(exc, aiohttp.ServerTimeoutError | asyncio.TimeoutError | TimeoutError):
        what = "between chunks of its response" if after_headers else "before its first byte"
        return UpstreamTimeout(f"the engine sent nothing {what} within the configured timeout")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return UpstreamUnreachable(f"cannot connect to the engine: {exc.os_error.strerror or exc.os_error}")
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
    __slots__ = ("_idle", "_resp", "headers", "status")

    def __init__(self, resp: aiohttp.ClientResponse, idle_s: float) -> None:
        self._resp = resp
        self._idle = idle_s
        self.status = resp.status
        self.headers: CIMultiDictProxy[str] = resp.headers
        conn = resp.connection
        if conn is not None and conn.protocol is not None:
            conn.protocol.read_timeout = idle_s

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

    async def iter_chunks(self) -> AsyncIterator[bytes]:
        readany = self._resp.content.readany
        try:
            while True:
                chunk = await readany()
                if not chunk:
                    return
                yield chunk
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise _translate(e, after_headers=True) from None

    def close(self) -> None:
        resp = self._resp
        if resp.content.is_eof():
            resp.release()
        else:
            resp.close()  # drops the connection: the engine sees the client go away and stops generating


class AiohttpUpstream:
    """Shared session; `pool_size` 0 means no cap (the gateway's own backpressure bounds it)."""

    def __init__(self, *, pool_size: int = 0, keepalive_s: float = 30.0) -> None:
        self._connector = aiohttp.TCPConnector(
            limit=pool_size,
            limit_per_host=0,
            keepalive_timeout=keepalive_s,
            ttl_dns_cache=60,
            family=socket.AF_UNSPEC,
        )
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            timeout=aiohttp.ClientTimeout(total=None),
            cookie_jar=aiohttp.DummyCookieJar(),
            raise_for_status=False,
        )
        self._timeouts: dict[UpstreamTimeouts, aiohttp.ClientTimeout] = {}

    def _client_timeout(self, t: UpstreamTimeouts) -> aiohttp.ClientTimeout:
        ct = self._timeouts.get(t)
        if ct is None:
            ct = aiohttp.ClientTimeout(total=t.total_s, sock_connect=t.connect_s, sock_read=t.first_byte_s)
            self._timeouts[t] = ct
        return ct

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeouts: UpstreamTimeouts,
    ) -> AiohttpResponse:
        kw: dict[str, Any] = {"headers": headers, "allow_redirects": False, "timeout": self._client_timeout(timeouts)}
        if body is not None:
            kw["data"] = body
        try:
            resp = await self._session.request(method, url, **kw)
        except (TimeoutError, aiohttp.ClientError, OSError) as e:
            raise _translate(e, after_headers=False) from None
        return AiohttpResponse(resp, timeouts.idle_s)

    async def aclose(self) -> None:
        await self._session.close()
