"""The accept drain (llm_gateway/http/accept_drain.py) on a real uvloop loop with real sockets.

Each case makes the loop wait while clients connect (the kernel completes their handshakes into the
listening socket's backlog meanwhile), then counts loop iterations, with a callback that reschedules itself,
until the server has every connection: uvloop alone takes one per iteration, the drain all of them at once.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
import uvloop

from llm_gateway.http import accept_drain
from llm_gateway.http.accept_drain import AcceptDrain
from llm_gateway.http.server import GatewayServer, uvicorn_config
from llm_gateway.settings import ServerConfig

pytestmark = pytest.mark.timeout(60)

CLIENTS = 40


class Counted(asyncio.Protocol):
    made: list[Counted] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        Counted.made.append(self)
        self.transport = transport


class Iterations:
    """Counts the loop's iterations: a callback that schedules itself again runs once per iteration."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.n = 0
        self._loop = loop
        self._on = True
        loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.n += 1
        if self._on:
            self._loop.call_soon(self._tick)

    def stop(self) -> None:
        self._on = False


def connect_while_the_loop_waits(port: int, n: int, payload: bytes = b"x") -> list[socket.socket]:
    """Block the loop (called from a coroutine, it waits) until `n` clients have connected to `port` and each
    has sent `payload`."""
    socks: list[socket.socket] = []
    done = threading.Event()

    def clients() -> None:
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(payload)
            socks.append(s)
        done.set()

    threading.Thread(target=clients, daemon=True).start()
    assert done.wait(20), "the clients could not connect"
    return socks


async def iterations_until(loop: asyncio.AbstractEventLoop, cond: Callable[[], bool], limit: int = 2000) -> int:
    it = Iterations(loop)
    try:
        while not cond():
            if it.n > limit:
                raise AssertionError(f"not after {limit} iterations")
            await asyncio.sleep(0)
        return it.n
    finally:
        it.stop()


def test_uvloop_alone_takes_one_waiting_connection_per_loop_iteration() -> None:
    """Why the drain exists (and the day uvloop accepts in a loop again, this fails and the drain can go)."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        Counted.made = []
        server = await loop.create_server(Counted, "127.0.0.1", 0, backlog=1024)
        port = server.sockets[0].getsockname()[1]
        socks = connect_while_the_loop_waits(port, CLIENTS)
        n = await iterations_until(loop, lambda: len(Counted.made) == CLIENTS)
        server.close()
        for s in socks:
            s.close()
        return n

    assert uvloop.run(main()) >= CLIENTS - 2


def test_the_drain_takes_every_waiting_connection_in_one_iteration() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        Counted.made = []
        server = await loop.create_server(Counted, "127.0.0.1", 0, backlog=1024)
        drain = AcceptDrain(loop, server.sockets[0].fileno(), Counted)
        port = server.sockets[0].getsockname()[1]
        socks = connect_while_the_loop_waits(port, CLIENTS)
        n = await iterations_until(loop, lambda: len(Counted.made) == CLIENTS)
        assert len({id(p) for p in Counted.made}) == CLIENTS  # each connection once, by one of the two
        peers = {p.transport.get_extra_info("peername") for p in Counted.made}
        assert peers == {s.getsockname() for s in socks}
        drain.close()
        server.close()
        for s in socks:
            s.close()
        return n

    assert uvloop.run(main()) <= 5  # accepted at once; each transport and its connection_made in the next two


def test_a_closed_drain_accepts_nothing_and_lets_go_of_its_descriptor() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        Counted.made = []
        server = await loop.create_server(Counted, "127.0.0.1", 0, backlog=1024)
        drain = AcceptDrain(loop, server.sockets[0].fileno(), Counted)
        fd = drain._sock.fileno()
        drain.close()
        drain.close()  # twice is once
        assert drain._sock.fileno() == -1
        with pytest.raises(OSError):
            os.fstat(fd)
        assert not loop.remove_reader(fd)
        port = server.sockets[0].getsockname()[1]
        socks = connect_while_the_loop_waits(port, 8)
        n = await iterations_until(loop, lambda: len(Counted.made) == 8)
        assert n >= 6  # uvloop's own accept, one a time: the drain took none
        server.close()
        for s in socks:
            s.close()

    uvloop.run(main())


class _NoDescriptors:
    """A listening socket whose accept fails as at the descriptor limit."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real
        self.calls = 0

    def _accept(self) -> tuple[int, Any]:
        self.calls += 1
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))

    def fileno(self) -> int:
        return self.real.fileno()

    def close(self) -> None:
        self.real.close()


