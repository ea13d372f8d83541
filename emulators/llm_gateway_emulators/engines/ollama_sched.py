"""Which models an emulated Ollama has loaded, and the load/evict rules it follows (its scheduler).

As ollama/ollama server/sched.go at fb30760996871fa9460115c753afd2c60d4ab0f7 does it:

- Requests are scheduled one at a time (``processPending``: "Block other requests until we get this
  pending request running"), so a request for a model that is already loaded waits behind another
  model's load; here one lock is held from the decision to the end of the load.
- A loaded model is used as it is (``useLoadedRunner``); otherwise, with ``OLLAMA_MAX_LOADED_MODELS``
  (``envconfig.MaxRunners``) models loaded, one is unloaded first: ``findRunnerToUnload`` sorts the
  runners by session duration then name (``ByDurationAndName``), takes the first idle one (no request
  running on it, ``refCount == 0``), else the first; its session duration goes to 0 and the load waits
  until its running requests have finished (``processCompleted``) and it is unloaded. Unset (0), the
  limit is ``defaultModelsPerGPU`` (3) per GPU, at least one GPU's worth: 3 for this CPU emulator.
- Loading takes ``load_delay_s`` (the runner's start and weights), reported as ``load_duration``; a
  loaded model's ``expires_at`` is its keep-alive (5 minutes, ``envconfig.KeepAlive``) from its last use.
  Memory fit (``load``'s ``needEvict``) is not modelled: only the count limits.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from llm_gateway_emulators.config import EmulatorConfig

DEFAULT_MODELS_PER_GPU = 3  # server/sched.go defaultModelsPerGPU
KEEP_ALIVE_S = 300.0  # envconfig.KeepAlive default: 5m


@dataclass
class Runner:
    """One loaded model: requests running on it and when it expires."""

    name: str
    expires: float = 0.0
    refs: int = 0
    session_s: float = KEEP_ALIVE_S
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()


class Scheduler:
    """The loaded models of one emulated Ollama (by canonical name, ``tiny:latest``)."""

    def __init__(self, cfg: EmulatorConfig) -> None:
        self.cfg = cfg
        self.loaded: dict[str, Runner] = {}
        self.loads = 0  # cold loads done (what a test or bench can read)
        self.evictions = 0
        self._lock: asyncio.Lock | None = None

    def reset(self) -> None:
        self.loaded.clear()
        self._lock = None  # a fresh one on the server's own loop

    @property
    def max_runners(self) -> int:
        return self.cfg.max_loaded_models if self.cfg.max_loaded_models > 0 else DEFAULT_MODELS_PER_GPU

    async def acquire(self, name: str) -> tuple[Runner, int]:
        """Make ``name`` loaded and count a request on it: its runner and the load_duration (ns) it took
        (0 when it was loaded). Pair with :meth:`release` of that runner once the request is over."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            runner = self.loaded.get(name)
            loaded_ns = 0
            if runner is None:
                while len(self.loaded) >= self.max_runners:
                    victim = self._to_unload()
                    victim.session_s = 0.0
                    await victim.idle.wait()  # its running requests finish first
                    self.loaded.pop(victim.name, None)
                    self.evictions += 1
                if self.cfg.load_delay_s > 0:
                    await asyncio.sleep(self.cfg.load_delay_s)
                runner = self.loaded[name] = Runner(name)
                self.loads += 1
                loaded_ns = max(1_000_000, int(self.cfg.load_delay_s * 1e9))
            runner.refs += 1
            runner.idle.clear()
            runner.expires = time.time() + KEEP_ALIVE_S
        return runner, loaded_ns

    def release(self, runner: Runner) -> None:
        """A request on ``runner`` is over (the runner itself, so one unloaded meanwhile still goes idle)."""
        if runner.refs <= 0:
            return
        runner.refs -= 1
        if runner.refs == 0:
            runner.expires = time.time() + runner.session_s
            runner.idle.set()

    def unload(self, name: str) -> None:
        """``keep_alive: 0`` on a request with no prompt: unloaded now (once idle, here at once)."""
        self.loaded.pop(name, None)

    def _to_unload(self) -> Runner:
        runners = sorted(self.loaded.values(), key=lambda r: (r.session_s, r.name))
        return next((r for r in runners if r.refs == 0), runners[0])

    def listed(self) -> list[Runner]:
        """What ``/api/ps`` lists: the loaded models, the longest time left first (routes.go PsHandler)."""
        return sorted(self.loaded.values(), key=lambda r: -r.expires)
