"""The composition root: builds the gateway's objects from a config and wires the lifespan.

The only place that knows how the pieces fit together: shared objects are created here and hung on
the app (no module-level state), started on lifespan startup (probes, config watcher, optional
metrics port; the database of stored responses when first needed) and closed on shutdown (after
uvicorn has drained requests in flight). With admin keys configured (`admin.keys`) it also builds the
admin API (llm_gateway/admin, FastAPI, imported only then), mounted under /admin or served alone on
`server.admin_port`, and the task that keeps the runtime keys in memory in step with the database. With
`batches.enabled` (the default) it builds the Batch API's store and runner (service/batch_runner.py): the runner
starts with the gateway when there is a database that may hold batches to resume (`database.url`, or the SQLite
file exists), else with the first file or batch, and stops before the database closes.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from llm_gateway.access.memory import spend_of
from llm_gateway.access.store import InlineStore
from llm_gateway.dialects.common import HandlerContext, StoredResponses
from llm_gateway.dialects.routes import ROUTES
from llm_gateway.errors import ServiceUnavailable
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.routing.kv_events import KvEvents
from llm_gateway.routing.managed import Manager
from llm_gateway.routing.prober import Prober
from llm_gateway.service.batch_runner import Batches
from llm_gateway.service.pipeline import GenerationService
from llm_gateway.service.reload import ConfigWatcher
from llm_gateway.service.runtime import Gateway
from llm_gateway.settings import GatewayConfig
from llm_gateway.settings.server import DB_FILE
from llm_gateway.upstream.base import UpstreamClient

if TYPE_CHECKING:
    from llm_gateway.admin.refresh import KeyRefresher
    from llm_gateway.admin.server import AdminServer
    from llm_gateway.state.batches import BatchStore
    from llm_gateway.state.database import Database
    from llm_gateway.state.responses import ResponseStore
    from llm_gateway.state.usage import UsageStore

log = logging.getLogger("gateway")
GC_GEN0_THRESHOLD = 50_000
MANAGED_LOG_DIR = "managed-logs"  # under server.data_dir: the output of the engines the gateway starts
SPOOL_DIR = "ledger-spool"  # under server.data_dir: the usage ledger's crash spool (observability/spool.py)


def create_app(
    config: GatewayConfig,
    *,
    config_path: str | None = None,
    upstream: UpstreamClient | None = None,
    probes: bool = True,
    host: str | None = None,
) -> GatewayApp:
    gw = Gateway(config, upstream=upstream, config_path=config_path)
    prober = Prober(lambda: gw.upstream, gw.metrics)
    kv_events = KvEvents(lambda: gw.upstream, gw.metrics)  # engines' KV-cache events, where backends name them
    # managed backends: engines the gateway starts on demand and stops (routing/managed.py)
    managed = Manager(lambda: gw.upstream, gw.metrics, log_dir=Path(gw.server.data_dir, MANAGED_LOG_DIR))
    watcher: ConfigWatcher | None = None
    metrics_runner: web.AppRunner | None = None
    database: Database | None = None
    database_lock = asyncio.Lock()

    async def open_database() -> Database:
        """The gateway's database (SQLite under server.data_dir, or the shared database.url), opened once,
        when first needed (SQLAlchemy is imported only then): stored responses, runtime keys, audit log."""
        nonlocal database
        from llm_gateway.state.database import Database

        async with database_lock:
            if database is None:
                try:
                    database = await Database.from_config(gw.runtime.config)
                except Exception as e:  # any failure: say which (never the URL: it may hold a password)
                    log.error("the gateway's database could not be opened: %s", type(e).__name__)
                    raise ServiceUnavailable(
                        "The gateway's database could not be opened; see the gateway's log.",
                        code="database_unavailable",
                    ) from None
            return database

    async def open_usage() -> UsageStore:
        from llm_gateway.state.usage import UsageStore

        return UsageStore(await open_database())

    async def open_responses() -> ResponseStore:
        from llm_gateway.state.responses import ResponseStore

        return ResponseStore(await open_database())

    async def open_batches() -> BatchStore:
        from llm_gateway.state.batches import BatchStore

        return BatchStore(await open_database())

    refresher: KeyRefresher | None = None
    admin_server: AdminServer | None = None
    admin_app = None
    if config.admin.keys:
        from llm_gateway.admin.app import build_admin_app
        from llm_gateway.admin.context import AdminContext
        from llm_gateway.admin.refresh import KeyRefresher

        refresher = KeyRefresher(gw, open_database, config.admin.key_poll_s)
        from llm_gateway.admin import status, usage
        from llm_gateway.admin.app import ROUTERS

        admin_app = build_admin_app(AdminContext(gw, open_database, refresher), (*ROUTERS, usage.router, status.router))
        admin_app.include_router(status.page)  # the status page's HTML at /status (its data: /admin/status.json)

    syncs: set[asyncio.Task[None]] = set()

    def applied() -> None:
        """After a reload: probe loops and managed engines follow the new table."""
        if probes:
            prober.sync(gw.runtime.table)
        kv_events.sync(gw.runtime.table)
        task = asyncio.get_running_loop().create_task(managed.sync(gw.runtime.table))
        syncs.add(task)
        task.add_done_callback(syncs.discard)

    async def startup() -> None:
        nonlocal watcher, metrics_runner, admin_server
        if gw.runtime.config.auth.mode == "none":
            log.warning("auth mode is 'none': anyone who can reach this gateway can use every model")
        await gw.store.warm_up()
        await managed.sync(gw.runtime.table)
        if probes:
            prober.sync(gw.runtime.table)
        kv_events.sync(gw.runtime.table)
        if config_path is not None:
            watcher = ConfigWatcher(
                gw,
                config_path,
                gw.server.reload_poll_s,
                on_applied=applied,
                vet=refresher.name_clashes if refresher is not None else None,  # names unique across key kinds
            )
            watcher.start()
        if gw.server.metrics_port is not None:
            metrics_runner = await _serve_metrics(gw, host or gw.server.host, gw.server.metrics_port)
        if refresher is not None:
            refresher.start()
        if gw.usage.enabled:  # the usage ledger, written behind the request path (observability/ledger.py)
            usage = gw.runtime.config.usage
            await _restore_budgets(gw, open_usage)
            gw.usage.start(open_usage, Path(gw.server.data_dir, SPOOL_DIR) if usage.spool else None)
        if batches is not None and _has_database(gw.runtime.config):
            batches.runner.start()  # the batches this database holds resume (a new one starts it otherwise)
        if admin_app is not None and gw.server.admin_port is not None:
            from llm_gateway.admin.server import AdminServer

            admin_server = AdminServer(admin_app, gw.server, host or gw.server.host, gw.server.admin_port)
            await admin_server.start()
        # Everything built so far lives as long as the process: move it out of the collector's sight, and
        # collect the young generation less often (request objects die by refcount; measured in bench/)
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, 20, 20)
        log.info(
            "llm-gateway ready: %d models on %d backends", len(gw.runtime.table.models), len(gw.runtime.table.backends)
        )

    async def shutdown() -> None:
        if watcher is not None:
            await watcher.aclose()
        await prober.aclose()
        await kv_events.aclose()
        await managed.aclose()  # every engine it started, by process group
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        if admin_server is not None:
            await admin_server.aclose()
        if refresher is not None:
            await refresher.aclose()
        if batches is not None:
            await batches.runner.aclose()  # its lines in flight are given back for the next start to take
        await gw.usage.aclose()  # the last rows of the ledger, before the database closes
        await stored.aclose()
        if database is not None:
            await database.aclose()
        await gw.aclose()

    stored = StoredResponses(open_responses)
    service = GenerationService(gw)
    batches = Batches(open_batches, gw, service) if config.batches.enabled else None
    context = HandlerContext(service, gw.server, gw.metrics, int(time.time()), stored, batches)
    app = GatewayApp(
        gw,
        ROUTES,
        context,
        on_startup=startup,
        on_shutdown=shutdown,
        admin=admin_app if gw.server.admin_port is None else None,
    )
    return app


def _has_database(config: GatewayConfig) -> bool:
    """A shared database is configured, or the embedded one exists already: a database that may hold batches to
    resume. A gateway that never kept anything does not create one at start."""
    return config.database.url is not None or Path(config.server.data_dir, DB_FILE).exists()


async def _restore_budgets(gw: Gateway, open_usage: Callable[[], Awaitable[UsageStore]]) -> None:
    """Budgets outlive the process: an in-process store starts from what the ledger says each key spent in
    the current UTC day and month (a shared store, Redis, keeps its own counters)."""
    store = gw.store
    if not isinstance(store, InlineStore):
        return
    now = time.time()
    today = dt.datetime.fromtimestamp(now, dt.UTC)
    since_ms = int(dt.datetime(today.year, today.month, 1, tzinfo=dt.UTC).timestamp() * 1000)  # the month began
    try:
        rows = await (await open_usage()).spend_since(since_ms)
    except Exception as e:  # the gateway still starts; the budgets then count from zero, and the log says so
        log.error("budgets could not be restored from the usage ledger (%s): they count from zero", type(e).__name__)
        return
    models = gw.runtime.config.models
    prices = {m.name: (m.price.input_per_million, m.price.output_per_million) for m in models if m.price}
    store.restore(spend_of(rows, prices, now))
    log.info("budgets restored from the usage ledger: %d rows since the start of the month", len(rows))


async def _serve_metrics(gw: Gateway, host: str, port: int) -> web.AppRunner:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(
            body=gw.metrics.render(), headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner
