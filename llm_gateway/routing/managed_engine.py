"""One managed backend's engine and its phase (stopped, starting, ready, stopping, crashed, failed): the gate a
request waits at, and how it loads and unloads: a process it spawns and probes (launcher.py, the adapter's
readiness probe), or, with an API `loader`, a model of an engine that runs anyway, loaded and unloaded by that
engine's own calls (adapters/model_loaders.py, over routing/managed_api.py's client). Which engine loads when,
and which one makes room, is its host's decision (routing/managed.py); the engine sees its host as a `HostView`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from llm_gateway.adapters.model_loaders import LOADERS, ModelLoader
from llm_gateway.errors import NoHealthyBackend
from llm_gateway.routing.launcher import Launcher, Process, fill_placeholders
from llm_gateway.routing.managed_api import BackendLoaderClient
from llm_gateway.routing.managed_metrics import ManagedMetrics
from llm_gateway.routing.swap_policy import Slot, may_pass
from llm_gateway.routing.table import Backend, Progress
from llm_gateway.settings import ManagedConfig, ManagedHosts
from llm_gateway.upstream.base import UpstreamClient

log = logging.getLogger("gateway.managed")
TICK_S = 0.2  # the host loop looks again at least this often (requests ending, TTLs)
READY_POLL_S = 0.1
FAILED_COOLDOWN_S = 30.0

ReadyCheck = Callable[[Backend], Awaitable[bool]]


class HostView(Protocol):
    """What an engine uses of its host (routing/managed.py's `Host`)."""

    launcher: Launcher
    metrics: ManagedMetrics
    ready_check: ReadyCheck
    upstream: Callable[[], UpstreamClient]
    first_model: dict[str, str]
    watchers: set[asyncio.Task[None]]

    @property
    def cfg(self) -> ManagedHosts: ...

    def log_path(self, backend: str) -> Path | None: ...

    def kick(self) -> None: ...


class ManagedEngine:
    """One managed backend's engine (a process, or a model loaded through its engine's API) and its phase."""

    def __init__(self, backend: Backend, host: HostView) -> None:
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
        self.api: ModelLoader | None = LOADERS.get(cfg.loader)  # None: a process the gateway starts
        self.adopted = self.api is None  # an API-managed model its engine may hold already: asked first
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
        """Ready, and its process (if it is one) not known to have exited (its watcher may not have run yet)."""
        proc_up = self.proc is not None and self.proc.returncode is None
        return self.phase == "ready" and (self.api is not None or proc_up)

    def holds(self) -> bool:
        """Has the gateway something to stop: a process, or a model it loaded (or found loaded)?"""
        return self.proc is not None or (self.api is not None and self.slot.resident)

    def describe(self) -> dict[str, object]:
        pid = self.proc.pid if self.proc is not None and self.proc.returncode is None else None
        cfg, n = self.cfg, len(self.slot.waiting)
        d = dict(phase=self.phase, host=cfg.host, memory_mb=cfg.memory_mb, waiting=n, loads=self.loads, pid=pid)
        return d if self.api is None else {**d, "loader": self.api.kind, "model": self.model}

    def notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    # -- processes ----------------------------------------------------------------------------------------
    @property
    def model(self) -> str:
        """The upstream model of the backend's first deployment (`{model}`; what an API loader loads)."""
        return self.host.first_model.get(self.backend.name, "")

    def argv(self) -> list[str]:
        parts = urlsplit(self.backend.cfg.url)
        argv, self._env = fill_placeholders(self.cfg.command, self.cfg.env, parts.port, parts.hostname, self.model)
        return argv

    def start(self) -> None:
        """Begin loading (the host loop decided there is room): a task spawns it and waits until it is ready."""
        self.phase = "starting"
        self.slot.resident, self.slot.starting = True, True
        self.backend.state, self.backend.detail = "loading", "managed: starting"
        work = self._start() if self.api is None else self._load()
        self._task = asyncio.get_running_loop().create_task(work, name=f"managed-{self.backend.name}")

    def _ready(self, t0: float) -> None:
        now = time.monotonic()
        self.phase, self.slot.starting = "ready", False
        self.slot.ready_at = self.slot.last_used = now
        self.loads += 1
        self.host.metrics.loaded(self.backend.name, now - t0)
        log.info("managed backend %s: ready in %.1fs", self.backend.name, now - t0)
        if self.api is not None:  # (a process's state is its prober's from now on)
            self.backend.state, self.backend.detail = "ready", f"managed: loaded through {self.api.kind}"
        self.notify()
        self.host.kick()

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
                    self._ready(t0)
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

    # -- models its engine loads through its own API (adapters/model_loaders.py) ----------------------------
    def _client(self, timeout_s: float) -> BackendLoaderClient:
        return BackendLoaderClient(self.host.upstream, self.backend, timeout_s)

    async def _load(self) -> None:
        """The engine's own load call, within the start timeout; a failure counts as a crash (the same backoff
        and `failed` bound as a process that dies)."""
        assert self.api is not None
        t0, t = time.monotonic(), self.cfg.start_timeout_s
        try:
            async with asyncio.timeout(t):
                await self.api.load(self._client(t), self.model)
        except Exception as e:  # LoadFailed, the upstream client's failures, the timeout
            log.error("managed backend %s: %s load of %s failed: %s", self.backend.name, self.api.kind, self.model, e)
            self.host.metrics.load_failed(self.backend.name)
            self._crashed(time.monotonic(), f"load failed: {type(e).__name__}")
            return
        if self.phase == "starting":
            self._ready(t0)

    async def _unload(self) -> None:
        """Returns once the engine no longer lists the model (or the stop timeout ran out: logged)."""
        assert self.api is not None
        t = self.cfg.stop_timeout_s
        try:
            async with asyncio.timeout(t):
                await self.api.unload(self._client(t), self.model)
        except Exception as e:  # counted as unloaded all the same: say so, the engine may still hold it
            log.warning("managed backend %s: unload of %s failed: %s", self.backend.name, self.model, e)

    async def adopt(self) -> None:
        """A model its engine holds already (loaded before the gateway started, or by another client) counts as
        resident, so that the budget sees it and the swap policy may unload it. Asked once, when first seen."""
        assert self.api is not None
        with contextlib.suppress(Exception):  # the engine not answering yet: asked again on the host's next step
            held = await self.api.loaded(self._client(self.cfg.stop_timeout_s), self.model)
            self.adopted = True
            if held and self.phase == "stopped":
                log.info("managed backend %s: %s holds %s already", self.backend.name, self.api.kind, self.model)
                self.phase, self.slot.resident = "ready", True
                self.slot.ready_at = self.slot.last_used = time.monotonic()
                self.backend.state, self.backend.detail = "ready", "managed: found loaded"
                self.notify()

    async def stop(self, reason: str) -> None:
        """Stop it (the caller checked that nothing is in flight): its memory is free once it has exited."""
        self.phase = "stopping"
        self.notify()
        proc, self.proc = self.proc, None
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if proc is not None:
            await self.host.launcher.stop(proc, self.cfg.stop_timeout_s)
        if self.api is not None and self.slot.resident:
            await self._unload()
        self.phase = "stopped"
        self.slot.resident = self.slot.starting = False
        self.slot.contended_since = None
        self.backend.state, self.backend.detail = "stopped", f"managed: stopped ({reason}); starts on demand"
        self.host.metrics.unloaded(self.backend.name, reason)
        log.info("managed backend %s: stopped (%s)", self.backend.name, reason)
        self.notify()