def test_out_of_descriptors_the_drain_stands_aside_and_comes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accept_drain, "PAUSE_S", 1.0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        with socket.create_server(("127.0.0.1", 0)) as listener:  # only the drain reads this one
            drain = AcceptDrain(loop, listener.fileno(), Counted)
            fake = _NoDescriptors(drain._sock)
            drain._sock = fake  # type: ignore[assignment]
            with socket.create_connection(listener.getsockname()):  # it stays readable: nobody can accept
                t0 = loop.time()
                await asyncio.sleep(0.1)
                assert fake.calls == 1  # no spinning on a socket that stays readable: the reader is off
                assert drain._pause is not None
                while fake.calls < 2 and loop.time() - t0 < 10:
                    await asyncio.sleep(0.02)
                assert fake.calls == 2 and loop.time() - t0 >= 0.9  # back after the pause ...
                assert drain._pause is not None  # ... and off again
            drain.close()
            assert drain._pause is None

    uvloop.run(main())


def read_answer(s: socket.socket) -> bytes:
    s.settimeout(10)
    got = b""
    while not got.endswith(b"ok"):
        piece = s.recv(4096)
        if not piece:
            break
        got += piece
    return got


class _OneAborted:
    """A listening socket whose first accept fails as for a client that gave up in the backlog."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.aborted = False

    def _accept(self) -> tuple[int, Any]:
        if not self.aborted:
            self.aborted = True
            raise OSError(errno.ECONNABORTED, os.strerror(errno.ECONNABORTED))
        return self.real._accept()  # type: ignore[no-any-return]

    def fileno(self) -> int:
        return self.real.fileno()  # type: ignore[no-any-return]

    def close(self) -> None:
        self.real.close()


def test_a_connection_aborted_in_the_backlog_does_not_stop_the_drain() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        Counted.made = []
        with socket.create_server(("127.0.0.1", 0)) as listener:  # only the drain reads this one
            drain = AcceptDrain(loop, listener.fileno(), Counted)
            fake = _OneAborted(drain._sock)
            drain._sock = fake  # type: ignore[assignment]
            socks = connect_while_the_loop_waits(listener.getsockname()[1], 4)
            await iterations_until(loop, lambda: len(Counted.made) == 4, limit=50)
            assert fake.aborted and drain._pause is None  # skipped, not paused
            for s in socks:
                s.close()
            drain.close()

    uvloop.run(main())


async def _lifespan_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            await send({"type": msg["type"] + ".complete"})
            if msg["type"] == "lifespan.shutdown":
                return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_the_gateways_server_drains_its_listener_and_answers_every_connection() -> None:
    """GatewayServer wires a drain to each listening socket with uvicorn's protocol factory: connections
    that waited are the server's at once (uvicorn's connection set), each is answered, and shutdown
    closes the drain before the listener."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        config = uvicorn_config(_lifespan_app, ServerConfig(), "127.0.0.1", 0)  # type: ignore[arg-type]
        config.load()
        server = GatewayServer(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup()
        (drain,) = server.drains
        port = server.servers[0].sockets[0].getsockname()[1]
        socks = connect_while_the_loop_waits(port, CLIENTS, b"GET /x HTTP/1.1\r\nhost: gw\r\n\r\n")
        n = await iterations_until(loop, lambda: len(server.server_state.connections) == CLIENTS)
        assert n <= 5, n  # accepted, its transport made, connection_made: uvloop alone takes ~CLIENTS
        answers = await asyncio.gather(*(loop.run_in_executor(None, read_answer, s) for s in socks))
        assert all(a.startswith(b"HTTP/1.1 200 ") and a.endswith(b"\r\n\r\nok") for a in answers), answers
        for s in socks:
            s.close()
        await server.shutdown()
        assert drain.closed and drain._sock.fileno() == -1

    uvloop.run(main())
