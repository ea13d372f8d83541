"""Running the ASGI app under uvicorn with the gateway's server settings.

One worker per process, by design: scale out with replicas (limits shared through Redis). uvloop
and httptools for speed; on SIGTERM uvicorn stops accepting, lets requests and streams in flight
finish for up to `graceful_shutdown_s`, then the lifespan closes the upstream connections. Each
listening socket also gets an accept drain (accept_drain.py): uvloop takes one new connection per loop
iteration, the drain every one that waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Generator

import uvicorn

from llm_gateway.http.accept_drain import AcceptDrain
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.http.hardened_protocol import protocol_class
from llm_gateway.http.uvicorn_private import forget_sigterm
from llm_gateway.settings import ServerConfig


def uvicorn_config(app: GatewayApp, server: ServerConfig, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_class(
            server.max_connections, server.header_timeout_s, server.max_header_bytes, server.unauthenticated_connections
        ),
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        date_header=True,
        timeout_keep_alive=int(server.keepalive_timeout_s),
        timeout_graceful_shutdown=int(server.graceful_shutdown_s),
        backlog=4096,
        proxy_headers=False,  # the gateway does not use X-Forwarded-*; the middleware costs ~1% CPU
    )


class GatewayServer(uvicorn.Server):
    drains: list[AcceptDrain]

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self.drains = []
        await super().startup(sockets)
        if not self.started:
            return
        config, loop = self.config, asyncio.get_running_loop()

        def create_protocol() -> asyncio.Protocol:  # the factory uvicorn's own startup gives the server
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )

        if config.ssl is None:  # TLS is left to uvloop's accept (the gateway's own config has no TLS)
            for server in self.servers:
                for sock in server.sockets:
                    self.drains.append(AcceptDrain(loop, sock.fileno(), create_protocol))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for drain in self.drains:
            drain.close()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            yield
            forget_sigterm(self)  # a SIGTERM answered by draining is a clean exit (status 0), not a death by signal


def run(app: GatewayApp, server: ServerConfig, host: str, port: int) -> None:
    GatewayServer(uvicorn_config(app, server, host, port)).run()
