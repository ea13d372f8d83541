"""The real upstream clients against real tiny servers on 127.0.0.1: how each failure of an engine's
connection becomes the gateway's error, and how connections are kept, reused and dropped.

Everything above `llm_gateway/upstream/` (and every in-process test, through FakeUpstream) relies on
this mapping: `ConnectFailed` marks a backend down at once, `UpstreamTimeout` is a 504,
`StreamInterrupted` ends a stream with one error event, a body past its limit is
`UpstreamProtocolError`, and `close()` mid-body must drop the connection so that the engine stops
generating. The servers here script their answers byte by byte (asyncio streams, port 0), so a
stall, a truncated chunked body or a reset happens exactly where the test puts it. The production
client (aiohttp) is the point; the httpx alternative runs the same tests where it maps the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from llm_gateway.errors import (
    ConnectFailed,
    StreamInterrupted,
    UpstreamProtocolError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from llm_gateway.upstream.aiohttp_client import AiohttpUpstream
from llm_gateway.upstream.base import UpstreamClient, UpstreamTimeouts
from llm_gateway.upstream.h1_client import H1Upstream
from llm_gateway.upstream.httpx_client import HttpxUpstream

pytestmark = pytest.mark.timeout(30)

T = UpstreamTimeouts(connect_s=1.0, first_byte_s=1.0, idle_s=1.0, total_s=10.0)
SHORT = UpstreamTimeouts(connect_s=0.3, first_byte_s=0.3, idle_s=0.3, total_s=10.0)


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


Script = Callable[[Request, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class TinyEngine:
    """An HTTP/1.1 server on 127.0.0.1 that answers every request with `script` (keep-alive: the next
    request on a connection is read after the script returns, unless it closed the connection)."""

    script: Script
    connections: int = 0
    requests: list[Request] = field(default_factory=list)
    client_left: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> TinyEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while not writer.is_closing():
                head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                method, path, _ = head[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in head[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                req = Request(method, path, headers, body)
                self.requests.append(req)
                await self.script(req, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its end
        except asyncio.CancelledError:
            pass  # the test is over (returning, not raising, keeps asyncio from logging it)
        finally:
            writer.close()
            self._tasks.discard(task)

    async def wait_for_client_to_leave(self, reader: asyncio.StreamReader) -> None:
        """Inside a script: block until the client closes the connection, then say so."""
        with contextlib.suppress(ConnectionError):
            while await reader.read(1024):
                pass
        self.client_left.set()


def head(status: str = "200 OK", **headers: str) -> bytes:
    lines = [f"HTTP/1.1 {status}"] + [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def chunked(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0) instead of a FIN."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def stream_then(end: Callable[[asyncio.StreamWriter], Awaitable[None] | None]) -> Script:
    """A script: headers of a chunked SSE answer, one event, then `end`."""

    async def script(req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        writer.write(chunked(b"data: one\n\n"))
        await writer.drain()
        got = end(writer)
        if got is not None:
            await got

    return script


CLIENTS: dict[str, Callable[[], UpstreamClient]] = {
    "h1": H1Upstream,
    "aiohttp": AiohttpUpstream,
    "httpx": HttpxUpstream,
}


@pytest.fixture(params=list(CLIENTS))
async def client(request: pytest.FixtureRequest) -> AsyncIterator[UpstreamClient]:
    c = CLIENTS[request.param]()
    yield c
    await c.aclose()


# -- what passes through ----------------------------------------------------------------------------


async def test_status_headers_and_body_pass_through_and_the_request_arrives_as_sent(client):
    async def script(req, reader, writer):
        writer.write(head("201 Created", content_type="application/json", x_engine="e1", content_length="11"))
        writer.write(b'{"ok":true}')
        await writer.drain()

    async with TinyEngine(script) as eng:
        resp = await client.send(
            "POST", eng.url + "/v1/chat/completions", {"authorization": "Bearer k", "x-a": "1"}, b'{"m": 1}', T
        )
        assert resp.status == 201
        assert resp.headers["X-Engine"] == "e1" and resp.headers["content-type"] == "application/json"
        assert await resp.read(1000) == b'{"ok":true}'
        resp.close()
    (req,) = eng.requests
    assert (req.method, req.path, req.body) == ("POST", "/v1/chat/completions", b'{"m": 1}')
    assert req.headers["authorization"] == "Bearer k" and req.headers["x-a"] == "1"


async def test_a_chunked_stream_arrives_chunk_by_chunk_and_ends_with_empty_bytes(client):
    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        for part in (b"data: a\n\n", b"data: b\n\n"):
            writer.write(chunked(part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")

    async with TinyEngine(script) as eng:
        resp = await client.send("GET", eng.url + "/s", {}, None, T)
        got = []
        while c := await resp.read_chunk():
            got.append(c)
        assert await resp.read_chunk() == b""  # and again at the end
        assert b"".join(got) == b"data: a\n\ndata: b\n\n"
        resp.close()


async def test_two_sequential_requests_reuse_one_pooled_connection(client):
    async def script(req, reader, writer):
        writer.write(head(content_length="2") + b"ok")
        await writer.drain()

    async with TinyEngine(script) as eng:
        for _ in range(2):
            resp = await client.send("GET", eng.url + "/health", {}, None, T)
            assert await resp.read(100) == b"ok"
            resp.close()
            await asyncio.sleep(0)  # httpx hands its connection back in a task
    assert len(eng.requests) == 2 and eng.connections == 1


async def test_a_stream_that_asked_for_connection_close_never_returns_its_connection_to_the_pool(client):
    # an adapter asks for that where its engine closes the connection after a stream without saying so
    # (llama-server): a pooled one would be taken by the next request just as the engine's close arrives
    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))  # and keep-alive
        writer.write(chunked(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    async with TinyEngine(script) as eng:
        for _ in range(2):
            resp = await client.send("POST", eng.url + "/v1/chat/completions", {"Connection": "close"}, b"{}", T)
            assert await resp.read_chunk() == b"data: [DONE]\n\n" and await resp.read_chunk() == b""
            resp.close()
            await asyncio.sleep(0.05)  # httpx hands its connection back in a task
    assert len(eng.requests) == 2 and eng.connections == 2
    assert eng.requests[0].headers["connection"] == "close"  # said to the engine too


async def test_redirects_are_not_followed(client):
    async def script(req, reader, writer):
        writer.write(head("307 Temporary Redirect", location="http://elsewhere.test/", content_length="0"))
        await writer.drain()

    async with TinyEngine(script) as eng:
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)
        assert resp.status == 307 and resp.headers["location"] == "http://elsewhere.test/"
        resp.close()
    assert len(eng.requests) == 1


# -- failures before the headers --------------------------------------------------------------------


async def test_a_refused_connection_is_connect_failed(client):
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens on it
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectFailed, match="cannot connect to the engine"):
        await client.send("GET", f"http://127.0.0.1:{port}/health", {}, None, T)


async def test_a_connection_that_cannot_be_made_in_time_is_a_timeout_not_connect_failed(client):
    # a listener that never accepts, with its backlog (0: one connection) filled: Linux drops the
    # next SYNs, so the client's connect hangs until its connect timeout
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        filler.connect(("127.0.0.1", port))
        with socket.socket() as probe:
            probe.settimeout(0.2)
            try:
                probe.connect(("127.0.0.1", port))
            except TimeoutError:
                pass
            else:
                pytest.skip("this kernel accepts connections beyond a full backlog")
        with pytest.raises(UpstreamTimeout):
            await client.send("GET", f"http://127.0.0.1:{port}/health", {}, None, SHORT)


async def test_headers_that_do_not_arrive_within_first_byte_s_are_a_timeout(client):
    async def script(req, reader, writer):
        await asyncio.sleep(5)

    async with TinyEngine(script) as eng:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(UpstreamTimeout, match="before its first byte"):
            await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", SHORT)
        assert loop.time() - t0 < 2


async def test_a_connection_closed_without_an_answer_is_unreachable_but_not_connect_failed(client):
    async def script(req, reader, writer):
        writer.close()

    async with TinyEngine(script) as eng:
        with pytest.raises(UpstreamUnreachable) as ei:
            await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)
    assert not isinstance(ei.value, ConnectFailed)  # it accepted the connection: not marked down
    assert len(eng.requests) == 1  # a new connection that closed unanswered is not tried again


# -- a kept-alive connection the engine closes as idle ----------------------------------------------


def nth_on_its_connection(answers: Callable[[int], bytes | None]) -> Script:
    """A script that answers the nth request on each connection (1, 2, ...) with `answers(n)`'s bytes, or
    closes the connection without a byte when it is None: an engine's idle close that the request met."""
    seen: dict[int, int] = {}

    async def script(req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = seen[id(writer)] = seen.get(id(writer), 0) + 1
        data = answers(n)
        if data is None:
            writer.close()
            return
        writer.write(data)
        await writer.drain()

    return script


OK = head(content_length="2") + b"ok"


async def test_h1_a_get_that_met_the_engines_idle_close_is_sent_once_more_on_a_new_connection():
    client = H1Upstream()
    async with TinyEngine(nth_on_its_connection(lambda n: OK if n == 1 else None)) as eng:
        for _ in range(2):  # the second goes out on the kept connection, which the engine closes unanswered
            resp = await client.send("GET", eng.url + "/health", {}, None, T)
            assert resp.status == 200 and await resp.read(100) == b"ok"
            resp.close()
    await client.aclose()
    assert eng.connections == 2 and [r.path for r in eng.requests] == ["/health"] * 3


async def test_h1_a_post_that_met_a_kept_connections_close_before_any_answer_is_sent_once_more():
    # no byte of the engine's came, so no one has anything of this attempt: the generation is sent again on a
    # new connection (a queued stream that took the connection llama-server was closing after its last stream
    # failed mid-stream before: fairness-2026-12-04.md D3); an engine that had taken it and died refuses that
    # new connection, which marks the backend down
    client = H1Upstream()
    async with TinyEngine(nth_on_its_connection(lambda n: OK if n == 1 else None)) as eng:
        resp = await client.send("GET", eng.url + "/health", {}, None, T)
        resp.close()
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b'{"m": 1}', T)
        assert resp.status == 200 and await resp.read(100) == b"ok"
        resp.close()
    await client.aclose()
    assert eng.connections == 2 and [(r.method, r.body) for r in eng.requests] == [
        ("GET", b""),
        ("POST", b'{"m": 1}'),
        ("POST", b'{"m": 1}'),
    ]


