"""Serving the admin API alone on `server.admin_port` (then it is not on the main port).

A second uvicorn server in the gateway's own process and event loop, on a socket bound here (so a port
in use fails the gateway's startup with an OSError, not an exit from inside a task), with the hardened
protocol of the main port (its own connection cap, and a smaller one for connections that have not shown
an admin key yet) and no lifespan (the main app's lifespan starts and stops everything). The
main server keeps the signals: on SIGTERM its shutdown closes this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator

import uvicorn
from fastapi import FastAPI

from llm_gateway.http.hardened_protocol import protocol_class
from llm_gateway.settings import ServerConfig

MAX_CONNECTIONS = 256
#: connections that showed no admin key yet: past this many the oldest is dropped, so they never fill the port
MAX_UNAUTHENTICATED = 64


class _AdminServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield  # the main server handles the signals


class AdminServer:
    def __init__(self, app: FastAPI, server: ServerConfig, host: str, port: int) -> None:
        self.config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http=protocol_class(MAX_CONNECTIONS, server.header_timeout_s, server.max_header_bytes, MAX_UNAUTHENTICATED),
            lifespan="off",
            access_log=False,
            log_config=None,
            server_header=False,
            timeout_keep_alive=int(server.keepalive_timeout_s),
            timeout_graceful_shutdown=int(server.graceful_shutdown_s),
        )
        self.server = _AdminServer(self.config)
        self._task: asyncio.Task[None] | None = None
        self.port = port

    async def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.config.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.config.host, self.config.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self.port = sock.getsockname()[1]
        self._task = asyncio.get_running_loop().create_task(self.server.serve(sockets=[sock]), name="admin-server")

    async def aclose(self) -> None:
        if self._task is not None:
            self.server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
