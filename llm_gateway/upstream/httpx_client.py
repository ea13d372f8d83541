"""The alternative upstream client on httpx (`server.upstream_client: httpx`).

Slower than the aiohttp client under load (see bench/), but it honours httpx's transports: HTTP
proxies from the environment and custom TLS. Same contract as `AiohttpUpstream` (both are held to
it by tests/unit/test_aiohttp_upstream.py against real local servers): exceptions are translated
here, redirects are not followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import httpx

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
from llm_gateway.wire.client_body import Body, joined


def _translate(exc: BaseException, *, after_headers: bool) -> BackendFailure:
    """The client's exception as the gateway's: a failed connection is `ConnectFailed` (the backend is down)."""
    if isinstance(exc, httpx.TimeoutException | asyncio.TimeoutError):
        what = "between chunks of its response" if after_headers else "before its first byte"
        return UpstreamTimeout(f"the engine sent nothing {what} within the configured timeout")
    if isinstance(exc, httpx.ConnectError):
        return ConnectFailed(f"cannot connect to the engine: {exc}")
    if isinstance(exc, httpx.RemoteProtocolError | httpx.ReadError):
        if after_headers:
            return StreamInterrupted("the engine closed the connection in the middle of its response")
        return UpstreamUnreachable("the engine closed the connection without answering")
    if isinstance(exc, httpx.TransportError):
        return UpstreamUnreachable(f"upstream transport error: {type(exc).__name__}")
    return UpstreamProtocolError(f"upstream HTTP error: {type(exc).__name__}")


class HttpxResponse:
    def __init__(self, resp: httpx.Response, total_deadline: float) -> None:
        self._resp = resp
        self._deadline = total_deadline
        self._it: AsyncIterator[bytes] | None = None
        self.status = resp.status_code
        self.headers = resp.headers

    async def read(self, limit: int) -> bytes:
        parts: list[bytes] = []
        size = 0
        async for chunk in self._chunks():
            size += len(chunk)
            if size > limit:
                raise UpstreamProtocolError(f"the engine's response is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    async def read_chunk(self) -> bytes:
        if self._it is None:
            self._it = self._chunks()
        try:
            return await anext(self._it)
        except StopAsyncIteration:
            return b""

    async def _chunks(self) -> AsyncIterator[bytes]:
        """The body's chunks as httpx yields them, timed by the total deadline (what `read_chunk` steps through)."""
        try:
            async with asyncio.timeout_at(self._deadline):
                async for chunk in self._resp.aiter_raw():
                    if chunk:
                        yield chunk
        except GatewayError:
            raise
        except (TimeoutError, httpx.HTTPError, OSError) as e:
            raise _translate(e, after_headers=True) from None

    def close(self) -> None:
        # aclose() is a coroutine; schedule it so that the connection goes back or is dropped
        asyncio.get_running_loop().create_task(self._resp.aclose())


class HttpxUpstream:
    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        self._client = client or httpx.AsyncClient(
            follow_redirects=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=1000, keepalive_expiry=POOL_IDLE_S),
        )

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Body | None,
        timeouts: UpstreamTimeouts,
    ) -> HttpxResponse:
        t = httpx.Timeout(
            connect=timeouts.connect_s, read=timeouts.first_byte_s, write=timeouts.idle_s, pool=timeouts.connect_s
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeouts.total_s
        req = self._client.build_request(
            method, url, headers=dict(headers), content=None if body is None else joined(body), timeout=t
        )
        try:
            async with asyncio.timeout(timeouts.first_byte_s + timeouts.connect_s):
                resp = await self._client.send(req, stream=True, follow_redirects=False)
        except (TimeoutError, httpx.HTTPError, OSError) as e:
            raise _translate(e, after_headers=False) from None
        # after the headers, the read timeout becomes the idle timeout between chunks (httpcore reads
        # it from the request's extensions on every body read)
        req.extensions["timeout"] = httpx.Timeout(
            connect=timeouts.connect_s, read=timeouts.idle_s, write=timeouts.idle_s, pool=timeouts.connect_s
        ).as_dict()
        return HttpxResponse(resp, deadline)

    async def aclose(self) -> None:
        await self._client.aclose()
