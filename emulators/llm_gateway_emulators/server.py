"""Emulator lifecycle: listen, load, die and restart on one port; in-loop and in-thread.

``Emulator`` hosts one engine in the running event loop; ``EmulatorThread`` runs one in
a background thread with its own uvloop loop for synchronous tests. Also owns the control
endpoints ``/_emulator/config``, ``/_emulator/stats`` and ``/_emulator/reset`` (never
behind the API key) and the per-request bookkeeping (stats.last_request and friends).
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import json
import socket
import threading
import time
from types import TracebackType
from typing import Any

import orjson

from llm_gateway_emulators.config import EmulatorConfig
from llm_gateway_emulators.engines import make_engine
from llm_gateway_emulators.httpserver import Connection, Request
from llm_gateway_emulators.scheduler import SlotPool
from llm_gateway_emulators.stats import Histogram, Stats

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TPOT_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)


class Emulator:
    """One emulated engine server. ``async with Emulator(cfg) as emu: ...``"""

    def __init__(self, config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        config.validate()
        self.config = config
        self.host = host
        self.bind_host = host
        self.port = port
        self.stats = Stats()
        self.pool = SlotPool(config, self.stats)
        self.hist: dict[str, Histogram] = {
            "ttft": Histogram(LATENCY_BUCKETS),
            "queue": Histogram(E2E_BUCKETS),
            "e2e": Histogram(E2E_BUCKETS),
            "tpot": Histogram(TPOT_BUCKETS),
        }
        self.started_wall = time.time()
        self.engine = make_engine(config.engine, self)
        self._server: asyncio.base_events.Server | None = None
        self._sock: socket.socket | None = None
        self._conns: set[Connection] = set()
        self._load_until = 0.0
        self._listen_task: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()

    # ---- public API -------------------------------------------------------------
    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def loading(self) -> bool:
        return asyncio.get_running_loop().time() < self._load_until

    async def __aenter__(self) -> Emulator:
        await self.start_listening()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def start_listening(self) -> None:
        """Bind (and, unless the engine listens only once loaded, accept) on the port.

        A (re)start begins the engine's loading phase of ``config.load_delay_s``."""
        if self._sock is not None:
            return
        loop = asyncio.get_running_loop()
        self.started_wall = time.time()
        self._load_until = loop.time() + max(0.0, self.config.load_delay_s)
        self.engine.on_start()
        self._sock = self._bind()
        self.port = self._sock.getsockname()[1]
        if self.engine.listen_after_load and self.config.load_delay_s > 0:
            self._listen_task = loop.create_task(self._listen_later(self.config.load_delay_s))
        else:
            await self._listen()

    async def wait_listening(self) -> None:
        await self._listening.wait()

    async def finish_loading(self) -> None:
        """End the loading phase now (and Ollama's lazy load: ``load_delay_s`` becomes 0), so a test can
        hold an engine in its loading phase as long as it needs and then release it."""
        self.config.load_delay_s = 0.0
        self._load_until = 0.0
        if self._listen_task is not None and not self._listening.is_set():
            self._listen_task.cancel()
            self._listen_task = None
            await self._listen()

    async def stop_listening(self, drop_connections: bool = True) -> None:
        """Stop accepting (connection refused) and, by default, reset open connections
        and forget queued and running work, as a dead engine would."""
        if self._listen_task is not None:
            self._listen_task.cancel()
            self._listen_task = None
        self._listening.clear()
        if self._server is not None:
            self._server.close()
            self._server = None
        elif self._sock is not None:
            self._sock.close()
        self._sock = None
        if drop_connections:
            tasks = [c.task for c in self._conns if c.task is not None]
            for conn in list(self._conns):
                conn.abort()
            self.pool.drop_all()
            if tasks:
                await asyncio.wait(tasks, timeout=2)

    async def close(self) -> None:
        await self.stop_listening()
        await asyncio.sleep(0)

    # ---- sockets ----------------------------------------------------------------
    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            if exc.errno == errno.EADDRINUSE:
                raise OSError(exc.errno, f"port {self.port} is in use") from exc
            raise
        sock.setblocking(False)
        return sock

    async def _listen_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self._listen()

    async def _listen(self) -> None:
        assert self._sock is not None
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._protocol, sock=self._sock, backlog=4096)
        self._listening.set()

    def _protocol(self) -> Connection:
        return Connection(self.handle, self._opened, self._closed, self._idle_timeout)

    def _opened(self, conn: Connection) -> None:
        self._conns.add(conn)
        self.stats.connections_open = len(self._conns)
        self.stats.connections_total += 1

    def _closed(self, conn: Connection) -> None:
        self._conns.discard(conn)
        self.stats.connections_open = len(self._conns)

    def _idle_timeout(self) -> float | None:
        cfg = self.config.keepalive_timeout_s
        return cfg if cfg is not None else self.engine.default_keepalive_s

    def is_loopback_bind(self) -> bool:
        try:
            return ipaddress.ip_address(self.bind_host).is_loopback
        except ValueError:
            return self.bind_host == "localhost"

    # ---- requests -------------------------------------------------------------------
    async def handle(self, req: Request) -> None:
        if req.path.startswith("/_emulator/"):
            await self._control(req)
            return
        stats = self.stats
        stats.http_requests_total += 1
        stats.by_path[req.path] = stats.by_path.get(req.path, 0) + 1
        record = self._record(req)
        stats.recent_requests.append(record)
        if req.method not in ("GET", "HEAD"):
            stats.last_request = record
        try:
            await self.engine.handle(req)
        finally:
            if req.status >= 400:
                stats.errors += 1

    def _record(self, req: Request) -> dict[str, Any]:
        body: Any = None
        if req.body:
            parsed, err = self.engine.parse_json(req)
            body = parsed if err is None else req.body.decode("utf-8", "replace")
        return {"method": req.method, "path": req.path, "query": req.query, "headers": dict(req.headers), "json": body}

    async def _control(self, req: Request) -> None:
        status, payload = 200, None
        try:
            if req.path == "/_emulator/config":
                if req.method == "POST":
                    updates = json.loads(req.body or b"{}")
                    if not isinstance(updates, dict):
                        raise ValueError("expected a JSON object")
                    self.config.merge(updates)
                    self.pool.rebalance()
                payload = self.config.to_dict()
            elif req.path == "/_emulator/stats":
                payload = self.stats.to_dict()
            elif req.path == "/_emulator/reset" and req.method == "POST":
                self.stats.reset()
                payload = self.stats.to_dict()
            else:
                status, payload = 404, {"error": "no such control endpoint"}
        except (ValueError, TypeError) as exc:
            status, payload = 400, {"error": str(exc)}
        body = orjson.dumps(payload)
        await req.send(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], body)


class EmulatorThread:
    """Runs an Emulator in a background thread with its own event loop."""

    def __init__(self, config: EmulatorConfig, host: str = "127.0.0.1", port: int = 0) -> None:
        self._config = config
        self._host = host
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._emu: Emulator | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def emulator(self) -> Emulator:
        assert self._emu is not None, "not started"
        return self._emu

    @property
    def url(self) -> str:
        return self.emulator.url

    @property
    def port(self) -> int:
        return self.emulator.port

    @property
    def config(self) -> EmulatorConfig:
        return self._config

    @property
    def stats(self) -> Stats:
        return self.emulator.stats

    def __enter__(self) -> EmulatorThread:
        self._thread = threading.Thread(target=self._run, name="emulator", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        try:
            import uvloop

            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover
            loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main())
        finally:
            loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            self._emu = Emulator(self._config, self._host, self._port)
            await self._emu.start_listening()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await self._emu.close()

    def _call(self, coro: Any) -> Any:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    def stop_listening(self) -> None:
        self._call(self.emulator.stop_listening())

    def start_listening(self) -> None:
        self._call(self.emulator.start_listening())

    def finish_loading(self) -> None:
        self._call(self.emulator.finish_loading())

    def wait_listening(self, timeout: float = 30) -> None:
        assert self._loop is not None
        asyncio.run_coroutine_threadsafe(self.emulator.wait_listening(), self._loop).result(timeout)
