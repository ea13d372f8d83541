"""GatewayProtocol (llm_gateway/http/hardened_protocol.py) and its cycle (http/direct_cycle.py) driven in-process:
bytes in, bytes out.

The protocol subclasses uvicorn's private `HttpToolsProtocol` and overrides its parser and
connection callbacks, so an uvicorn upgrade can break it (uvicorn is held to one minor version: see
llm_gateway/http/uvicorn_private.py, whose list tests/unit/test_uvicorn_private.py checks). These tests
drive it: the protocol class is built the way `llm_gateway.http.server.uvicorn_config` builds it, given a
fake transport that records what is written and a fake loop whose timers fire only when a test fires them,
so header deadlines, the keep-alive timer and the lingering close run in milliseconds, with no sockets and
no waiting.
The slow process-level counterpart is tests/reliability/test_hostile_clients.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from uvicorn.logging import TRACE_LOG_LEVEL

from llm_gateway.http import direct_cycle, hardened_protocol
from llm_gateway.http.call import Call
from llm_gateway.http.direct_cycle import COALESCE, WRITEV_BYTES
from llm_gateway.http.hardened_protocol import GatewayProtocol
from llm_gateway.http.server import uvicorn_config
from llm_gateway.http.uvicorn_private import HttpToolsProtocol, ServerState
from llm_gateway.observability.logs import setup_logging
from llm_gateway.settings import ServerConfig

# distinct delays, so a pending timer says by its delay whose it is
HEADER_TIMEOUT_S = 7.0
KEEPALIVE_S = 3
LINGER_S = hardened_protocol.LINGER_S
MAX_HEADER_BYTES = 1024
assert len({HEADER_TIMEOUT_S, float(KEEPALIVE_S), LINGER_S}) == 3


# -- harness -------------------------------------------------------------------------------------------
class FakeTimer:
    def __init__(self, delay: float, callback: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.delay = delay
        self.callback = callback
        self.args = args
        self._cancelled = False
        self.fired = False

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled


class FakeLoop:
    """The loop handed to the protocol: `call_later` only records the timer (a test fires it by
    hand); tasks (the ASGI app) run on the real running loop."""

    def __init__(self) -> None:
        self.timers: list[FakeTimer] = []

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any, context: Any = None) -> FakeTimer:
        timer = FakeTimer(delay, callback, args)
        self.timers.append(timer)
        return timer

    def create_task(
        self, coro: Coroutine[Any, Any, Any], *, name: str | None = None, context: contextvars.Context | None = None
    ) -> asyncio.Task[Any]:
        return asyncio.get_running_loop().create_task(coro, name=name, context=context)

    def pending(self) -> list[float]:
        return sorted(t.delay for t in self.timers if not t.cancelled() and not t.fired)

    def fire(self, delay: float) -> None:
        """Fire the one pending timer set for `delay` seconds, as if that much time had passed."""
        due = [t for t in self.timers if t.delay == delay and not t.cancelled() and not t.fired]
        assert len(due) == 1, f"expected one pending {delay}s timer, pending: {self.pending()}"
        due[0].fired = True
        due[0].callback(*due[0].args)


class FakeTransport:
    """Records what the protocol writes. Like asyncio's transports, it refuses a write after
    write_eof() and ignores writes after close()."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.eof = False
        self.closed = False
        self.read_paused = False
        self.late_writes = 0
        self.writes = 0  # calls that wrote bytes: each is a send syscall on a real transport
        self.aborted = False
        self.unsent = 0  # bytes written that the client has not taken (a test sets it)
        self.pieces: list[list[bytes]] = []  # what each `writelines` was given

    def write(self, data: bytes) -> None:
        if self.closed:
            self.late_writes += 1
            return
        if self.eof:
            raise RuntimeError("Cannot call write() after write_eof()")
        self.out += data
        self.writes += 1

    def writelines(self, data: Any) -> None:
        """One send (writev) of the pieces, as uvloop's: they are kept, to tell what was not copied."""
        self.pieces.append(list(data))
        self.write(b"".join(data))

    def write_eof(self) -> None:
        self.eof = True

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.read_paused = True

    def resume_reading(self) -> None:
        self.read_paused = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        raise AssertionError("no protocol switch expected")

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 50123)}.get(name, default)


@dataclass
class Response:
    status: int
    reason: str
    headers: dict[str, str]
    body: bytes

    def envelope(self) -> dict[str, Any]:
        assert self.headers["content-type"] == "application/json"
        doc = orjson.loads(self.body)
        assert set(doc) == {"error"}
        assert set(doc["error"]) == {"message", "type", "param", "code"}
        assert doc["error"]["type"] == "invalid_request_error"
        return doc["error"]  # type: ignore[no-any-return]


def responses(raw: bytes | bytearray) -> list[Response]:
    """Every HTTP/1.1 response in `raw`, framed by content-length; anything left over fails."""
    out = []
    rest = bytes(raw)
    while rest:
        head, sep, rest = rest.partition(b"\r\n\r\n")
        assert sep, f"unterminated response head: {head[:200]!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        version, status, reason = status_line.split(" ", 2)
        assert version == "HTTP/1.1", status_line
        headers: dict[str, str] = {}
        for line in lines:
            name, _, value = line.partition(":")
            assert name.lower() not in headers, f"duplicate header {name}"
            headers[name.lower()] = value.strip()
        n = int(headers["content-length"])
        body, rest = rest[:n], rest[n:]
        assert len(body) == n, "truncated body"
        out.append(Response(int(status), reason, headers, body))
    return out


STREAM_GATE: list[asyncio.Event] = []  # `/stream` waits on it between its head and its events


