"""Which managed engine loads next and which one makes room: the swap policy, pure (no processes, no clock).

Engines of one host share its memory budget (settings/managed.py). Each engine's `Slot` says what the
policy needs: is it resident (running or starting), how many requests are in flight on it and how many wait
at its gate, since when, when it was last used, its memory and priority.

- Next to load: of the engines not resident with requests waiting, the one whose oldest request has waited
  longest (first come, first served across models: a model that waits is loaded in its turn).
- Room: it loads when its memory fits beside the resident ones; else the least valuable resident engine is
  unloaded first: one with nothing in flight and nothing waiting (lowest priority, then idle longest), else
  one with nothing in flight whose waiters were held back by the batching rule (below). An engine with a
  request in flight is never unloaded; one still starting is not either (its requests are on their way).
- No thrash (batching): once another model waits for room, a resident engine is `contended`. It still serves
  every request that had queued for it before that moment and up to `batch` newcomers, for at most `hold_s`;
  later newcomers wait (`frozen`), so it drains, is swapped out, and they are served when it loads again,
  after the models that waited before them. A swap therefore serves a batch per model, bounded: nobody
  starves for more than (models ahead) x (load time + batch or hold_s).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(eq=False)
class Slot:
    name: str
    memory_mb: float = 0.0
    priority: int = 0
    resident: bool = False  # its process runs (starting or ready)
    starting: bool = False
    in_flight: int = 0
    waiting: list[float] = field(default_factory=list)  # when each request now at its gate began to wait
    last_used: float = 0.0
    ready_at: float = 0.0  # when it last became ready: a waiter older than that had queued for this load
    contended_since: float | None = None  # since when another model waits for room (None: nobody)
    batch_admitted: int = 0  # newcomers admitted since then

    @property
    def oldest_wait(self) -> float | None:
        return min(self.waiting) if self.waiting else None


def frozen(s: Slot, now: float, batch: int, hold_s: float) -> bool:
    """Does the batching rule hold back a newcomer to `s` (another model waits and `s` had its batch)?"""
    c = s.contended_since
    return c is not None and (s.batch_admitted >= batch or now - c >= hold_s)


def may_pass(s: Slot, since: float, now: float, batch: int, hold_s: float) -> bool:
    """May a request that began to wait at `since` go on to the ready engine `s`? One that had queued before it
    became ready always may (the load was for it); a newcomer unless the batching rule holds it back."""
    return since <= s.ready_at or not frozen(s, now, batch, hold_s)


def next_to_load(slots: Iterable[Slot]) -> Slot | None:
    """The engine not resident whose oldest waiting request has waited longest (None: nobody waits)."""
    best: Slot | None = None
    for s in slots:
        if s.resident or not s.waiting:
            continue
        if best is None or s.oldest_wait < best.oldest_wait:  # type: ignore[operator]
            best = s
    return best


def victim(slots: Iterable[Slot], now: float, batch: int, hold_s: float) -> Slot | None:
    """The resident engine to unload to make room (None: none may be): nothing in flight and nothing waiting
    (lowest priority, then idle longest), else nothing in flight and its waiters held back by the batching rule."""
    idle = [s for s in slots if s.resident and not s.starting and s.in_flight == 0]
    free = [s for s in idle if not s.waiting]
    if free:
        return min(free, key=lambda s: (s.priority, s.last_used))
    held = [s for s in idle if frozen(s, now, batch, hold_s)]
    return min(held, key=lambda s: (s.priority, s.last_used)) if held else None


def used_mb(slots: Iterable[Slot]) -> float:
    return sum(s.memory_mb for s in slots if s.resident)


def contend(slots: Iterable[Slot], waiting_for_room: bool, now: float) -> None:
    """Mark the resident engines contended while some model waits for room (and clear them when none does)."""
    for s in slots:
        if waiting_for_room and s.resident:
            if s.contended_since is None:
                s.contended_since, s.batch_admitted = now, 0
        else:
            s.contended_since, s.batch_admitted = None, 0
