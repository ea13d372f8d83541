"""Managed backends: the gateway starts an engine on the first request that needs it, stops it when idle or to
make room on its host, restarts it when it dies, and stops everything it started on shutdown.

A backend with `managed` (settings/managed.py) gets a `ManagedEngine` (set as `Backend.managed`). Dispatch
admits a request to the deployment's queue as for any backend, then waits at the engine's `gate` until the
engine is ready (the queue-wait budget counts that time; a stream hears the usual `: queued` comments).
Each host has one loop (`Host`) that decides, with swap_policy.py, what loads next and what is unloaded to
make room (in its memory budget, and in a swap group, where one member runs at a time); loads run as tasks,
readiness is the adapter's own probe. An engine's process is its own process group, stopped by that group
only (launcher.py): the gateway never signals a process it did not start.
One that exits by itself is restarted after a backoff doubling each time, at most `max_restarts` times in a
row (reset after `HEALTHY_S` of service); then it is `failed` for `FAILED_COOLDOWN_S`: requests get 503 at once.
A backend with an API `loader` is one model of an engine that runs anyway (Ollama, llama-server's router, vLLM's
sleep mode; managed_engine.py): the same phases, budget and swap policy, but the engine's own load and unload
calls instead of a process, and a model the engine holds already is adopted as resident on first sight.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from pathlib import Path

from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.launcher import Launcher, SubprocessLauncher
from llm_gateway.routing.managed_engine import FAILED_COOLDOWN_S, TICK_S, ManagedEngine, ReadyCheck
from llm_gateway.routing.managed_metrics import ManagedMetrics
from llm_gateway.routing.prober import probe_once
from llm_gateway.routing.swap_policy import contend, next_to_load, used_mb, victim
from llm_gateway.routing.table import Backend, RoutingTable
from llm_gateway.settings import ManagedHosts
from llm_gateway.upstream.base import UpstreamClient

log = logging.getLogger("gateway.managed")
HEALTHY_S = 30.0  # a restarted engine's crash count is forgotten after this long in service


class Host:
    """The managed engines of one host and the loop that loads and unloads them within its memory budget."""

    def __init__(self, name: str, manager: Manager) -> None:
        self.name = name
        self.manager = manager
        self.launcher: Launcher = manager.launcher
        self.metrics: ManagedMetrics = manager.metrics
        self.ready_check: ReadyCheck = manager.ready_check
        self.upstream: Callable[[], UpstreamClient] = manager.upstream
        self.engines: dict[str, ManagedEngine] = {}
        self.first_model: dict[str, str] = {}
        self.watchers: set[asyncio.Task[None]] = set()
        self._kick = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def cfg(self) -> ManagedHosts:
        return self.manager.cfg

    @property
    def budget(self) -> float | None:
        return self.manager.cfg.memory_budget_mb.get(self.name)

    def log_path(self, backend: str) -> Path | None:
        d = self.manager.log_dir
        return None if d is None else d / f"{backend}.log"

    def kick(self) -> None:
        self._kick.set()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"managed-host-{self.name}")

    async def _run(self) -> None:
        while not self._closed:
            try:
                while await self.step():
                    pass
            except Exception:  # the loop must never die
                log.exception("managed host %s: step failed", self.name)
            self._kick.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):  # (not wait_for: on 3.11 it can swallow a cancel)
                    await self._kick.wait()

    async def step(self) -> bool:
        """One decision; True when it changed something (look again at once)."""
        now = mono = time.monotonic()
        engines = list(self.engines.values())
        for e in engines:
            if not e.adopted:
                await e.adopt()
        for e in engines:
            e.slot.in_flight = e.backend.in_flight
            if e.slot.in_flight:
                e.slot.last_used = now
            if e.phase == "failed" and mono >= e.failed_until:
                e.phase, e.crashes = "stopped", 0
            if e.phase == "ready" and e.crashes and now - e.slot.ready_at >= HEALTHY_S:
                e.crashes = 0
        for e in engines:
            if e.phase == "crashed" and mono >= e.restart_at:
                self.metrics.restarted(e.backend.name)
                e.start()
                return True
        for e in engines:
            ttl, s = e.cfg.idle_ttl_s, e.slot
            if e.phase == "ready" and ttl is not None and not (s.in_flight or s.waiting) and now - s.last_used >= ttl:
                await e.stop("idle")
                return True
        slots = [e.slot for e in engines if e.phase != "failed"]
        budget, group_of = self.budget, self.cfg.group_of()
        over = budget is not None and used_mb(slots) > budget  # models found loaded (adopted) beyond the budget
        if over and (v := victim([s for s in slots if not s.waiting], now, 1, 0.0)) is not None:
            await self.engines[v.name].stop("over_budget")
            return True
        for s in slots:  # two of one swap group found loaded (adopted): the idle one goes
            mates = [t for t in slots if t.resident and t.name in group_of.get(s.name, ())]
            if len(mates) > 1 and (v := victim([t for t in mates if not t.waiting], now, 1, 0.0)) is not None:
                await self.engines[v.name].stop("over_budget")
                return True
        nxt = next_to_load(slots)
        # a resident engine of nxt's swap group must go before nxt loads, whatever the budget
        rivals = [] if nxt is None else [s for s in slots if s.resident and s.name in group_of.get(nxt.name, ())]
        fits = nxt is not None and not rivals and (budget is None or used_mb(slots) + nxt.memory_mb <= budget)
        contend(slots, nxt is not None and not fits, now)
        if nxt is None:
            return False
        target = self.engines[nxt.name]
        if fits:
            target.start()
            return True
        if budget is not None and nxt.memory_mb > budget:
            log.error("managed backend %s needs %g MB, over host %s's budget", nxt.name, nxt.memory_mb, self.name)
            target.phase, target.failed_until = "failed", mono + FAILED_COOLDOWN_S
            target.notify()
            return False
        v = victim(rivals or slots, now, self.cfg.swap_batch, self.cfg.swap_hold_s)
        if v is None:
            for e in engines:  # held-back waiters re-check (a batch ended)
                e.notify()
            return False
        self.metrics.swapped(self.name)
        await self.engines[v.name].stop("evicted")
        return True

    async def aclose(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        await asyncio.gather(*(e.stop("shutdown") for e in self.engines.values() if e.holds()))
        for w in list(self.watchers):
            w.cancel()


class Manager:
    """Every managed engine of the process, by host; `sync` follows the routing table across reloads."""

    def __init__(
        self,
        upstream: Callable[[], UpstreamClient],
        metrics: Metrics,
        *,
        launcher: Launcher | None = None,
        ready_check: ReadyCheck | None = None,
        log_dir: Path | None = None,
    ) -> None:
        self.cfg = ManagedHosts()
        self.launcher: Launcher = launcher or SubprocessLauncher()
        self.upstream = upstream
        self.ready_check: ReadyCheck = ready_check or self._probe_ready
        self.log_dir = log_dir
        self.hosts: dict[str, Host] = {}
        self._registry = metrics
        self._metrics: ManagedMetrics | None = None  # registered with the first managed backend

    @property
    def metrics(self) -> ManagedMetrics:
        if self._metrics is None:
            self._metrics = ManagedMetrics(self._registry, self.snapshot)
        return self._metrics

    async def _probe_ready(self, b: Backend) -> bool:
        return (await probe_once(self.upstream(), b)).state == "ready"

    def snapshot(self) -> list[tuple[str, float | None, list[tuple[str, bool, int, float]]]]:
        """What the metrics read at scrape time: per host, its budget and its engines."""
        return [
            (
                h.name,
                h.budget,
                [(n, e.slot.resident, len(e.slot.waiting), e.slot.memory_mb) for n, e in h.engines.items()],
            )
            for h in self.hosts.values()
        ]

    def engines(self) -> list[ManagedEngine]:
        return [e for h in self.hosts.values() for e in h.engines.values()]

    async def sync(self, table: RoutingTable) -> None:
        """Attach an engine to each managed backend of `table`; stop those whose backend is gone or replaced."""
        self.cfg = table.config.managed
        wanted = {n: b for n, b in table.backends.items() if b.cfg.managed is not None}
        for host in self.hosts.values():
            for name, e in list(host.engines.items()):
                b = wanted.get(name)
                if b is None or b is not e.backend or b.cfg.managed is None or b.cfg.managed.host != host.name:
                    del host.engines[name]
                    if e.holds():
                        await e.stop("removed")
        for name, b in wanted.items():
            assert b.cfg.managed is not None
            h = self.hosts.get(b.cfg.managed.host) or self.hosts.setdefault(
                b.cfg.managed.host, Host(b.cfg.managed.host, self)
            )
            if name not in h.engines:
                b.managed = h.engines[name] = ManagedEngine(b, h)
            e = h.engines[name]
            e.slot.memory_mb, e.slot.priority = e.cfg.memory_mb, e.cfg.priority
            self.metrics.track(name, h.name)
            h.first_model[name] = next(
                (d.upstream_model for m in table.models for d in m.deployments if d.backend is b), ""
            )
            h.start()

    async def aclose(self) -> None:
        """Stop every process the gateway started (by its process group), and the loops."""
        for h in self.hosts.values():
            await h.aclose()
