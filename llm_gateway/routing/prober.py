"""Background probes: one loop per backend, cheap endpoints only, at the backend's interval.

Each probe asks the backend's adapter for readiness, served models and load (never a generation
that would load a model). Its result becomes the backend's state (`ready`, `loading`, `down`), the
load snapshot that selection reads (stamped with the gateway's own in-flight count at that moment,
so selection can tell the engine's other work from ours), the served-model list, the context
window of each served model (selection's fit check, `/v1/models`) and which models are loaded
(residency: selection prefers a loaded model to a cold load; unknown when the probe cannot tell). A probe that
fails to read load leaves the old snapshot to go stale: stale means unknown, never idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Mapping

from llm_gateway.errors import GatewayError
from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.table import Backend, RoutingTable
from llm_gateway.types import ProbeResult
from llm_gateway.upstream.base import UpstreamClient, UpstreamTimeouts

log = logging.getLogger("gateway.probe")
PROBE_BODY_LIMIT = 4 * 1024 * 1024


class BackendProbeClient:
    """The `ProbeClient` adapters see: GETs relative to the backend's URL."""

    def __init__(self, upstream: UpstreamClient, backend: Backend) -> None:
        self._upstream = upstream
        self._backend = backend
        t = backend.cfg.probe.timeout_s
        self._timeouts = UpstreamTimeouts(t, t, t, t)

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        resp = await self._upstream.send("GET", self._backend.cfg.url + path, headers or {}, None, self._timeouts)
        try:
            return resp.status, await resp.read(PROBE_BODY_LIMIT)
        finally:
            resp.close()

    def now(self) -> float:
        return time.monotonic()


async def probe_once(upstream: UpstreamClient, b: Backend, metrics: Metrics | None = None) -> ProbeResult:
    own = b.in_flight
    client = BackendProbeClient(upstream, b)
    try:
        async with asyncio.timeout(b.cfg.probe.timeout_s * 4):
            res = await b.adapter.probe(client)
    except GatewayError as e:
        res = ProbeResult("down", detail=e.message)
    except TimeoutError:
        res = ProbeResult("down", detail="probe timed out")
    except Exception as e:  # a probe must never kill its loop
        log.exception("probe of backend %s failed", b.name)
        res = ProbeResult("down", detail=f"probe error: {type(e).__name__}")
    if res.state != b.state:
        log.info("backend %s: %s -> %s %s", b.name, b.state, res.state, res.detail)
    b.state, b.detail = res.state, res.detail
    if res.load is not None:
        b.load, b.own_at_probe = res.load, own
    if res.models is not None:
        b.models = res.models
    if res.context_lengths is not None:
        b.context_lengths = res.context_lengths
    b.resident = res.resident  # it changes from probe to probe: what this one could not tell is unknown
    if metrics is not None:
        metrics.probes.labels(b.name, res.state).inc()
    return res


class Prober:
    def __init__(self, upstream: Callable[[], UpstreamClient], metrics: Metrics) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self._tasks: dict[str, tuple[Backend, asyncio.Task[None]]] = {}
        self._table: Callable[[], RoutingTable] | None = None

    def sync(self, table: RoutingTable) -> None:
        """Start loops for new backends and stop those of backends that are gone or replaced."""
        for name, (b, task) in list(self._tasks.items()):
            if table.backends.get(name) is not b:
                task.cancel()
                del self._tasks[name]
        for name, b in table.backends.items():
            if name not in self._tasks:
                self._tasks[name] = (b, asyncio.get_running_loop().create_task(self._loop(b), name=f"probe-{name}"))

    async def _loop(self, b: Backend) -> None:
        while True:
            if b.managed is None or b.managed.running():  # a managed engine that is not up is its manager's
                await probe_once(self._upstream(), b, self._metrics)
            await asyncio.sleep(b.cfg.probe.interval_s * random.uniform(0.9, 1.1))

    async def aclose(self) -> None:
        tasks = [t for _, t in self._tasks.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