@contextlib.contextmanager
def stream_gate() -> Iterator[asyncio.Event]:
    """The gate `/stream` and `/idle` wait on, for one test: set it to let them go on."""
    gate = asyncio.Event()
    STREAM_GATE[:] = [gate]
    try:
        yield gate
    finally:
        STREAM_GATE.clear()


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the whole body, answers 200 with what it saw. `/early` answers 401 without reading it;
    `/stream` answers chunked, its events written by the scope's direct writer where it takes them."""
    assert scope["type"] == "http"
    if scope["path"].startswith("/call-"):
        await call_app(scope, receive, send)
        return
    if scope["path"] == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        if STREAM_GATE:
            await STREAM_GATE[0].wait()
        for i in range(3):
            if not send.__self__.write_chunk(b"data: %d\n\n" % i):  # declined: the ASGI way, as Call.write does
                await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/idle":  # answers nothing itself: a test drives its cycle
        await STREAM_GATE[0].wait()
        return
    if scope["path"] == "/early":
        await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    answer = orjson.dumps({"method": scope["method"], "path": scope["path"], "body": body.decode()})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode())]
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    if scope["path"] == "/whole":  # as Call.respond asks: the head waits for the body
        start[COALESCE] = True
    await send(start)
    await send({"type": "http.response.body", "body": answer})


CALL_EVENTS: list[str] = []  # what `/call-wait` saw


async def call_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The app's side as the gateway writes it, through `Call`: `/call-stream` holds its head for the first
    event and ends with its last; `/call-wait` watches for the client leaving while it waits; `/call-early`
    answers 401 at once (`Call.respond`, the direct write), `/call-key` says the request showed a key, then
    answers 204."""
    call = Call(scope, receive, send, "rid-1")
    if scope["path"] == "/call-early":
        await call.respond(401, b"{}", [])
        return
    if scope["path"] == "/call-key":
        call.authenticated()
        await call.respond(204, b"", [])
        return
    if scope["path"] == "/call-stream":
        await call.start(200, [(b"content-type", b"text/event-stream")], hold=True)
        await call.write(b"data: 0\n\n")
        await call.write(b"data: 1\n\n")
        await call.end(b"data: [DONE]\n\n")
        return
    call.watch_disconnect()
    try:
        await asyncio.Event().wait()
    except asyncio.CancelledError:
        CALL_EVENTS.append(f"cancelled disconnected={call.disconnected}")
        raise
    finally:
        call.stop_watching()
        CALL_EVENTS.append(f"stopped on_disconnect={send.__self__.on_disconnect}")


@dataclass
class Conn:
    """One connection: its protocol, its transport, and its own fake loop (so its timers are its own)."""

    proto: GatewayProtocol
    transport: FakeTransport
    loop: FakeLoop

    def send(self, data: bytes, step: int = 0) -> None:
        """Deliver `data` in one read, or in reads of `step` bytes."""
        for i in range(0, len(data), step or len(data) or 1):
            self.proto.data_received(data[i : i + (step or len(data))])


@dataclass
class Server:
    """One configured protocol class and the state its connections share, as uvicorn's server has."""

    cls: type[GatewayProtocol]
    config: Any
    state: ServerState = field(default_factory=ServerState)

    def connect(self) -> Conn:
        loop = FakeLoop()
        proto = self.cls(config=self.config, server_state=self.state, app_state={}, _loop=loop)
        # as in the gateway, whose uvicorn.access logger has no handler (uvicorn's config stops its propagation):
        # pytest's log capture gives it one, which would send every answer through uvicorn's `send` for its
        # access line, away from the direct writes these tests are about
        proto.access_log = False
        transport = FakeTransport()
        proto.connection_made(transport)  # type: ignore[arg-type]
        return Conn(proto, transport, loop)

    async def settle(self) -> None:
        """Let the ASGI tasks run until each has finished or waits on the client."""
        for _ in range(20):
            await asyncio.sleep(0)


def make_server(max_connections: int = 100, max_unauthenticated: int | None = None) -> Server:
    cap = {} if max_unauthenticated is None else {"max_unauthenticated_connections": max_unauthenticated}
    settings = ServerConfig(
        **cap,
        max_connections=max_connections,
        header_timeout_s=HEADER_TIMEOUT_S,
        max_header_bytes=MAX_HEADER_BYTES,
        keepalive_timeout_s=KEEPALIVE_S,
    )
    config = uvicorn_config(echo_app, settings, "127.0.0.1", 0)  # type: ignore[arg-type]
    config.load()
    cls = config.http_protocol_class
    assert issubclass(cls, GatewayProtocol)
    return Server(cls, config)


@pytest.fixture
def server() -> Server:
    return make_server()


def request(method: str = "GET", path: str = "/x", body: bytes = b"", headers: dict[str, str] | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: gw"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def big_headers(total: int) -> dict[str, str]:
    """Headers (16 of them) whose values add up to `total` bytes."""
    return {f"x-pad-{i}": "a" * (total // 16) for i in range(16)}


def only_response(conn: Conn) -> Response:
    got = responses(conn.transport.out)
    assert len(got) == 1, got
    return got[0]


def assert_refused(conn: Conn, status: int, code: str) -> dict[str, Any]:
    """One JSON-envelope answer with connection: close, then a lingering close: the write side is shut,
    the transport stays open for LINGER_S (no header deadline left), then closes."""
    resp = only_response(conn)
    assert resp.status == status, resp
    assert resp.headers["connection"] == "close"
    error = resp.envelope()
    assert error["code"] == code
    assert conn.transport.eof and not conn.transport.closed
    assert conn.loop.pending() == [LINGER_S]
    conn.loop.fire(LINGER_S)
    assert conn.transport.closed
    return error


# -- a connection, as uvicorn makes it ---------------------------------------------------------------------
def test_a_connection_starts_with_every_field_uvicorn_gives_it(server: Server) -> None:
    """GatewayProtocol.__init__ stands in for uvicorn's (its two loggers looked up once, not per connection):
    each field uvicorn's sets is there with the same value, so the rest of uvicorn's code finds what it expects
    (this is the test an uvicorn upgrade that adds or changes a field fails)."""
    loop, app_state = FakeLoop(), {"from": "lifespan"}
    ours = vars(server.cls(config=server.config, server_state=server.state, app_state=app_state, _loop=loop))
    theirs = vars(HttpToolsProtocol(config=server.config, server_state=server.state, app_state=app_state, _loop=loop))
    assert set(theirs) <= set(ours), f"uvicorn's fields the gateway's protocol lacks: {set(theirs) - set(ours)}"
    for name, value in theirs.items():
        if name == "parser":  # one each, bound to its own protocol
            assert type(ours[name]) is type(value) and ours[name] is not value
        elif isinstance(value, deque | dict | list | tuple | str | int | float | bool) or value is None:
            assert ours[name] == value, name
        else:  # the config, the loop, the loggers, the server's sets, the app, the class of the WebSocket protocol
            assert ours[name] is value, name
    assert ours["connections"] is server.state.connections and ours["app_state"] is app_state


@pytest.fixture
def restored_logging() -> Iterator[None]:
    names = ("", "uvicorn", "uvicorn.error", "uvicorn.access")
    saved = [(lg, lg.level, list(lg.handlers), lg.propagate, lg.disabled) for lg in map(logging.getLogger, names)]
    yield
    for lg, level, handlers, propagate, disabled in saved:
        lg.setLevel(level)
        lg.handlers[:] = handlers
        lg.propagate, lg.disabled = propagate, disabled


@pytest.mark.parametrize("level", ["debug", "warning"])
def test_uvicorns_loggers_take_the_gateways_level_so_connections_skip_its_trace_lines(
    restored_logging: None, level: str
) -> None:
    """uvicorn checks its logger's own level (0 while unset) against TRACE on every connection made and lost,
    and at 0 formats a line and calls `log` for it; set to the gateway's level, it skips both."""
    setup_logging(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        assert lg.level == logging.getLevelName(level.upper()) == logging.getLogger().level, name
        assert lg.level > TRACE_LOG_LEVEL and lg.propagate and not lg.handlers
    assert logging.getLogger("uvicorn.access").disabled


# -- a normal request ------------------------------------------------------------------------------------
async def test_a_normal_request_reaches_the_app_and_gets_its_answer(server: Server) -> None:
    conn = server.connect()
    assert conn.loop.pending() == [HEADER_TIMEOUT_S]
    conn.send(request("POST", "/v1/chat", b'{"hi": 1}'))
    assert conn.loop.pending() == []  # headers done: no header deadline over the body and the app
    await server.settle()
    resp = only_response(conn)
    assert (resp.status, resp.reason) == (200, "OK")
    assert orjson.loads(resp.body) == {"method": "POST", "path": "/v1/chat", "body": '{"hi": 1}'}
    assert "connection" not in resp.headers  # kept alive
    assert not conn.transport.eof and not conn.transport.closed
    assert server.state.total_requests == 1


@pytest.mark.parametrize("close", [False, True], ids=["kept-alive", "connection-close"])
async def test_a_whole_answer_that_asks_to_coalesce_leaves_in_one_write(server: Server, close: bool) -> None:
    conn = server.connect()
    conn.send(request("POST", "/whole", b'{"hi": 1}', {"connection": "close"} if close else None))
    await server.settle()
    resp = only_response(conn)
    assert resp.status == 200 and orjson.loads(resp.body)["path"] == "/whole"
    assert conn.transport.writes == 1  # head and body in one write (one syscall)
    assert conn.transport.closed == close  # uvicorn's close after the answer still happens, after the write


async def test_an_answer_that_does_not_ask_to_coalesce_is_written_as_uvicorn_writes_it(server: Server) -> None:
    conn = server.connect()
    conn.send(request("POST", "/plain", b"{}"))
    await server.settle()
    assert only_response(conn).status == 200
    assert conn.transport.writes == 2  # head, then body: streams send their head before the first event


def dechunk(body: bytes) -> list[bytes]:
    """The chunks of a chunked body, checking its framing; the last one is the empty terminator."""
    out = []
    while True:
        size, _, body = body.partition(b"\r\n")
        n = int(size, 16)
        out.append(body[:n])
        assert body[n : n + 2] == b"\r\n"
        body = body[n + 2 :]
        if n == 0:
            assert body == b""
            return out


@pytest.mark.parametrize("paused", [False, True], ids=["direct", "socket-full"])
async def test_stream_events_are_written_directly_framed_as_uvicorn_frames_them(server: Server, paused: bool) -> None:
    conn = server.connect()
    with stream_gate() as gate:
        conn.send(request("GET", "/stream"))
        await server.settle()
        assert conn.transport.writes == 1  # the head
        if paused:
            conn.proto.flow.pause_writing()  # the socket's buffer is full: the direct writer must decline
        gate.set()
        await server.settle()
        if paused:
            assert conn.transport.writes == 1  # nothing more: every event waits for the socket to drain
            conn.proto.flow.resume_writing()
            await server.settle()
    head, _, body = bytes(conn.transport.out).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    assert dechunk(body) == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n", b""]
    if not paused:
        assert conn.transport.writes == 6  # head, one per event, [DONE], the terminator


async def test_the_direct_chunk_writer_takes_chunks_from_a_chunked_head_to_the_end_only(server: Server) -> None:
    """`write_chunk` reads one flag for six states: it declines (False, nothing written) before any head, writes
    after `start_now`'s chunked head, and declines again once the answer has ended."""
    big = b"data: " + b"x" * 30_000 + b"\n\n"  # as a Response frame echoing an agent's tools
    conn = server.connect()
    with stream_gate() as gate:
        conn.send(request("GET", "/idle"))
        await server.settle()
        cycle = conn.proto.cycle
        assert not cycle.write_chunk(b"too early") and conn.transport.writes == 0
        assert cycle.start_now(200, [(b"content-type", b"text/event-stream")], b"data: 0\n\n")
        assert cycle.write_chunk(b"data: 1\n\n") and cycle.write_chunk(big)
        assert cycle.write_chunk(b"data: 2\n\n", last=True)
        assert not cycle.write_chunk(b"too late") and not cycle.write_chunk(b"", last=True)
        assert conn.transport.writes == 4 and conn.transport.late_writes == 0
        gate.set()
        await server.settle()
    body = bytes(conn.transport.out).partition(b"\r\n\r\n")[2]
    assert dechunk(body) == [b"data: 0\n\n", b"data: 1\n\n", big, b"data: 2\n\n", b""]
    assert b"\r\n%x\r\n%b\r\n" % (len(big), big) in body  # a chunk over the size lines' table: framed alike


async def test_a_large_part_goes_to_the_socket_beside_its_framing_not_copied(server: Server) -> None:
    """A body or chunk of `WRITEV_BYTES` or more (a Response echoing an agent's tools: tens of KB) is handed to the
    transport as it is, beside its head or framing (`writelines`: one writev), and framed as a small one."""
    big = [b"data: %d" % i + b"x" * WRITEV_BYTES + b"\n\n" for i in range(3)]
    conn = server.connect()
    with stream_gate() as gate:
        conn.send(request("GET", "/idle"))
        await server.settle()
        cycle = conn.proto.cycle
        assert cycle.start_now(200, [(b"content-type", b"text/event-stream")], big[0])
        assert cycle.write_chunk(big[1]) and cycle.write_chunk(b"data: 1\n\n")
        assert cycle.write_chunk(big[2], last=True)
        assert conn.transport.writes == 4
        gate.set()
        await server.settle()
    head, _, body = bytes(conn.transport.out).partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert dechunk(body) == [big[0], big[1], b"data: 1\n\n", big[2], b""]
    assert [[p for p in pieces if p is b] for pieces, b in zip(conn.transport.pieces, big, strict=True)] == [
        [b] for b in big
    ]  # each given as it is: not copied into a buffer with its framing
    conn = server.connect()
    with stream_gate() as gate:
        conn.send(request("GET", "/idle"))
        await server.settle()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(big[0]))]
        assert conn.proto.cycle.respond_now(200, headers, big[0])
        gate.set()
        await server.settle()
    head, _, body = bytes(conn.transport.out).partition(b"\r\n\r\n")
    assert b"content-length: %d" % len(big[0]) in head and body == big[0] and conn.transport.writes == 1
    assert conn.transport.pieces[0][-1] is big[0]


async def test_the_direct_chunk_writer_takes_chunks_after_a_head_sent_as_asgi_until_the_client_leaves(
    server: Server,
) -> None:
    conn = server.connect()
    with stream_gate() as gate:
        conn.send(request("GET", "/stream"))  # its head goes through uvicorn's `send`
        await server.settle()
        cycle = conn.proto.cycle
        assert cycle.write_chunk(b"data: x\n\n") and conn.transport.writes == 2
        conn.proto.connection_lost(None)
        assert not cycle.write_chunk(b"data: y\n\n") and conn.transport.writes == 2
        gate.set()
        await server.settle()
    assert conn.transport.late_writes == 0  # nothing was even tried on the closed transport


async def test_a_held_stream_head_leaves_with_the_first_event_and_the_last_event_with_the_end(server: Server) -> None:
    conn = server.connect()
    conn.send(request("GET", "/call-stream"))
    await server.settle()
    head, _, body = bytes(conn.transport.out).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in head
    assert dechunk(body) == [b"data: 0\n\n", b"data: 1\n\n", b"data: [DONE]\n\n", b""]
    assert conn.transport.writes == 3  # head + first event, the second, the last + the terminator


async def test_a_client_that_leaves_cancels_the_handler_through_the_protocol_without_a_watcher_task(
    server: Server,
) -> None:
    CALL_EVENTS.clear()
    conn = server.connect()
    conn.send(request("GET", "/call-wait"))
    await server.settle()
    tasks = asyncio.all_tasks()
    assert not any("Call._watch" in repr(t.get_coro()) for t in tasks), tasks  # no task waits on receive()
    conn.proto.connection_lost(None)
    await server.settle()
    assert CALL_EVENTS == ["cancelled disconnected=True", "stopped on_disconnect=None"]


async def test_headers_and_a_large_body_in_one_read_are_not_taken_for_oversized_headers(server: Server) -> None:
    conn = server.connect()
    body = b"b" * (MAX_HEADER_BYTES * 8)
    conn.send(request("POST", "/big", body))
    await server.settle()
    resp = only_response(conn)
    assert resp.status == 200
    assert len(orjson.loads(resp.body)["body"]) == len(body)


async def test_headers_and_body_over_many_small_reads_are_served(server: Server) -> None:
    conn = server.connect()
    conn.send(request("POST", "/slowish", b"c" * 3000, headers={"x-a": "1" * 500}), step=7)
    await server.settle()
    assert only_response(conn).status == 200


# -- header deadline: 408 ----------------------------------------------------------------------------------
async def test_headers_trickled_in_and_never_finished_get_408_when_the_deadline_fires(server: Server) -> None:
    conn = server.connect()
    conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n")
    for _ in range(5):
        conn.send(b"x-slow: 1\r\n")
    assert conn.transport.out == b""
    conn.loop.fire(HEADER_TIMEOUT_S)
    error = assert_refused(conn, 408, "request_timeout")
    assert "did not arrive in time" in error["message"]


async def test_an_idle_connection_that_sends_nothing_is_closed_without_an_answer(server: Server) -> None:
    conn = server.connect()
    conn.loop.fire(HEADER_TIMEOUT_S)
    assert conn.transport.closed
    assert conn.transport.out == b""


async def test_losing_the_connection_cancels_the_header_deadline(server: Server) -> None:
    conn = server.connect()
    conn.send(b"GET / HTTP/1.1\r\n")
    assert conn.loop.pending() == [HEADER_TIMEOUT_S]
    conn.proto.connection_lost(None)
    assert conn.loop.pending() == []
    assert conn.proto not in server.state.connections


# -- header size cap: 431 ------------------------------------------------------------------------------------
async def test_oversized_headers_in_one_read_get_431(server: Server) -> None:
    conn = server.connect()
    conn.send(request("GET", "/v1/models", headers=big_headers(MAX_HEADER_BYTES * 2)))
    await server.settle()
    # exactly one answer: the parser error the refusal raises must not add uvicorn's 400 after it
    error = assert_refused(conn, 431, "request_header_fields_too_large")
    assert str(MAX_HEADER_BYTES) in error["message"]
    assert server.state.tasks == set()  # the app never saw it


async def test_oversized_unfinished_headers_in_one_read_get_431(server: Server) -> None:
    conn = server.connect()
    conn.send(request("GET", "/v1/models", headers=big_headers(MAX_HEADER_BYTES * 2))[:-4])  # no blank line yet
    assert_refused(conn, 431, "request_header_fields_too_large")


async def test_oversized_headers_over_many_small_reads_get_431_as_the_cap_is_crossed(server: Server) -> None:
    conn = server.connect()
    raw = request("GET", "/v1/models", headers=big_headers(MAX_HEADER_BYTES * 3))
    step = 50
    sent = 0
    while sent <= MAX_HEADER_BYTES:
        assert conn.transport.out == b"", f"answered after only {sent} bytes"
        conn.send(raw[sent : sent + step])
        sent += step
    assert conn.transport.out != b""  # refused at the read that crossed the cap, not later
    conn.send(raw[sent:], step=step)  # the rest is drained, not answered again
    assert_refused(conn, 431, "request_header_fields_too_large")


async def test_the_header_budget_is_per_request_on_a_kept_alive_connection(server: Server) -> None:
    conn = server.connect()
    near_cap = big_headers(MAX_HEADER_BYTES - 16 * 12 - 100)  # with names and CRLFs, just under the cap
    for i in range(3):
        raw = request("GET", f"/r{i}", headers=near_cap)
        assert MAX_HEADER_BYTES - 100 < len(raw) <= MAX_HEADER_BYTES
        conn.send(raw, step=100)
        await server.settle()
    assert [r.status for r in responses(conn.transport.out)] == [200, 200, 200]


async def test_oversized_headers_of_the_next_request_on_a_kept_alive_connection_get_431(server: Server) -> None:
    conn = server.connect()
    conn.send(request(path="/first"))
    await server.settle()
    # the whole first read of the next request counts, before the parser has even begun it
    conn.send(request("GET", "/second", headers=big_headers(MAX_HEADER_BYTES * 2))[:-4])
    first, second = responses(conn.transport.out)
    assert first.status == 200
    assert second.status == 431 and second.envelope()["code"] == "request_header_fields_too_large"


# -- bad framing: 400 in the OpenAI envelope ------------------------------------------------------------------
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\x00\x01 garbage \xff\r\n\r\n", id="garbage-request-line"),
        pytest.param(b"GET / HTTP/1.1\r\nhost: gw\r\ncontent-length: abc\r\n\r\n", id="bogus-content-length"),
        pytest.param(
            b"POST /v1/chat HTTP/1.1\r\nhost: gw\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n",
            id="invalid-chunked-encoding",
        ),
    ],
)
async def test_bad_framing_gets_400_in_the_json_envelope(server: Server, raw: bytes) -> None:
    conn = server.connect()
    conn.send(raw)
    await server.settle()
    error = assert_refused(conn, 400, "invalid_http")
    assert error["message"].startswith("The HTTP request could not be parsed")
    conn.proto.connection_lost(None)  # what the closed transport reports next; an app waiting on a body ends
    await server.settle()
    assert server.state.tasks == set()
    assert conn.transport.late_writes == 0


