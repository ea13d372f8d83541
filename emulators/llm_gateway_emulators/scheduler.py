"""Slots and the queue in front of them: the emulated engine's concurrency.

``SlotPool`` grants at most ``config.slots`` concurrent generations; other requests wait
in FIFO order (``stats.waiting``). A bound on the queue is the caller's choice, because
only some engines have one (Ollama's OLLAMA_MAX_QUEUE, SGLang's --max-queued-requests).
Each busy slot carries a ``SlotInfo`` that the generation loop updates, from which
/slots, KV-usage and token gauges are computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections import deque
from dataclasses import dataclass

from llm_gateway_emulators.config import EmulatorConfig
from llm_gateway_emulators.stats import Stats


class QueueFull(Exception):
    """The request would exceed the engine's queue bound."""


@dataclass(eq=False)
class SlotInfo:
    """What one generating request reports about itself."""

    prompt_tokens: int = 0
    max_tokens: int = 0
    n_decoded: int = 0
    stream: bool = False
    task_id: int = 0
    slot_id: int = -1
    temperature: float = 0.8


class SlotPool:
    def __init__(self, config: EmulatorConfig, stats: Stats) -> None:
        self._config = config
        self._stats = stats
        self.busy: dict[int, SlotInfo] = {}
        self._free_ids: list[int] = []  # heap of released slot ids below _next_id
        self._next_id = 0
        self._waiters: deque[tuple[asyncio.Future[int], SlotInfo]] = deque()
        self._task_ids = itertools.count()

    @property
    def running(self) -> int:
        return len(self.busy)

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    def tokens_in_use(self) -> int:
        return sum(i.prompt_tokens + i.n_decoded for i in self.busy.values())

    def kv_usage(self) -> float:
        """Fraction of the emulated KV cache in use (override: config.report_kv_usage)."""
        if self._config.report_kv_usage is not None:
            return float(self._config.report_kv_usage)
        capacity = max(1, self._config.slots) * max(1, self._config.ctx_len)
        return min(1.0, self.tokens_in_use() / capacity)

    def reported_waiting(self) -> int:
        rw = self._config.report_waiting
        return self.waiting if rw is None else int(rw)

    def _free_slot_id(self) -> int:
        """The lowest slot id not in use (llama.cpp numbers slots 0..n-1)."""
        while self._free_ids:
            sid = heapq.heappop(self._free_ids)
            if sid not in self.busy:
                return sid
        sid = self._next_id
        self._next_id += 1
        return sid

    def _grant(self, info: SlotInfo) -> int:
        sid = self._free_slot_id()
        info.slot_id = sid
        info.task_id = next(self._task_ids)
        self.busy[sid] = info
        self._stats.active = len(self.busy)
        return sid

    def rebalance(self) -> None:
        """Start waiting requests if ``config.slots`` was raised."""
        self._pump()

    def _pump(self) -> None:
        while self._waiters and len(self.busy) < self._config.slots:
            fut, info = self._waiters.popleft()
            if fut.done():
                continue
            fut.set_result(self._grant(info))
        self._stats.waiting = len(self._waiters)

    async def acquire(self, info: SlotInfo, queue_bound: int | None = None) -> int:
        """Wait for a slot and return its id; raise QueueFull beyond ``queue_bound``."""
        self._pump()
        if len(self.busy) < self._config.slots and not self._waiters:
            return self._grant(info)
        if queue_bound is not None and len(self._waiters) >= queue_bound:
            raise QueueFull()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (fut, info)
        self._waiters.append(entry)
        self._stats.waiting = len(self._waiters)
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(fut.result())
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._stats.waiting = len(self._waiters)
            raise

    def release(self, slot_id: int) -> None:
        if self.busy.pop(slot_id, None) is not None:
            heapq.heappush(self._free_ids, slot_id)
        self._stats.active = len(self.busy)
        self._pump()

    def drop_all(self) -> None:
        """Forget every slot and waiter (a dead engine)."""
        for fut, _ in self._waiters:
            if not fut.done():
                fut.cancel()
        self._waiters.clear()
        self.busy.clear()
        self._free_ids.clear()
        self._next_id = 0
        self._stats.active = 0
        self._stats.waiting = 0