async def test_h1_sends_a_request_again_only_once():
    client = H1Upstream()
    async with TinyEngine(nth_on_its_connection(lambda n: OK if n == 1 else None)) as eng:
        resp = await client.send("GET", eng.url + "/health", {}, None, T)
        resp.close()
        eng.script = nth_on_its_connection(lambda n: None)  # now the new connection closes unanswered too
        with pytest.raises(UpstreamUnreachable, match="without answering") as ei:
            await client.send("GET", eng.url + "/health", {}, None, T)
    await client.aclose()
    assert type(ei.value) is UpstreamUnreachable
    assert eng.connections == 2 and len(eng.requests) == 3


async def test_h1_a_kept_alive_connection_closed_after_part_of_an_answer_is_not_sent_again():
    client = H1Upstream()
    partial = b"HTTP/1.1 200 OK\r\nx-a: 1\r\nx-b: 2\r\n"  # then the engine is gone: it had the request

    async def script(req: Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(OK if len(eng.requests) == 1 else partial)
        await writer.drain()
        if len(eng.requests) > 1:
            writer.close()

    async with TinyEngine(script) as eng:
        resp = await client.send("GET", eng.url + "/health", {}, None, T)
        resp.close()
        with pytest.raises(UpstreamUnreachable):
            await client.send("GET", eng.url + "/health", {}, None, T)
    await client.aclose()
    assert eng.connections == 1 and len(eng.requests) == 2


@pytest.mark.parametrize("name", ["h1", "aiohttp"])
async def test_a_connection_idle_past_the_pools_keepalive_is_not_reused(name):
    client: UpstreamClient = H1Upstream(keepalive_s=0.2) if name == "h1" else AiohttpUpstream(keepalive_s=0.2)
    async with TinyEngine(nth_on_its_connection(lambda n: OK)) as eng:
        for pause in (0, 0.5):  # the first connects; after 0.5 s idle a new connection, not the kept one
            await asyncio.sleep(pause)
            resp = await client.send("GET", eng.url + "/health", {}, None, T)
            assert await resp.read(100) == b"ok"
            resp.close()
        await asyncio.sleep(0.05)
        resp = await client.send("GET", eng.url + "/health", {}, None, T)
        resp.close()
    await client.aclose()
    assert len(eng.requests) == 3 and eng.connections == 2


async def test_an_answer_that_is_not_http_is_a_backend_failure(client):
    async def script(req, reader, writer):
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    # aiohttp's parser rejects the status line; httpx (h11) reports a RemoteProtocolError, which its
    # client maps, before the headers, as a connection closed without an answer
    expected = UpstreamUnreachable if isinstance(client, HttpxUpstream) else UpstreamProtocolError
    async with TinyEngine(script) as eng:
        with pytest.raises(expected) as ei:
            await client.send("GET", eng.url + "/health", {}, None, T)
    assert not isinstance(ei.value, ConnectFailed)


# -- failures in the body ----------------------------------------------------------------------------


@pytest.mark.parametrize("whole", [False, True], ids=["read_chunk", "read"])
async def test_an_engine_silent_mid_body_past_idle_s_is_a_timeout(client, whole):
    async with TinyEngine(stream_then(lambda w: asyncio.sleep(5))) as eng:
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", SHORT)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with pytest.raises(UpstreamTimeout):
            if whole:
                await resp.read(10_000)
            else:
                assert await resp.read_chunk() == b"data: one\n\n"
                await resp.read_chunk()
        assert loop.time() - t0 < 2
        resp.close()


async def test_a_stream_past_total_s_is_a_timeout_even_while_the_engine_keeps_talking(client):
    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        for _ in range(100):
            writer.write(chunked(b"data: x\n\n"))
            await writer.drain()
            await asyncio.sleep(0.05)

    async with TinyEngine(script) as eng:
        t = UpstreamTimeouts(connect_s=1, first_byte_s=1, idle_s=1, total_s=0.5)
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", t)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        # (aiohttp's message says "between chunks": its _translate words every timeout after the headers so)
        with pytest.raises(UpstreamTimeout):
            while await resp.read_chunk():
                pass
        assert loop.time() - t0 < 1.5  # total_s 0.5 (+ aiohttp's watchdog period 0.25 s), not the 5 s stream
        resp.close()


def _fin(w: asyncio.StreamWriter) -> None:
    w.close()


ENDINGS = {
    "chunked body cut by FIN": _fin,
    "connection reset": reset,
}


@pytest.mark.parametrize("end", ENDINGS.values(), ids=ENDINGS.keys())
@pytest.mark.parametrize("whole", [False, True], ids=["read_chunk", "read"])
async def test_a_body_cut_mid_stream_is_stream_interrupted(client, end, whole):
    async with TinyEngine(stream_then(end)) as eng:
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)
        with pytest.raises(StreamInterrupted):
            if whole:
                await resp.read(10_000)
            else:
                assert await resp.read_chunk() == b"data: one\n\n"
                while await resp.read_chunk():
                    pass
        resp.close()