# -- connection cap: 503 at connection_made ---------------------------------------------------------------------
async def test_a_connection_over_the_cap_is_refused_with_503_at_once() -> None:
    server = make_server(max_connections=2, max_unauthenticated=1)
    first = server.connect()
    first.proto.authenticated()  # else the next one would take its place among the unauthenticated
    second = server.connect()
    second.proto.authenticated()
    over = server.connect()
    assert first.transport.out == second.transport.out == b""
    assert first.loop.pending() == second.loop.pending() == [HEADER_TIMEOUT_S]
    assert over.transport.out != b""  # before it sent a byte
    error = assert_refused(over, 503, "too_many_connections")
    assert "too many open connections" in error["message"]
    over.proto.connection_lost(None)
    first.proto.connection_lost(None)
    again = server.connect()  # a slot is free again
    assert again.transport.out == b"" and not again.transport.eof


# -- the cap of connections that showed no key -------------------------------------------------------------------
async def test_past_the_unauthenticated_cap_a_new_connection_drops_the_oldest_unauthenticated_one() -> None:
    server = make_server(max_connections=10, max_unauthenticated=3)
    conns = [server.connect() for _ in range(3)]
    assert list(server.cls.unauthenticated) == [c.proto for c in conns]
    newest = server.connect()
    oldest = conns[0]
    assert oldest.transport.aborted and oldest.transport.out == b""  # dropped without a word
    assert oldest.loop.pending() == []  # and its header deadline with it
    assert oldest.proto not in server.state.connections  # at once, not when the loop reports it lost
    assert list(server.cls.unauthenticated) == [conns[1].proto, conns[2].proto, newest.proto]
    oldest.proto.connection_lost(None)
    assert not any(c.transport.closed for c in [*conns[1:], newest])
    assert len(server.state.connections) == 3


