"""A fake engine at the gateway's own upstream seam, as httpx's MockTransport is for httpx.

`FakeUpstream` implements `llm_gateway.upstream.base.UpstreamClient`, so in-process tests drive the
gateway exactly as production does, whichever real client (aiohttp or httpx) is configured, without
mocking a client library. Routes map (method, full URL or bare path) to a `FakeAnswer`, a handler
`(method, url, headers, body) -> FakeAnswer`, an exception raised at `send()` (what a real client
raises for a refused connection, a timeout), or a list of those consumed one per call. Answers script
a delay before the headers and, in `chunks`, body bytes, `Stall`s between them and exceptions that cut
the body; delays longer than the request's `UpstreamTimeouts` end in `UpstreamTimeout` as the real
clients' do. Every call is recorded, and every response is tracked, so a test can assert that none
was left open.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import urlsplit

import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from llm_gateway.errors import ConnectFailed, GatewayError, StreamInterrupted, UpstreamProtocolError, UpstreamTimeout
from llm_gateway.upstream.base import UpstreamTimeouts
from llm_gateway.wire.client_body import Body, joined

if TYPE_CHECKING:
    from llm_gateway.upstream.base import UpstreamClient


def refused() -> GatewayError:
    """What the real clients raise from `send()` when the engine's port refuses the connection."""
    return ConnectFailed("cannot connect to the engine: Connect call failed (connection refused)")


def timed_out() -> GatewayError:
    """What the real clients raise from `send()` when the engine's headers do not come in time."""
    return UpstreamTimeout("the engine sent nothing before its first byte within the configured timeout")


def cut() -> GatewayError:
    """What the real clients raise from a body read when the engine drops the connection mid-body."""
    return StreamInterrupted("the engine closed the connection in the middle of its response")


@dataclass(frozen=True, slots=True)
class Stall:
    """A pause in the body; longer than the idle (or what is left of the total) timeout, a timeout."""

    seconds: float


Chunk: TypeAlias = bytes | Stall | BaseException


@dataclass(frozen=True)
class FakeAnswer:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    chunks: Sequence[Chunk] = ()
    delay_s: float = 0.0  # before the status line and headers

    @classmethod
    def json(cls, obj: Any, status: int = 200) -> FakeAnswer:
        return cls(status, {"content-type": "application/json"}, [orjson.dumps(obj)])

    @classmethod
    def text(cls, text: str, status: int = 200, content_type: str = "text/plain") -> FakeAnswer:
        return cls(status, {"content-type": content_type}, [text.encode()])

    @classmethod
    def sse(cls, *chunks: Chunk) -> FakeAnswer:
        return cls(200, {"content-type": "text/event-stream"}, list(chunks))


@dataclass(frozen=True)
class FakeCall:
    method: str
    url: str
    headers: CIMultiDict[str]
    body: bytes | None

    @property
    def path(self) -> str:
        return urlsplit(self.url).path

    def json(self) -> Any:
        assert self.body is not None, f"{self.method} {self.url} had no body"
        return orjson.loads(self.body)


Handler: TypeAlias = Callable[
    [str, str, CIMultiDict[str], bytes | None], "FakeAnswer | BaseException | Awaitable[FakeAnswer | BaseException]"
]
Reply: TypeAlias = "FakeAnswer | BaseException | Handler | list[FakeAnswer | BaseException | Handler]"


def _fresh(exc: BaseException) -> BaseException:
    """A copy per raise: the gateway adds headers and backend names to the errors it handles."""
    e = copy.copy(exc)
    if isinstance(e, GatewayError) and isinstance(exc, GatewayError):
        e.headers = dict(exc.headers)
    return e


