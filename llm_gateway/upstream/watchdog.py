"""One timer task for every open upstream exchange, instead of a timer per request or per chunk.

Four times a second it asks each registered exchange to `check(now)` itself against its deadlines
(the total, the wait for headers, a silence mid-body); an exchange that ends leaves the set. Shared by
the upstream clients (h1_client.py, aiohttp_client.py).
"""

from __future__ import annotations

import asyncio
from typing import Generic, Protocol, TypeVar


class Timed(Protocol):
    def check(self, now: float) -> None: ...


T = TypeVar("T", bound=Timed)


class Watchdog(Generic[T]):
    """The open exchanges and the one task that times them (started with the first, ended with the last)."""

    PERIOD_S = 0.25

    def __init__(self) -> None:
        self.active: set[T] = set()
        self._task: asyncio.Task[None] | None = None

    def add(self, r: T) -> None:
        self.active.add(r)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.active:
                await asyncio.sleep(self.PERIOD_S)
                now = loop.time()
                for r in list(self.active):
                    r.check(now)
        finally:
            self._task = None

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