async def test_a_connection_whose_request_showed_a_key_leaves_the_unauthenticated_ones_and_is_never_dropped() -> None:
    server = make_server(max_connections=10, max_unauthenticated=2)
    keyed = server.connect()
    keyed.send(request(path="/call-key"))
    await server.settle()
    assert only_response(keyed).status == 204
    assert keyed.proto not in server.cls.unauthenticated
    others = [server.connect() for _ in range(6)]  # each past the second drops the oldest of the others
    assert not keyed.transport.closed
    assert [c.transport.aborted for c in others] == [True] * 4 + [False] * 2
    assert len(server.state.connections) == 3


async def test_a_pipelined_request_that_shows_a_key_authenticates_its_connection(server: Server) -> None:
    conn = server.connect()
    conn.send(request(path="/first") + request(path="/call-key"))  # the second queued behind the first
    await server.settle()
    assert [r.status for r in responses(conn.transport.out)] == [200, 204]
    assert conn.proto not in server.cls.unauthenticated


async def test_the_connection_dropped_is_one_not_in_the_middle_of_a_request_when_there_is_one() -> None:
    server = make_server(max_connections=10, max_unauthenticated=2)
    with stream_gate() as gate:
        busy = server.connect()
        busy.send(request(path="/idle"))  # its request is being answered
        await server.settle()
        idle = server.connect()
        server.connect()
        assert idle.transport.aborted and not busy.transport.closed
        gate.set()
        await server.settle()


