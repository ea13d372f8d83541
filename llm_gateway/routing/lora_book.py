"""Which LoRA adapters one engine holds, and the rules of where an adapter goes: pure (no I/O, no clock).

Each backend has a `LoraBook`: the adapters loaded (or loading, or unloading) on its engine, each with the
requests in flight on it and when it was last used. routing/lora.py loads and unloads through the engine and
keeps the book; selection reads `holds` (a deployment of an adapter its engine holds counts as resident, so the
request goes to a replica that has it: routing/selection.py's cold-load rule).

- Room: an engine holds at most `limit` adapters (the backend's `max_adapters`; None: no cap); one loading or
  unloading takes its place too.
- Which makes room: the least recently used adapter with nothing in flight that is loaded (not one loading or
  unloading). One with a request in flight is never unloaded; with none idle, a load waits for one to be.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Held:
    """One adapter on one engine."""

    name: str
    state: str = "loading"  # loading | ready | unloading
    in_flight: int = 0
    last_used: float = 0.0
    engine_id: int | None = None  # the engine's handle (llama-server's adapter id)
    #: set once its load or unload is over (a request for it waits on this meanwhile)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: str | None = None  # why its load failed (told to the requests that waited for it)


def victim(held: Iterable[Held]) -> Held | None:
    """The adapter to unload to make room: loaded, nothing in flight, least recently used (None: none may go)."""
    idle = [h for h in held if h.state == "ready" and h.in_flight == 0]
    return min(idle, key=lambda h: h.last_used) if idle else None


def has_room(count: int, limit: int | None) -> bool:
    return limit is None or count < limit


class LoraBook:
    """The adapters one engine holds (kept across reloads with its backend)."""

    def __init__(self) -> None:
        self.held: dict[str, Held] = {}
        self.limit: int | None = None
        self._changed = asyncio.Event()

    def holds(self, name: str) -> bool:
        h = self.held.get(name)
        return h is not None and h.state == "ready"

    def resident(self) -> list[str]:
        return sorted(n for n, h in self.held.items() if h.state == "ready")

    def pin(self, h: Held, now: float) -> None:
        h.in_flight += 1
        h.last_used = now

    def unpin(self, name: str, now: float) -> None:
        h = self.held.get(name)
        if h is not None and h.in_flight > 0:
            h.in_flight -= 1
            h.last_used = now
            if h.in_flight == 0:
                self.notify()

    def forget(self, name: str) -> None:
        """The engine no longer has it (it restarted): loaded again on the next request."""
        h = self.held.get(name)
        if h is not None and h.state == "ready" and h.in_flight == 0:
            del self.held[name]
            self.notify()

    def notify(self) -> None:
        ev, self._changed = self._changed, asyncio.Event()
        ev.set()

    async def changed(self, timeout_s: float) -> bool:
        """Wait until something in the book changes (False: `timeout_s` ran out first)."""
        ev = self._changed
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                await ev.wait()
        except TimeoutError:
            return False
        return True

    def describe(self) -> dict[str, object]:
        return {
            "limit": self.limit,
            "adapters": {n: {"state": h.state, "in_flight": h.in_flight} for n, h in sorted(self.held.items())},
        }
