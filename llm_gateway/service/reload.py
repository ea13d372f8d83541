"""Config hot reload: on SIGHUP and when the config file changes.

The new file is read and validated completely first; only a valid config is swapped in (one
reference, see `Gateway.apply`), and requests in flight finish on the runtime they started with.
An invalid file keeps the running config, logs what is wrong (file, field, line) and counts the
failure in `gateway_config_reloads_total{result="failure"}`. The runtime keys (created through the
admin API, held by the authenticator) are carried over to the new runtime in the same step. A valid file
can still be refused by `vet` (given by the composition root): with the admin API on, a config whose
keys take a runtime key's name is refused whole, the same way, with the reason in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from llm_gateway.service.runtime import Gateway
from llm_gateway.settings import GatewayConfig
from llm_gateway.settings.loader import ConfigError, load_config

#: why a valid config may not be applied now, or None
Vet = Callable[[GatewayConfig], Awaitable[str | None]]

log = logging.getLogger("llm_gateway.service.reload")


def _fingerprint(path: Path) -> bytes | None:
    try:
        return hashlib.sha256(path.read_bytes()).digest()
    except OSError:
        return None


class ConfigWatcher:
    def __init__(
        self,
        gw: Gateway,
        path: str,
        poll_s: float,
        on_applied: Callable[[], None] | None = None,
        vet: Vet | None = None,
    ) -> None:
        self.gw = gw
        self._vet = vet
        self.path = Path(path)
        self.poll_s = poll_s
        self._on_applied = on_applied
        self._seen = _fingerprint(self.path)
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, lambda: loop.create_task(self.reload("SIGHUP")))
        if self.poll_s > 0:
            self._task = loop.create_task(self._poll(), name="config-watch")

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            fp = await asyncio.to_thread(_fingerprint, self.path)
            if fp is not None and fp != self._seen:
                await self.reload("file changed")

    async def reload(self, reason: str) -> bool:
        async with self._lock:
            self._seen = await asyncio.to_thread(_fingerprint, self.path)
            try:
                cfg = await asyncio.to_thread(load_config, self.path)
            except ConfigError as e:
                self.gw.metrics.config_reloads.labels("failure").inc()
                log.error("config reload (%s) rejected; the running config stays:\n%s", reason, e)
                return False
            problem = None if self._vet is None else await self._vet(cfg)
            if problem is not None:
                self.gw.metrics.config_reloads.labels("failure").inc()
                log.error("config reload (%s) rejected; the running config stays: %s", reason, problem)
                return False
            try:
                old = self.gw.runtime
                self.gw.apply(cfg)
                self.gw.runtime.auth.set_runtime_keys(old.auth.runtime_keys)  # no await between: no gap
            except Exception:
                self.gw.metrics.config_reloads.labels("failure").inc()
                log.exception("config reload (%s) could not be applied; the running config stays", reason)
                return False
            self.gw.metrics.config_reloads.labels("success").inc()
            self.gw.metrics.config_last_reload.set_to_current_time()
            log.warning("config reloaded (%s): %d models, %d backends", reason, len(cfg.models), len(cfg.backends))
            if self._on_applied:
                self._on_applied()
            return True

    async def aclose(self) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