async def test_losing_a_connection_takes_it_out_of_the_unauthenticated_ones(server: Server) -> None:
    conn = server.connect()
    assert conn.proto in server.cls.unauthenticated
    conn.proto.connection_lost(None)
    assert conn.proto not in server.cls.unauthenticated


def test_the_unauthenticated_cap_defaults_to_half_the_connections_and_stays_below_the_cap() -> None:
    assert ServerConfig(max_connections=100).unauthenticated_connections == 50
    assert ServerConfig().unauthenticated_connections == 8192  # a burst of new streams is not cut at 1,024
    assert ServerConfig(max_connections=100, max_unauthenticated_connections=10).unauthenticated_connections == 10
    with pytest.raises(ValueError, match="below max_connections"):
        ServerConfig(max_connections=100, max_unauthenticated_connections=100)
    assert make_server(max_connections=40).cls.max_unauthenticated == 20
    assert make_server().cls.unauthenticated is not make_server().cls.unauthenticated  # one set per server


# -- lingering close -----------------------------------------------------------------------------------------------
async def test_after_a_refusal_input_is_drained_for_a_while_then_the_connection_closes() -> None:
    server = make_server(max_connections=1)
    server.connect()
    conn = server.connect()
    answer = bytes(conn.transport.out)
    for _ in range(100):
        conn.send(request("POST", "/v1/chat", b"x" * 4096))  # read and thrown away
    assert conn.transport.out == answer and not conn.transport.closed
    await server.settle()
    assert server.state.tasks == set()
    assert conn.loop.pending() == [LINGER_S]
    conn.loop.fire(LINGER_S)
    assert conn.transport.closed


async def test_the_drain_stops_early_when_the_client_sends_too_much(server: Server) -> None:
    conn = server.connect()
    conn.send(b"\x00bad\r\n\r\n")  # refused
    conn.send(b"z" * hardened_protocol.LINGER_MAX_BYTES, step=65536)
    assert not conn.transport.closed  # drained exactly the limit
    conn.send(b"z")
    assert conn.transport.closed
    assert len(responses(conn.transport.out)) == 1


# -- keep-alive ------------------------------------------------------------------------------------------------------
async def test_after_a_response_the_keepalive_timer_guards_the_idle_gap(server: Server) -> None:
    conn = server.connect()
    conn.send(request())
    await server.settle()
    assert only_response(conn).status == 200
    # between requests: uvicorn's keep-alive timer; the header deadline waits for the next request
    assert conn.loop.pending() == [KEEPALIVE_S]
    conn.loop.fire(KEEPALIVE_S)
    assert conn.transport.closed
    assert len(responses(conn.transport.out)) == 1


async def test_the_next_request_on_a_kept_alive_connection_gets_a_fresh_header_deadline(server: Server) -> None:
    conn = server.connect()
    conn.send(request(path="/first"))
    await server.settle()
    conn.send(b"GET /second HTTP/1.1\r\nhost: gw\r\n")  # and then nothing more
    assert conn.loop.pending() == [HEADER_TIMEOUT_S]  # keep-alive timer cancelled, deadline re-armed
    conn.loop.fire(HEADER_TIMEOUT_S)
    first, second = responses(conn.transport.out)
    assert first.status == 200 and orjson.loads(first.body)["path"] == "/first"
    assert second.status == 408 and second.envelope()["code"] == "request_timeout"
    assert conn.transport.eof


async def test_kept_alive_requests_are_each_served(server: Server) -> None:
    conn = server.connect()
    for i in range(3):
        conn.send(request("POST", f"/n{i}", f"body{i}".encode()))
        await server.settle()
        assert conn.loop.pending() == [KEEPALIVE_S]
    got = responses(conn.transport.out)
    assert [orjson.loads(r.body)["path"] for r in got] == ["/n0", "/n1", "/n2"]
    assert server.state.total_requests == 3


@pytest.mark.parametrize("path", ["/early", "/call-early"])  # as uvicorn's `send` writes it; the direct write
async def test_an_answer_before_the_body_ended_says_close_and_the_connection_closes_after_a_linger(
    server: Server, path: str
) -> None:
    conn = server.connect()
    body = b"u" * (MAX_HEADER_BYTES * 4)
    raw = request("POST", path, body)
    split = len(raw) - len(body) + 10
    conn.send(raw[:split])  # headers and the start of the body
    await server.settle()  # the app answers 401 without reading the body
    resp = only_response(conn)
    assert resp.status == 401 and resp.headers["connection"] == "close"
    assert conn.transport.eof and not conn.transport.closed  # the answer is out; the client may still be sending
    assert conn.loop.pending() == [LINGER_S]  # no keep-alive, no header deadline: the linger's end
    conn.send(raw[split:], step=512)  # the client keeps uploading what it announced: read and thrown away
    conn.send(request(path="/after"))  # ... and a next request is not one
    await server.settle()
    assert len(responses(conn.transport.out)) == 1
    conn.loop.fire(LINGER_S)
    assert conn.transport.closed and not conn.transport.aborted
    assert server.state.total_requests == 1