class FakeResponse:
    def __init__(self, answer: FakeAnswer, timeouts: UpstreamTimeouts) -> None:
        self.status = answer.status
        self.headers: CIMultiDictProxy[str] = CIMultiDictProxy(CIMultiDict(answer.headers))
        self._chunks = list(answer.chunks)
        self._idle = timeouts.idle_s
        self._deadline = asyncio.get_running_loop().time() + timeouts.total_s
        self.eof = False
        self.failed = False  # cut or timed out: the rest of the body never comes
        self.closed = False
        self.dropped = False  # closed before the end of the body: the engine saw the client go away

    def _fail(self, exc: BaseException) -> BaseException:
        self._chunks.clear()
        self.failed = True
        return exc

    async def read_chunk(self) -> bytes:
        while self._chunks and not self.closed:
            item = self._chunks.pop(0)
            if isinstance(item, bytes):
                if item:
                    return item
            elif isinstance(item, Stall):
                left = self._deadline - asyncio.get_running_loop().time()
                await asyncio.sleep(max(0.0, min(item.seconds, self._idle, left)))
                if item.seconds > left:
                    raise self._fail(UpstreamTimeout("the engine's response did not complete within the total timeout"))
                if item.seconds > self._idle:
                    raise self._fail(
                        UpstreamTimeout(
                            "the engine sent nothing between chunks of its response within the configured timeout"
                        )
                    )
            else:
                raise self._fail(_fresh(item))
        self.eof = not (self.closed or self.failed)
        return b""

    async def read(self, limit: int) -> bytes:
        parts, size = [], 0
        while chunk := await self.read_chunk():
            size += len(chunk)
            if size > limit:
                raise UpstreamProtocolError(f"the engine's response is larger than {limit} bytes")
            parts.append(chunk)
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            self.closed, self.dropped = True, not self.eof


class FakeUpstream:
    def __init__(self, routes: Mapping[tuple[str, str], Reply] | None = None, *, default: Reply | None = None) -> None:
        self.routes: dict[tuple[str, str], Reply] = {}
        for (method, target), reply in (routes or {}).items():
            self.route(method, target, reply)
        self.default = default
        self.calls: list[FakeCall] = []
        self.responses: list[FakeResponse] = []
        self.closed = False

    def route(self, method: str, target: str, reply: Reply) -> None:
        """Answer `method` on `target` (a full URL, or a path on any host) with `reply` from now on."""
        self.routes[method.upper(), target] = list(reply) if isinstance(reply, list) else reply

    def calls_to(self, target: str, method: str | None = None) -> list[FakeCall]:
        return [c for c in self.calls if target in (c.url, c.path) and (method is None or c.method == method.upper())]

    @property
    def open_responses(self) -> list[FakeResponse]:
        return [r for r in self.responses if not r.closed]

    def assert_all_closed(self) -> None:
        assert not self.open_responses, f"{len(self.open_responses)} upstream response(s) left open"

    def _reply_for(self, call: FakeCall) -> FakeAnswer | BaseException | Handler:
        reply = self.routes.get((call.method, call.url), self.routes.get((call.method, call.path), self.default))
        if reply is None:
            raise AssertionError(f"FakeUpstream: no route for {call.method} {call.url}")
        if isinstance(reply, list):
            assert reply, f"FakeUpstream: {call.method} {call.url} was called more often than scripted"
            return reply.pop(0)
        return reply

    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Body | None,
        timeouts: UpstreamTimeouts,
    ) -> FakeResponse:
        body = None if body is None else joined(body)  # as the engine reads it (a Spliced body: its pieces joined)
        call = FakeCall(method.upper(), url, CIMultiDict(headers), body)
        self.calls.append(call)
        reply = self._reply_for(call)
        if callable(reply):
            got = reply(call.method, url, call.headers, body)
            reply = await got if inspect.isawaitable(got) else got
        if isinstance(reply, BaseException):
            raise _fresh(reply)
        if reply.delay_s:
            await asyncio.sleep(min(reply.delay_s, timeouts.first_byte_s))
            if reply.delay_s > timeouts.first_byte_s:
                raise timed_out()
        resp = FakeResponse(reply, timeouts)
        self.responses.append(resp)
        return resp

    async def aclose(self) -> None:
        self.closed = True


if TYPE_CHECKING:

    def _implements_the_seam(f: FakeUpstream) -> UpstreamClient:
        return f