async def test_a_body_shorter_than_its_content_length_is_stream_interrupted(client):
    async def script(req, reader, writer):
        writer.write(head(content_type="application/json", content_length="100") + b'{"partial":')
        await writer.drain()
        writer.close()

    async with TinyEngine(script) as eng:
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)
        with pytest.raises(StreamInterrupted):
            await resp.read(10_000)
        resp.close()


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_body_over_the_read_limit_is_a_protocol_error(client, framing):
    body = b"x" * 5000

    async def script(req, reader, writer):
        if framing == "chunked":
            writer.write(head(transfer_encoding="chunked") + chunked(body) + b"0\r\n\r\n")
        else:
            writer.write(head(content_length=str(len(body))) + body)
        await writer.drain()

    async with TinyEngine(script) as eng:
        resp = await client.send("GET", eng.url + "/v1/models", {}, None, T)
        with pytest.raises(UpstreamProtocolError, match="larger than 1000 bytes"):
            await resp.read(1000)
        resp.close()
        within = await client.send("GET", eng.url + "/v1/models", {}, None, T)
        assert await within.read(10_000) == body  # the same body under a limit it fits
        within.close()


# -- closing -----------------------------------------------------------------------------------------


async def test_close_mid_body_drops_the_connection_and_the_engine_sees_the_client_leave(client):
    eng: TinyEngine

    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        writer.write(chunked(b"data: one\n\n"))
        await writer.drain()
        await eng.wait_for_client_to_leave(reader)

    async with TinyEngine(script) as eng:
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)
        assert await resp.read_chunk() == b"data: one\n\n"
        resp.close()
        await asyncio.wait_for(eng.client_left.wait(), 2)
        # the next request needs (and gets) a new connection
        again = await client.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)
        assert again.status == 200
        again.close()
        await asyncio.sleep(0.05)
    assert eng.connections == 2


