"""Managed backends: the gateway starts an engine on the first request that needs it, stops it when idle or to
make room on its host, restarts it when it dies, and stops everything it started on shutdown.

A backend with `managed` (settings/managed.py) gets a `ManagedEngine` (set as `Backend.managed`). Dispatch
admits a request to the deployment's queue as for any backend, then waits at the engine's `gate` until the
engine is ready (the queue-wait budget counts that time; a stream hears the usual `: queued` comments).
Each host has one loop (`Host`) that decides, with swap_policy.py, what loads next and what is unloaded to
make room; loads run as tasks, readiness is the adapter's own probe. An engine's process is its own process
group, stopped by that group only (launcher.py): the gateway never signals a process it did not start.
One that exits by itself is restarted after a backoff doubling each time, at most `max_restarts` times in a
row (reset after `HEALTHY_S` of service); then it is `failed` for `FAILED_COOLDOWN_S`: requests get 503 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

from llm_gateway.errors import NoHealthyBackend
from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.launcher import Launcher, Process, SubprocessLauncher
from llm_gateway.routing.managed_metrics import ManagedMetrics
from llm_gateway.routing.prober import probe_once
from llm_gateway.routing.swap_policy import Slot, contend, may_pass, next_to_load, used_mb, victim
from llm_gateway.routing.table import Backend, Progress, RoutingTable
from llm_gateway.settings import ManagedConfig, ManagedHosts
from llm_gateway.upstream.base import UpstreamClient

log = logging.getLogger("gateway.managed")
TICK_S = 0.2  # the host loop looks again at least this often (requests ending, TTLs)
READY_POLL_S = 0.1
HEALTHY_S = 30.0
FAILED_COOLDOWN_S = 30.0

ReadyCheck = Callable[[Backend], Awaitable[bool]]


class ManagedEngine:
    """One managed backend's process and its phase: stopped, starting, ready, stopping, crashed, failed."""

    def __init__(self, backend: Backend, host: Host) -> None:
        self.backend = backend
        self.host = host
        cfg = self.cfg
        self.slot = Slot(backend.name, cfg.memory_mb, cfg.priority)
        self.phase = "stopped"
        self.proc: Process | None = None
        self.crashes, self.loads = 0, 0
        self.restart_at = self.failed_until = 0.0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        backend.state, backend.detail = "stopped", "managed: starts on demand"

    @property
    def cfg(self) -> ManagedConfig:
        assert self.backend.cfg.managed is not None
        return self.backend.cfg.managed

    # -- what the table, the prober and dispatch see ------------------------------------------------------
    def startable(self) -> bool:
        return self.phase != "failed"

    def running(self) -> bool:
        """Is its process up and ready (so that the prober's view of it means something)?"""
        return self.phase == "ready"

    async def gate(self, timeout_s: float, progress: Progress | None, progress_s: float) -> bool:
        """Wait until the engine is ready and this request may go on to it (False: `timeout_s` ran out). Raises
        NoHealthyBackend when the engine failed. Returns with no await between the decision and the caller's
        attempt, which counts it in flight."""
        since = time.monotonic()
        deadline = since + timeout_s
        slot = self.slot
        slot.waiting.append(since)
        self.host.kick()
        told = -progress_s
        try:
            while True:
                now = time.monotonic()
                if self.phase == "failed":
                    raise NoHealthyBackend(
                        f"managed backend '{self.backend.name}' failed to start or kept dying; see the gateway's log",
                        headers={"retry-after": str(int(FAILED_COOLDOWN_S))},
                    )
                hosts = self.host.cfg
                if self._up() and may_pass(slot, since, now, hosts.swap_batch, hosts.swap_hold_s):
                    if since > slot.ready_at and slot.contended_since is not None:
                        slot.batch_admitted += 1
                    slot.last_used = now
                    return True
                if now >= deadline:
                    return False
                if progress is not None and progress_s > 0 and now - told >= progress_s:  # now, then each progress_s
                    told = now
                    await progress(sorted(slot.waiting).index(since), None)
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(deadline - now, progress_s or TICK_S * 5)):
                        await self._changed.wait()
        finally:
            slot.waiting.remove(since)
            self.host.kick()

    def _up(self) -> bool:
        """Ready, and its process not known to have exited (its watcher may not have run yet)."""
        return self.phase == "ready" and self.proc is not None and self.proc.returncode is None

    def describe(self) -> dict[str, object]:
        pid = self.proc.pid if self.proc is not None and self.proc.returncode is None else None
        cfg, n = self.cfg, len(self.slot.waiting)
        return dict(phase=self.phase, host=cfg.host, memory_mb=cfg.memory_mb, waiting=n, loads=self.loads, pid=pid)

    def notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    # -- processes ----------------------------------------------------------------------------------------
    def argv(self) -> list[str]:
        parts = urlsplit(self.backend.cfg.url)
        first = self.host.first_model.get(self.backend.name, "")
        fill = {"{port}": str(parts.port), "{host}": parts.hostname or "", "{model}": first}

        def sub(s: str) -> str:
            for k, v in fill.items():
                s = s.replace(k, v)
            return s

        self._env = {k: sub(v) for k, v in self.cfg.env.items()}
        return [sub(a) for a in self.cfg.command]

    def start(self) -> None:
        """Begin loading (the host loop decided there is room): a task spawns it and waits until it is ready."""
        self.phase = "starting"
        self.slot.resident, self.slot.starting = True, True
        self.backend.state, self.backend.detail = "loading", "managed: starting"
        self._task = asyncio.get_running_loop().create_task(self._start(), name=f"managed-{self.backend.name}")

    async def _start(self) -> None:
        h = self.host
        t0 = time.monotonic()
        try:
            argv = self.argv()
            log.info("managed backend %s: starting %s", self.backend.name, argv[0])
            proc = self.proc = await h.launcher.spawn(argv, self._env, self.cfg.cwd, h.log_path(self.backend.name))
        except OSError as e:
            log.error("managed backend %s: cannot start: %s", self.backend.name, e)
            self._crashed(time.monotonic(), f"cannot start: {type(e).__name__}")
            return
        watcher = asyncio.get_running_loop().create_task(self._watch(proc))
        h.watchers.add(watcher)
        watcher.add_done_callback(h.watchers.discard)
        while time.monotonic() - t0 < self.cfg.start_timeout_s:
            if proc.returncode is not None or self.phase != "starting":
                return  # the watcher books the exit
            with contextlib.suppress(Exception):
                if await h.ready_check(self.backend):
                    now = time.monotonic()
                    self.phase, self.slot.starting = "ready", False
                    self.slot.ready_at = now
                    self.slot.last_used = self.slot.ready_at
                    self.loads += 1
                    h.metrics.loaded(self.backend.name, now - t0)
                    log.info("managed backend %s: ready in %.1fs", self.backend.name, now - t0)
                    self.notify()
                    h.kick()
                    return
            await asyncio.sleep(READY_POLL_S)
        log.error("managed backend %s: not ready within %gs", self.backend.name, self.cfg.start_timeout_s)
        h.metrics.load_failed(self.backend.name)
        self.phase = "stopping"
        await h.launcher.stop(proc, self.cfg.stop_timeout_s)
        self._crashed(time.monotonic(), "not ready in time")

    async def _watch(self, proc: Process) -> None:
        rc = await proc.wait()
        if proc is self.proc and self.phase in ("starting", "ready"):
            log.warning("managed backend %s: exited by itself (%s)", self.backend.name, rc)
            self.host.metrics.died(self.backend.name)
            self._crashed(time.monotonic(), f"exited ({rc})")

    def _crashed(self, now: float, why: str) -> None:
        self.crashes += 1
        self.slot.starting = False
        if self.crashes > self.cfg.max_restarts:
            self.phase, self.failed_until = "failed", now + FAILED_COOLDOWN_S
            self.slot.resident = False
            self.backend.state, self.backend.detail = "down", f"managed: failed ({why})"
        else:
            self.phase = "crashed"  # still holds its memory: it is restarted after the backoff
            self.restart_at = now + self.cfg.restart_backoff_s * 2 ** (self.crashes - 1)
            self.backend.state, self.backend.detail = "down", f"managed: restarting ({why})"
        self.notify()
        self.host.kick()

    async def stop(self, reason: str) -> None:
        """Stop it (the caller checked that nothing is in flight): its memory is free once it has exited."""
        self.phase = "stopping"
        self.notify()
        proc, self.proc = self.proc, None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if proc is not None:
            await self.host.launcher.stop(proc, self.cfg.stop_timeout_s)
        self.phase = "stopped"
        self.slot.resident = self.slot.starting = False
        self.slot.contended_since = None
        self.backend.state, self.backend.detail = "stopped", f"managed: stopped ({reason}); starts on demand"
        self.host.metrics.unloaded(self.backend.name, reason)
        log.info("managed backend %s: stopped (%s)", self.backend.name, reason)
        self.notify()


class Host:
    """The managed engines of one host and the loop that loads and unloads them within its memory budget."""

    def __init__(self, name: str, manager: Manager) -> None:
        self.name = name
        self.manager = manager
        self.launcher: Launcher = manager.launcher
        self.metrics: ManagedMetrics = manager.metrics
        self.ready_check: ReadyCheck = manager.ready_check
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
        nxt = next_to_load(slots)
        budget = self.budget
        fits = nxt is not None and (budget is None or used_mb(slots) + nxt.memory_mb <= budget)
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
        v = victim(slots, now, self.cfg.swap_batch, self.cfg.swap_hold_s)
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
        await asyncio.gather(*(e.stop("shutdown") for e in self.engines.values() if e.proc is not None))
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
                    if e.proc is not None:
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