async def test_a_client_trickling_the_rest_of_a_body_after_an_early_answer_cannot_hold_the_connection(
    server: Server,
) -> None:
    # red-team H4: after an early 401, one more body byte cancelled uvicorn's keep-alive timer and nothing
    # replaced it: the connection stayed open with no traffic, for ever
    conn = server.connect()
    conn.send(b"POST /early HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer bogus\r\ncontent-length: 1000\r\n\r\n{")
    await server.settle()
    assert only_response(conn).status == 401
    conn.send(b" ")
    assert conn.loop.pending() == [LINGER_S]
    conn.loop.fire(LINGER_S)
    assert conn.transport.closed


async def test_a_lingering_connection_whose_client_reads_nothing_is_aborted_at_the_end(server: Server) -> None:
    conn = server.connect()
    conn.send(b"POST /early HTTP/1.1\r\nhost: gw\r\ncontent-length: 1000\r\n\r\n{")
    await server.settle()
    conn.transport.unsent = 4096  # the answer still waits in the socket's buffer
    conn.loop.fire(LINGER_S)
    assert conn.transport.aborted  # a close would wait for the client to read it, holding the slot


async def test_an_answer_after_the_whole_body_keeps_the_connection_alive(server: Server) -> None:
    conn = server.connect()
    conn.send(request("POST", "/early", b"all of it"))  # in: the app answers without reading it
    await server.settle()
    resp = only_response(conn)
    assert resp.status == 401 and "connection" not in resp.headers
    assert conn.loop.pending() == [KEEPALIVE_S] and not conn.transport.eof


# -- reading the body (Call.read_body over the cycle) ---------------------------------------------------
async def test_a_body_already_parsed_is_taken_without_a_timer_and_a_late_one_received_with_it(monkeypatch) -> None:
    from llm_gateway.errors import PayloadTooLarge
    from llm_gateway.http import call as call_module
    from llm_gateway.http.call import Call

    timers: list[float] = []
    real_timeout = asyncio.timeout

    def counting_timeout(delay: float | None) -> Any:
        timers.append(delay or 0.0)
        return real_timeout(delay)

    monkeypatch.setattr(call_module.asyncio, "timeout", counting_timeout)
    body = b'{"hi": 1}'
    received: list[str] = []

    async def receive() -> dict[str, Any]:
        received.append("receive")
        return {"type": "http.request", "body": body, "more_body": False}

    class Cycle(direct_cycle.CoalescingCycle):  # what Call reads off its `send`'s owner: the server's cycle
        def __init__(self, whole: bytes | None) -> None:  # none of uvicorn's state: only `body_now` is asked
            self.whole = whole

        def body_now(self) -> bytes | None:
            return self.whole

        async def send(self, message: Any) -> None: ...

    taken = Call({"headers": []}, receive, Cycle(body).send, "r1")  # type: ignore[arg-type]
    assert await taken.read_body(1024, 5.0) == body and timers == [] and received == []
    late = Call({"headers": []}, receive, Cycle(None).send, "r2")  # type: ignore[arg-type]
    assert await late.read_body(1024, 5.0) == body and timers == [5.0] and received == ["receive"]
    plain = Call({"headers": []}, receive, None, "r3")  # type: ignore[arg-type]  # another server: always timed
    assert await plain.read_body(1024, 5.0) == body and timers == [5.0, 5.0]
    with pytest.raises(PayloadTooLarge):  # the limit holds on the body taken at once too
        await Call({"headers": []}, receive, Cycle(body).send, "r4").read_body(len(body) - 1, 5.0)  # type: ignore[arg-type]


async def test_the_cycle_hands_over_the_body_only_once_it_was_parsed_to_its_end(server: Server) -> None:
    seen: list[bytes | None] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        cycle = send.__self__
        whole = cycle.body_now()
        seen.append(whole)
        if whole is None:  # more to come: `receive` waits for it, as before
            await echo_app(scope, receive, send)
            return
        assert cycle.body_now() == b"" and not cycle.message_event.is_set()  # taken, as `receive` takes it
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(whole))]})
        await send({"type": "http.response.body", "body": whole})

    server.config.loaded_app = app
    for split in (False, True):
        conn = server.connect()
        raw = request("POST", "/x", b"0123456789")
        conn.send(raw[:-5] if split else raw)
        await server.settle()
        if split:
            conn.send(raw[-5:])
            await server.settle()
        resp = only_response(conn)
        assert resp.status == 200 and b"0123456789" in resp.body
    assert seen == [b"0123456789", None]
    # a 100-continue still owed: `receive` writes it, so the body is not taken around it
    conn = server.connect()
    conn.send(request("POST", "/x", b"0123456789", headers={"expect": "100-continue"}))
    await server.settle()
    assert seen[-1] is None and b"100 Continue" in bytes(conn.transport.out)


