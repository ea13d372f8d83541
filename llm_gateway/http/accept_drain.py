"""Taking every connection that waits on a listening socket in one loop iteration, not one per iteration.

uvloop's libuv (1.46 and later, "unix: don't accept() connections in a loop") accepts one connection each
time the listening socket is readable, so a busy event loop takes one new connection per iteration.
Measured here (uvloop 0.23): a loop whose iterations take 10 ms took 64 connections that arrived together
in 650 ms, where asyncio's own loop (which accepts up to its backlog at a time) took them in 48. Through
the gateway at c64 (iterations of 10-13 ms) the last of 64 clients' first requests was read 580 ms after
it was sent: those first requests were all of bench's ns_c64 p99 (150-180 ms through wrk; 52 ms for every
other request), and under load they are every new client's first request, a Kubernetes probe included.

So each listening socket also gets a reader, on a duplicate of its descriptor, that accepts until nothing
waits (at most `ACCEPT_BATCH` a time) and hands each connection to the loop as uvloop's own accept would:
`connect_accepted_socket` with the server's protocol factory, so the connection is the server's like any
other (uvicorn's connection set, graceful shutdown, the connection cap). uvloop's server stays as it is for
everything else; whichever of the two sees a connection first takes it, and the other finds none.
"""

from __future__ import annotations

import _socket
import asyncio
import errno
import logging
import os
from collections.abc import Callable

log = logging.getLogger("gateway.http")

#: connections taken at one readiness of a listening socket (asyncio's loop takes its backlog, 100 by default)
ACCEPT_BATCH = 256
#: out of descriptors: how long the drain stands aside (uvloop's own accept sheds connections meanwhile)
PAUSE_S = 0.1
#: errors of one accept that leave the listening socket usable
_TRANSIENT = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.ENETDOWN, errno.EHOSTUNREACH, errno.ENETUNREACH}


class AcceptDrain:
    """A reader on one listening socket that accepts every waiting connection at once."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, protocol_factory: Callable[[], asyncio.Protocol]
    ) -> None:
        self._loop = loop
        self._factory = protocol_factory
        # the same listening socket, its descriptor our own (closing it leaves the server's); `_socket`'s plain
        # socket, not `socket.socket`: its accept makes no socket object, its family and type are ints, not the
        # enums uvloop's `connect_accepted_socket` would convert them to (bench/opcounts.py: 392 bytecodes a
        # new connection with `socket.socket`)
        self._sock = _socket.socket(fileno=os.dup(fd))
        self._sock.setblocking(False)
        self._family, self._type = self._sock.family, self._sock.type
        self._adopting: set[asyncio.Task[object]] = set()  # the loop keeps only weak references to tasks
        self._pause: asyncio.TimerHandle | None = None
        self.closed = False
        loop.add_reader(self._sock.fileno(), self._ready)

    def _ready(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                fd, _ = self._sock._accept()  # type: ignore[attr-defined]  # what socket.accept calls
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in _TRANSIENT:
                    continue
                # out of descriptors or buffers: stand aside a moment rather than spin on a readable socket
                log.warning("accepting connections failed (%s); retrying in %.1f s", os.strerror(e.errno or 0), PAUSE_S)
                self._loop.remove_reader(self._sock.fileno())
                self._pause = self._loop.call_later(PAUSE_S, self._resume)
                return
            task = self._loop.create_task(self._adopt(_socket.socket(self._family, self._type, 0, fd)))
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    def _resume(self) -> None:
        self._pause = None
        if not self.closed:
            self._loop.add_reader(self._sock.fileno(), self._ready)

    async def _adopt(self, conn: _socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)  # type: ignore[arg-type]  # any socket
        except Exception:
            log.exception("a connection could not be set up")
            conn.close()

    def close(self) -> None:
        """Stop accepting (before the server's own listener closes, as uvicorn's shutdown begins)."""
        if self.closed:
            return
        self.closed = True
        if self._pause is not None:
            self._pause.cancel()
            self._pause = None
        else:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