# -- the gateway's own client (h1_client) -------------------------------------------------------------


async def test_h1_an_unread_body_past_high_water_stops_reading_until_the_reader_catches_up(monkeypatch):
    from llm_gateway.upstream import h1_response

    monkeypatch.setattr(h1_response, "HIGH_WATER", 64)
    sent = asyncio.Event()

    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        for _ in range(8):  # each in its own read: the client stops reading once over 64 bytes
            writer.write(chunked(b"x" * 40))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        sent.set()

    c = H1Upstream()
    async with TinyEngine(script) as eng:
        resp = await c.send("GET", eng.url + "/s", {}, None, T)
        await asyncio.wait_for(sent.wait(), 5)
        for _ in range(20):
            await asyncio.sleep(0.01)
        # more than 64 bytes unread: the socket is not read, so the end of the body is not seen yet
        assert resp._paused and not resp._eof and resp._size < 320
        got = b""
        while chunk := await resp.read_chunk():
            got += chunk
        assert got == b"x" * 320 and not resp._paused
        resp.close()
    await c.aclose()


def test_h1_runs_on_uvloop_and_reuses_its_connection() -> None:
    import uvloop

    async def main() -> tuple[int, int]:
        async def script(req, reader, writer):
            writer.write(head(content_length="2") + b"ok")
            await writer.drain()

        c = H1Upstream()
        async with TinyEngine(script) as eng:
            for _ in range(3):
                resp = await c.send("POST", eng.url + "/v1/chat/completions", {"x-a": "1"}, b"{}", T)
                assert resp.status == 200 and await resp.read(100) == b"ok"
                resp.close()
        await c.aclose()
        return len(eng.requests), eng.connections

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == (3, 1)
    finally:
        loop.close()