async def test_a_body_in_one_piece_reaches_the_app_as_the_parser_gave_it_and_pieces_are_joined(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a coding agent's 74 KB request: uvicorn copied it into the cycle's bytearray and `bytes()` copied it out
    # again (issue 36); the gateway's `on_body` keeps a one-piece body as the parser's own bytes object
    given: list[bytes] = []
    real = GatewayProtocol.on_body

    def on_body(self: GatewayProtocol, body: bytes) -> None:
        given.append(body)
        real(self, body)

    monkeypatch.setattr(GatewayProtocol, "on_body", on_body)
    seen: list[bytes | None] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        whole = send.__self__.body_now()
        if whole is None:  # more to come: `receive` joins the pieces, as uvicorn's does
            whole = b""
            while True:
                msg = await receive()
                whole += msg["body"]
                if not msg["more_body"]:
                    break
        seen.append(whole)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(whole))]})
        await send({"type": "http.response.body", "body": whole})

    server.config.loaded_app = app
    body = bytes(range(256)) * 8
    conn = server.connect()
    conn.send(request("POST", "/x", body))
    await server.settle()
    assert only_response(conn).body == body
    assert len(given) == 1 and seen[0] is given[0]  # not a copy
    for cuts in ((100,), (100, 1500)):  # two and three pieces
        given.clear()
        conn = server.connect()
        raw = request("POST", "/x", body)
        head = len(raw) - len(body)
        at = [0, *(head + c for c in cuts), len(raw)]
        for a, b in itertools.pairwise(at):
            conn.send(raw[a:b])
        await server.settle()
        assert only_response(conn).body == body and seen[-1] == body and len(given) == len(cuts) + 1
    # past uvicorn's high-water mark, in one piece, reading pauses as uvicorn's `on_body` pauses it
    big = b"x" * (hardened_protocol.HIGH_WATER_LIMIT + 2)  # one byte held back: still over it
    conn = server.connect()
    raw = request("POST", "/x", big)
    conn.send(raw[:-1])
    assert conn.transport.read_paused  # before the app runs (its `receive` resumes reading)
    conn.send(raw[-1:])
    await server.settle()
    assert only_response(conn).body == big and not conn.transport.read_paused  # resumed as the body is taken


async def test_a_request_leaves_no_reference_cycle_behind(server: Server) -> None:
    # the garbage collector's pauses grow with what it finds: a cycle per request (as a scope holding
    # its cycle's bound methods made) cost 20-40 ms pauses at a thousand requests a second (bench/)
    import gc

    conn = server.connect()
    gc.collect()
    gc.disable()
    try:
        for i in range(50):
            conn.send(request("POST", "/whole" if i % 2 else "/x", b'{"hi": 1}'))
            await server.settle()
        assert len(responses(conn.transport.out)) == 50
        found = gc.collect()
    finally:
        gc.enable()
    assert found < 50, f"{found} objects in reference cycles after 50 requests"


# -- the direct head: what it writes itself, what it leaves to uvicorn's checks -------------------------------
def direct_head(headers: list[tuple[bytes, bytes]]) -> list[bytes] | None:
    """`_head` of a started connection's cycle (as `respond_now` and `start_now` call it)."""
    cycle = object.__new__(direct_cycle.CoalescingCycle)
    cycle.response_started = cycle.disconnected = cycle.access_log = cycle.waiting_for_100_continue = False
    cycle.flow = type("Flow", (), {"write_paused": False})()
    cycle.scope = {"method": "POST"}
    cycle.more_body = False
    cycle.default_headers = [(b"date", b"Tue, 01 Dec 2026 00:00:00 GMT")]
    cycle.keep_alive = True
    return cycle._head(200, headers)


@pytest.mark.parametrize(
    ("headers", "direct"),
    [
        ([(b"content-type", b"text/event-stream"), (b"x-request-id", b"abc")], True),
        ([], True),
        ([(b"x-ok", b"a\tb")], True),  # a tab is a legal value byte
        ([(b"x-ok", b"fine"), (b"x-bad", b"a\r\nset-cookie: x=1")], False),  # header injection
        ([(b"x-bad", b"nul\x00")], False),
        ([(b"x bad", b"1")], False),  # a space in a name
        ([(b"x-ok", b"1"), (b"x:bad", b"1")], False),
        ([(b"connection", b"close")], False),  # framing and connection headers: uvicorn reads them
        ([(b"x-ok", b"1"), (b"transfer-encoding", b"chunked")], False),
    ],
)
def test_the_direct_head_writes_only_headers_uvicorns_send_would_accept_unread(
    headers: list[tuple[bytes, bytes]], direct: bool
) -> None:
    content = direct_head(headers)
    assert (content is not None) is direct
    if content is not None:
        head = b"".join(content)
        assert head.startswith(b"HTTP/1.1 200 OK\r\ndate: ")
        for name, value in headers:
            assert b"\r\n" + name + b": " + value + b"\r\n" in head


def test_the_direct_heads_byte_check_refuses_exactly_what_uvicorns_header_regexes_refuse() -> None:
    # the check deletes the refused bytes instead of searching: the same verdict on any string only while
    # uvicorn's patterns stay single character classes (it is pinned; this fails if that ever changes)
    import random

    from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE

    rng = random.Random(5)
    alphabet = bytes(range(256))
    samples = [bytes(rng.choices(alphabet, k=rng.randint(0, 6))) for _ in range(4000)]
    samples += [bytes((b,)) for b in range(256)] + [b"x-request-id", b"text/event-stream; charset=utf-8"]
    for regex, refused in (
        (HEADER_RE, direct_cycle._NAME_REFUSED),
        (HEADER_VALUE_RE, direct_cycle._VALUE_REFUSED),
    ):
        for s in samples:
            assert (regex.search(s) is not None) == (len(s.translate(None, refused)) != len(s)), (regex.pattern, s)


def test_the_capture_keeps_what_writelines_writes_in_order_with_the_writes() -> None:
    from llm_gateway.http.direct_cycle import _Capture

    real = FakeTransport()
    cap = _Capture(real)
    cap.write(b"a")
    cap.writelines([b"b", b"c"])  # a large part with its framing (write_chunk), while `send` writes
    cap.write(b"d")
    cap.flush()
    assert bytes(real.out) == b"abcd" and real.writes == 1
