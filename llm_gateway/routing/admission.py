"""Backpressure and fair sharing per deployment: `max_concurrency` in flight and a bounded, timed wait queue
ordered by priority class, then by token-weighted fair share across keys.

`try_enter` takes a slot without waiting; `wait_enter` queues for at most `timeout_s`; `leave` hands
the slot straight to the next waiter, chosen so:
1. priority classes: a waiter of a higher class goes first (a `Ticket.priority` rank), except that
   a waiter of a lower class that has waited longer than `starvation_s` goes before anything younger
   (the oldest such first): lower classes keep moving under a flood of higher ones;
2. inside a class, a Virtual Token Counter per key (Sheng et al., "Fairness in Serving Large Language
   Models", OSDI 2024): each key's counter grows by the tokens it is admitted with (prompt + max
   output at admission, divided by its weight) and is corrected by `settle` with the real usage when
   the request ends; the waiting key with the smallest counter goes next (ties: the oldest). A key that
   starts waiting has its counter lifted to just below the smallest counter of the keys already
   waiting (it goes next, then takes its turns): idle time is not banked into a burst later. A key
   that floods gets its share of the slots, not all of them;
3. one key's own requests stay first in, first out;
4. optional reserved slots (`reserved`: rank -> n): the last n slots of the limit are kept for that class
   and the ones above it, so an interactive request never waits behind a batch that filled every slot
   (it still waits for a slot of its own class to free). This is what a work-conserving queue cannot give:
   without it a newcomer always waits for the next release.
Without fair queuing (`fair=False`) the queue is first come, first served: the oldest waiter whose class
may take the freed slot goes next (rules 1-3 do not apply, rule 4 does: a reserved slot is still kept for
its classes, and taken by them). The tickets keep their key and class either way, so what is reported per
class (queue lengths, waits, admitted tokens) is the truth in both modes.
A waiter whose client goes away (its task cancelled) or whose wait times out leaves the queue at once.
The drain rate gives the `Retry-After` of a refusal and a waiter's `eta_s`: slots freed per second of
*busy* time (every slot taken or someone waiting), over the last `DRAIN_WINDOW` releases while busy. Idle
time does not dilute it, and the silence since the last release counts (so releases that come in bursts,
as equal generations finishing together do, do not read as an instant drain). A waiter's rate counts only
the releases that left a slot its class may take (a slot reserved above its class is not one). With one
key and one class this is exactly the FIFO it replaces.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

DRAIN_WINDOW = 32  # releases remembered for the drain rate
MAX_COUNTERS = 4096  # keys whose counter is kept while they do not wait (others restart at the floor)
DEFAULT_STARVATION_S = 10.0
LIFT_MARGIN = 0.5  # tokens below the floor a key that starts waiting is lifted to


@dataclass(frozen=True, slots=True)
class Ticket:
    """What a request brings to a queue: whose it is, its class rank, its estimated tokens."""

    key: str = ""  # the key's id: its fair-share counter
    priority: int = 0  # higher goes first
    cost: float = 1.0  # tokens estimated at admission (prompt + max output)
    weight: float = 1.0  # the key's share weight: twice the weight, twice the tokens for the same counter
    label: str = ""  # the key's name, for the metrics


ANONYMOUS = Ticket()


class _Waiter:
    __slots__ = ("fut", "seq", "since", "ticket")

    def __init__(self, fut: asyncio.Future[None], ticket: Ticket, since: float, seq: int) -> None:
        self.fut = fut
        self.ticket = ticket
        self.since = since
        self.seq = seq


class Admission:
    __slots__ = (
        "_busy_s",
        "_busy_since",
        "_classes",
        "_clock",
        "_counters",
        "_drain",
        "_drain_base",
        "_queued",
        "_seq",
        "fair",
        "in_flight",
        "limit",
        "max_queue",
        "reserved",
        "starvation_s",
    )

    def __init__(
        self,
        limit: int | None,
        max_queue: int,
        *,
        starvation_s: float = DEFAULT_STARVATION_S,
        reserved: dict[int, int] | None = None,
        fair: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        #: fair queuing (classes, then each key's share); False: first come, first served
        self.fair = fair
        #: slots kept for a class rank and those above it: a lower class may not take the last ones
        self.reserved: dict[int, int] = dict(reserved or {})
        self.max_queue = max_queue
        self.starvation_s = starvation_s
        self.in_flight = 0
        self._clock = clock
        self._classes: dict[int, dict[str, deque[_Waiter]]] = {}  # priority -> key -> its waiters, oldest first
        self._counters: dict[str, float] = {}  # key -> virtual token counter
        self._queued = 0
        self._seq = 0
        #: the releases while busy, (busy seconds at the release, slots in flight just after it), oldest first
        self._drain: deque[tuple[float, int]] = deque()
        self._drain_base = 0.0  # busy seconds at the newest release that fell out of `_drain`
        self._busy_s = 0.0  # busy seconds before `_busy_since`
        self._busy_since: float | None = None  # when the current busy spell began (None: not busy)

    # -- state ------------------------------------------------------------------------------------------
    @property
    def queued(self) -> int:
        return self._queued

    def queued_by_class(self) -> dict[int, int]:
        return {p: sum(len(q) for q in keys.values()) for p, keys in self._classes.items()}

    def counter(self, key: str) -> float:
        return self._counters.get(key, 0.0)

    def can_queue(self) -> bool:
        return self._queued < self.max_queue

    def position(self, fut: asyncio.Future[None]) -> int | None:
        """How many waiters go before this one if nothing else arrives (None: not waiting)."""
        order = self._order()
        for i, w in enumerate(order):
            if w.fut is fut:
                return i
        return None

    def retry_after_s(self) -> int:
        """Seconds until a slot is likely free for a newcomer, from the queue's drain rate (at least 1)."""
        per_slot = self._seconds_per_release(None)
        if per_slot is None:
            return 1
        return max(1, min(600, math.ceil((self._queued + 1) * per_slot)))

    def eta_s(self, position: int, priority: int = 0) -> float | None:
        """Seconds until a waiter of class `priority` at this position is likely served (None: unknown):
        `position + 1` releases of a slot its class may take, at the rate they came while busy."""
        per_slot = self._seconds_per_release(self._cap_or_limit(priority))
        return None if per_slot is None else (position + 1) * per_slot

    def _seconds_per_release(self, cap: int | None) -> float | None:
        """Busy seconds per release that left fewer than `cap` slots in flight (None: every release)."""
        n = len(self._drain) if cap is None else sum(1 for _, after in self._drain if after < cap)
        if n == 0:
            return None
        since = self._busy_since
        busy = self._busy_s + (self._clock() - since if since is not None else 0.0)
        span = busy - self._drain_base
        return span / n if span > 0 else None

    def _busy_changed(self) -> None:
        """Start or end the busy spell (every slot taken, or someone waiting) after a change of state."""
        busy = self._queued > 0 or (self.limit is not None and self.in_flight >= self.limit)
        since = self._busy_since
        if busy and since is None:
            self._busy_since = self._clock()
        elif not busy and since is not None:
            self._busy_s += self._clock() - since
            self._busy_since = None

    # -- entering and leaving --------------------------------------------------------------------------
    def cap(self, priority: int) -> int | None:
        """The slots a class may fill: the limit less what is reserved for higher classes."""
        if self.limit is None:
            return None
        held = sum(n for rank, n in self.reserved.items() if rank > priority)
        return max(1, self.limit - held)

    def _cap_or_limit(self, priority: int) -> int | None:
        return self.cap(priority) if self.reserved else self.limit

    def _fits(self, priority: int) -> bool:
        cap = self._cap_or_limit(priority)
        return cap is None or self.in_flight < cap

    def try_enter(self, ticket: Ticket = ANONYMOUS) -> bool:
        if self._fits(ticket.priority):
            self.in_flight += 1
            self._charge(ticket)
            if self.in_flight == self.limit:
                self._busy_changed()
            return True
        return False

    async def wait_enter(
        self,
        timeout_s: float,
        ticket: Ticket = ANONYMOUS,
        joined: Callable[[asyncio.Future[None]], None] | None = None,
    ) -> bool:
        """Queue for a slot; False when the queue is full or the wait timed out. `joined` is told the
        waiter's future once it queues (for `position`)."""
        if self._queued == 0 and self.try_enter(ticket):
            return True  # (with waiters, a newcomer never takes a slot before them: leave() hands it over)
        if self._queued >= self.max_queue:
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        w = self._join(fut, ticket)
        if joined is not None:
            joined(fut)
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
            self._drop(w)

    def leave(self) -> None:
        self.in_flight -= 1
        since = self._busy_since
        if since is not None:  # a release while busy: how fast slots free up when they are wanted
            d = self._drain
            if len(d) == DRAIN_WINDOW:
                self._drain_base = d.popleft()[0]
            d.append((self._busy_s + self._clock() - since, self.in_flight))
        while self._queued:
            w = self._next()
            if w is None:
                break  # only classes that may not take a reserved slot are waiting
            self._drop(w)
            if not w.fut.done():
                self.in_flight += 1
                self._charge(w.ticket)
                w.fut.set_result(None)  # the slot passes to this waiter
                break
        self._busy_changed()

    def settle(self, ticket: Ticket, actual_tokens: int | None) -> None:
        """Correct a key's counter with the tokens its request really used (None: keep the estimate)."""
        if actual_tokens is None or ticket.key not in self._counters:
            return
        self._counters[ticket.key] += (actual_tokens - ticket.cost) / ticket.weight

    # -- the queue --------------------------------------------------------------------------------------
    def _charge(self, ticket: Ticket) -> None:
        if not self.fair:
            return  # first come, first served: no counters to keep
        c = self._counters
        c[ticket.key] = c.get(ticket.key, self._floor()) + ticket.cost / ticket.weight
        if len(c) > MAX_COUNTERS:
            waiting = {k for keys in self._classes.values() for k in keys}
            for k in [k for k in c if k not in waiting][: len(c) - MAX_COUNTERS]:
                del c[k]

    def _floor(self) -> float:
        """The smallest counter among the keys waiting (0 with none)."""
        waiting = [self._counters.get(k, 0.0) for keys in self._classes.values() for k in keys]
        return min(waiting) if waiting else 0.0

    def _join(self, fut: asyncio.Future[None], ticket: Ticket) -> _Waiter:
        keys = self._classes.setdefault(ticket.priority, {})
        if self.fair and not any(ticket.key in ks for ks in self._classes.values()):
            # a key that starts waiting banks no idle time: lifted to just below the least-served key waiting
            # (half a token), so that it goes next but never more than its share from then on
            floor = self._floor() - LIFT_MARGIN
            self._counters[ticket.key] = max(self._counters.get(ticket.key, floor), floor)
        self._seq += 1
        w = _Waiter(fut, ticket, self._clock(), self._seq)
        keys.setdefault(ticket.key, deque()).append(w)
        self._queued += 1
        if self._queued == 1:
            self._busy_changed()
        return w

    def _drop(self, w: _Waiter) -> None:
        keys = self._classes.get(w.ticket.priority)
        q = keys.get(w.ticket.key) if keys is not None else None
        if q is None or w not in q:
            return
        q.remove(w)
        self._queued -= 1
        if not q:
            del keys[w.ticket.key]  # type: ignore[union-attr]
            if not keys:
                del self._classes[w.ticket.priority]
        if self._queued == 0:
            self._busy_changed()

    def _next(self) -> _Waiter | None:
        """The waiter the next slot goes to (None: no waiting class may take it)."""
        classes = [p for p in self._classes if self._fits(p)]
        if not classes:
            return None
        if not self.fair:  # first come, first served: the oldest waiter whose class may take the slot
            return min((q[0] for p in classes for q in self._classes[p].values()), key=lambda w: w.seq)
        now = self._clock()
        top = max(classes)
        starved = [
            q[0] for p in classes if p != top for q in self._classes[p].values() if now - q[0].since > self.starvation_s
        ]
        if starved:
            return min(starved, key=lambda w: w.seq)
        heads = [q[0] for q in self._classes[top].values()]
        return min(heads, key=lambda w: (self._counters.get(w.ticket.key, 0.0), w.seq))

    def _order(self) -> list[_Waiter]:
        """Every waiter in the order it would be served if nothing changed (for queue positions)."""
        saved = {p: {k: deque(q) for k, q in keys.items()} for p, keys in self._classes.items()}
        counters = dict(self._counters)
        queued, in_flight, busy = self._queued, self.in_flight, (self._busy_s, self._busy_since)
        out: list[_Waiter] = []
        try:
            while self._queued:
                w = self._next()
                if w is None:  # the rest wait for a slot their class may take: in the order they would get one
                    self.in_flight = 0
                    continue
                self._drop(w)
                self._counters[w.ticket.key] = self._counters.get(w.ticket.key, 0.0) + w.ticket.cost / w.ticket.weight
                out.append(w)
        finally:
            self._classes, self._counters, self._queued, self.in_flight = saved, counters, queued, in_flight
            self._busy_s, self._busy_since = busy
        return out