async def test_h1_pipe_hands_each_chunk_over_as_it_arrives_until_the_sink_stops():
    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        for part in (b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"):
            writer.write(chunked(part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")

    c = H1Upstream()
    async with TinyEngine(script) as eng:
        resp = await c.send("GET", eng.url + "/s", {}, None, T)
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            return data != b"data: b\n\n"  # stop after the second

        await asyncio.sleep(0.02)
        assert resp.pipe(sink) is None  # the first came with the headers: it is read, not piped
        assert await resp.read_chunk() == b"data: a\n\n"
        piped = resp.pipe(sink)
        assert piped is not None
        await asyncio.wait_for(piped, 5)
        assert got == [b"data: b\n\n"]
        rest = [await resp.read_chunk(), await resp.read_chunk()]  # pulled as before once the sink stopped
        assert rest == [b"data: c\n\n", b""] and resp.pipe(sink) is None  # at the end: nothing to pipe
        resp.close()
    await c.aclose()


async def test_h1_chunks_that_arrive_in_one_read_are_handed_over_as_one_piece_before_the_end():
    # a busy gateway reads several of an engine's chunks at once: one feed of the sink, so one relayed write
    sent = asyncio.Event()

    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked") + chunked(b"data: a\n\n"))
        await writer.drain()
        await sent.wait()
        writer.write(chunked(b"data: b\n\n") + chunked(b"data: c\n\n") + chunked(b"data: d\n\n") + b"0\r\n\r\n")

    c = H1Upstream()
    async with TinyEngine(script) as eng:
        resp = await c.send("GET", eng.url + "/s", {}, None, T)
        assert await resp.read_chunk() == b"data: a\n\n"
        got: list[bytes] = []
        piped = resp.pipe(lambda data: got.append(data) is None)
        assert piped is not None
        sent.set()
        await asyncio.wait_for(piped, 5)
        assert got == [b"data: b\n\ndata: c\n\ndata: d\n\n"]  # one piece, taken before the body ended
        assert await resp.read_chunk() == b""
        resp.close()
    await c.aclose()


async def test_h1_pipe_ends_with_the_body_and_a_silence_past_idle_s_is_a_timeout():
    async with TinyEngine(stream_then(lambda w: asyncio.sleep(5))) as eng:
        c = H1Upstream()
        resp = await c.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", SHORT)
        assert await resp.read_chunk() == b"data: one\n\n"
        piped = resp.pipe(lambda data: True)
        assert piped is not None
        await asyncio.wait_for(piped, 3)  # the watchdog ends the silence
        with pytest.raises(UpstreamTimeout):
            await resp.read_chunk()
        resp.close()
        await c.aclose()


async def test_h1_a_piped_stream_slower_than_the_watchdog_but_never_silent_for_idle_s_is_not_a_timeout():
    # piped chunks are counted, not timed one by one: the watchdog must see the count move and time a
    # silence from there, or a steady stream longer than idle_s would be cut
    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        await writer.drain()
        for i in range(8):
            await asyncio.sleep(0.2)
            writer.write(chunked(b"data: %d\n\n" % i))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with TinyEngine(script) as eng:
        c = H1Upstream()
        t = UpstreamTimeouts(connect_s=1, first_byte_s=1, idle_s=0.5, total_s=10)
        resp = await c.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", t)
        got: list[bytes] = []

        def sink(data: bytes) -> bool:
            got.append(data)
            return True

        piped = resp.pipe(sink)
        assert piped is not None
        await asyncio.wait_for(piped, 5)
        assert await resp.read_chunk() == b""  # the body's end, not an UpstreamTimeout
        assert b"".join(got) == b"".join(b"data: %d\n\n" % i for i in range(8))
        resp.close()
        await c.aclose()


async def test_h1_what_the_sink_raises_is_raised_where_it_was_piped():
    async def script(req, reader, writer):
        writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
        await writer.drain()
        await asyncio.sleep(0.1)
        writer.write(chunked(b"data: x\n\n"))
        await writer.drain()
        await asyncio.sleep(1)

    async with TinyEngine(script) as eng:
        c = H1Upstream()
        resp = await c.send("POST", eng.url + "/v1/chat/completions", {}, b"{}", T)

        def sink(data: bytes) -> bool:
            raise ValueError("a relay bug")

        piped = resp.pipe(sink)
        assert piped is not None  # nothing came with the headers
        with pytest.raises(ValueError, match="a relay bug"):
            await asyncio.wait_for(piped, 5)
        resp.close()
        await c.aclose()


def test_h1_connections_the_engine_closes_leave_no_reference_cycle_behind() -> None:
    # each closed connection must be freed by its refcount: a protocol that keeps its parser (which
    # points back at it) is a cycle per connection, and thousands per round grew bench/streams.py's RSS
    import gc

    import uvloop

    async def main() -> int:
        async def script(req, reader, writer):
            writer.write(head(content_length="2", connection="close") + b"ok")
            await writer.drain()
            writer.close()

        c = H1Upstream()
        async with TinyEngine(script) as eng:
            for _ in range(3):  # warm: the loop's and the server's own one-off objects
                resp = await c.send("GET", eng.url + "/h", {}, None, T)
                await resp.read(100)
                resp.close()
            await asyncio.sleep(0.05)
            gc.collect()
            gc.disable()
            try:
                for _ in range(40):
                    resp = await c.send("GET", eng.url + "/h", {}, None, T)
                    assert await resp.read(100) == b"ok"
                    resp.close()
                await asyncio.sleep(0.1)
                found = gc.collect()
            finally:
                gc.enable()
        await c.aclose()
        return found

    loop = uvloop.new_event_loop()
    try:
        found = loop.run_until_complete(main())
    finally:
        loop.close()
    assert found < 40, f"{found} objects in reference cycles after 40 closed connections"


@pytest.mark.parametrize("on_uvloop", [False, True])
def test_h1_a_large_or_spliced_body_goes_out_beside_its_head_not_joined_with_it_and_arrives_whole(
    monkeypatch, on_uvloop
) -> None:
    # a coding agent's 74 KB request: joined with its head it was one more copy of the whole body, and the client's
    # bytes with the gateway's added fields (wire/client_body.Spliced) one more (issue 36)
    import uvloop

    from llm_gateway.upstream import h1_client
    from llm_gateway.wire.client_body import Spliced

    started: list[bytes | tuple[bytes | memoryview, ...]] = []
    real = h1_client.Connection.start

    def start(self, exchange, request, reusable=True):  # type: ignore[no-untyped-def]
        started.append(request)
        real(self, exchange, request, reusable)

    monkeypatch.setattr(h1_client.Connection, "start", start)
    large = bytes(range(256)) * (h1_client.WRITEV_BYTES // 256 + 40)
    small = b'{"m": 1}'
    client_bytes = b'{"m": "' + b"x" * 100 + b'"}\n'
    spliced = Spliced((memoryview(client_bytes)[:-2], b',"n":2}'))
    whole = client_bytes[:-2] + b',"n":2}'

    async def main() -> list[Request]:
        # the first request answered; on its kept connection the next meets a close and is sent once more
        async with TinyEngine(nth_on_its_connection(lambda n: OK if n == 1 else None)) as eng:
            c = H1Upstream()
            for body in (small, large, spliced):
                resp = await c.send("POST", eng.url + "/v1/chat/completions", {"x-a": "1"}, body, T)
                assert resp.status == 200 and await resp.read(100) == b"ok"
                resp.close()
            await c.aclose()
        return eng.requests

    loop = uvloop.new_event_loop() if on_uvloop else asyncio.new_event_loop()
    try:
        requests = loop.run_until_complete(main())
    finally:
        loop.close()
    # each after the first met the close of the connection it was sent on: sent again, whole
    assert [r.body for r in requests] == [small, large, large, whole, whole]
    assert all(r.headers["content-length"] == str(len(r.body)) and r.headers["x-a"] == "1" for r in requests)
    assert type(started[0]) is bytes and started[0].endswith(b"\r\n\r\n" + small)
    assert len(started) == 5 and started[1] is started[2] and started[3] is started[4]  # a resend: the same pieces
    head, body = started[1]  # type: ignore[misc]
    assert body is large and head.endswith(b"content-length: %d\r\n\r\n" % len(large))
    head, *parts = started[3]  # type: ignore[misc]
    assert parts == list(spliced.parts) and parts[0].obj is client_bytes  # the client's bytes, not a copy
    assert head.endswith(b"content-length: %d\r\n\r\n" % len(whole))


async def test_a_spliced_body_arrives_as_its_pieces_joined(client):
    # the client's bytes with the gateway's added fields (wire/client_body.Spliced): every client sends them whole
    from llm_gateway.wire.client_body import Spliced

    async def script(req, reader, writer):
        writer.write(OK)
        await writer.drain()

    client_bytes = b'{"m": 1}  \n'
    async with TinyEngine(script) as eng:
        body = Spliced((memoryview(client_bytes)[:7], b',"n":2}'))
        resp = await client.send("POST", eng.url + "/v1/chat/completions", {}, body, T)
        assert resp.status == 200 and await resp.read(100) == b"ok"
        resp.close()
    (req,) = eng.requests
    assert req.body == b'{"m": 1,"n":2}' and req.headers["content-length"] == "14"
