"""Backpressure per deployment: `max_concurrency` in flight and a bounded, timed wait queue.

`try_enter` takes a slot without waiting; `wait_enter` queues (FIFO) for at most `timeout_s`;
`leave` hands the slot straight to the oldest waiter. When the queue is full or the wait times
out, the caller answers 429 with Retry-After.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque


class Admission:
    __slots__ = ("in_flight", "limit", "max_queue", "waiters")

    def __init__(self, limit: int | None, max_queue: int) -> None:
        self.limit = limit
        self.max_queue = max_queue
        self.in_flight = 0
        self.waiters: deque[asyncio.Future[None]] = deque()

    def has_room(self) -> bool:
        return self.limit is None or self.in_flight < self.limit

    def can_queue(self) -> bool:
        return len(self.waiters) < self.max_queue

    def try_enter(self) -> bool:
        if self.limit is None or self.in_flight < self.limit:
            self.in_flight += 1
            return True
        return False

    async def wait_enter(self, timeout_s: float) -> bool:
        """Queue for a slot; False when the queue is full or the wait timed out."""
        if self.try_enter():
            return True
        if len(self.waiters) >= self.max_queue:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            return True
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                return True  # the slot was handed over just as the wait ran out: keep it
            fut.cancel()
            return False
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.leave()  # handed over, but we are going away: pass it on
            else:
                fut.cancel()
            raise
        finally:
            with contextlib.suppress(ValueError):
                self.waiters.remove(fut)

    def leave(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes to this waiter; in_flight is unchanged
                return
        self.in_flight -= 1
