"""The in-process limit store: sliding-window logs in memory, for one gateway process.

Same semantics as the Redis store (see store.py); exact for one process, N times the limit for N
replicas, which is why replicas share `RedisStore` instead.

Its counters live as long as the process; budgets must outlive it (a daily budget is not "per process
lifetime"). So at start the composition root hands it what the usage ledger (in the gateway's database,
written behind the request path) says each key spent in the current UTC day and month: `spend_of` sums
the ledger's rows per scope and period, `restore` sets the budget counters from them.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence

from llm_gateway.access.store import (
    WINDOW_S,
    Decision,
    Quota,
    Reservation,
    ScopeLimits,
    Shrink,
    budget_message,
    key_scope,
    model_scope,
    period_of,
    token_cost,
)

#: one ledger group: key, public model, UTC day (YYYY-MM-DD), prompt tokens, completion tokens
SpendRow = tuple[str, str, str, int, int]


def spend_of(
    rows: Iterable[SpendRow], prices: Mapping[str, tuple[float, float]], now_s: float
) -> dict[tuple[str, str], tuple[int, int]]:
    """(scope, period id) -> (tokens, cost in COST_UNITS) spent in the current UTC day and calendar month,
    for every key's own scope and its scope on each model, from ledger rows (older rows are left out)."""
    today, _ = period_of("day", now_s)
    month, _ = period_of("month", now_s)
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for key, model, day, prompt, completion in rows:
        at = dt.datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=dt.UTC).timestamp()
        price = prices.get(model)
        tokens = prompt + completion
        cost = token_cost(price, prompt, completion) if price is not None else 0
        pids = [p for p in (period_of("day", at)[0], period_of("month", at)[0]) if p in (today, month)]
        for scope in (key_scope(key), model_scope(key, model)):
            for pid in pids:
                t, c = out.get((scope, pid), (0, 0))
                out[scope, pid] = (t + tokens, c + cost)
    return out


class _Window:
    """Entries of the window in arrival order: timestamps and weights in two deques of floats (nothing
    for the cyclic GC to walk, however long the window), with their running total. An entry is named
    by its sequence number, so a settlement can correct it in place while it is still in the window."""

    __slots__ = ("base", "total", "ts", "w")

    def __init__(self) -> None:
        self.ts: deque[float] = deque()
        self.w: deque[float] = deque()
        self.total = 0.0
        self.base = 0  # sequence number of ts[0]

    def prune(self, horizon: float) -> None:
        ts, w = self.ts, self.w
        while ts and ts[0] <= horizon:
            ts.popleft()
            self.total -= w.popleft()
            self.base += 1

    def add(self, now: float, weight: float) -> int:
        self.ts.append(now)
        self.w.append(weight)
        self.total += weight
        return self.base + len(self.ts) - 1

    def adjust(self, seq: int, weight: float) -> None:
        i = seq - self.base
        n = len(self.w)
        if 0 <= i < n:  # not pruned yet; index from the right end, where recent entries are
            i -= n
            self.total += weight - self.w[i]
            self.w[i] = weight

    def reset_after(self, now: float) -> float:
        return self.ts[0] + WINDOW_S - now if self.ts else 0.0

    def wait_for(self, need: float, limit: float, now: float) -> float:
        """Seconds until `need` more fits under `limit`."""
        free = limit - self.total
        for ts, w in zip(self.ts, self.w, strict=True):
            if free >= need:
                break
            free += w
            if free >= need:
                return ts + WINDOW_S - now
        return self.reset_after(now) if free < need else 0.0


class _Budget:
    """One scope's budget counters: used tokens and cost per period id, for the current period and the
    one before it (whose requests may still be settling)."""

    __slots__ = ("cost", "current", "tokens")

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.cost: dict[str, int] = {}
        self.current: str | None = None

    def enter(self, pid: str) -> None:
        """The first charge of a new period drops the counters of every period but the last one."""
        if pid == self.current:
            return
        keep = {pid, self.current}
        for counters in (self.tokens, self.cost):
            for old in [k for k in counters if k not in keep]:
                del counters[old]
        self.current = pid


class MemoryStore:
    """Exact, in-process. The clocks are injectable for tests: `clock` (monotonic) for the windows,
    `wall` (unix time) for the UTC periods of budgets."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._wall = wall
        self._ids = itertools.count()
        self._req: dict[str, _Window] = {}
        self._tok: dict[str, _Window] = {}
        self._conc: dict[str, dict[str, float]] = {}
        self._budgets: dict[str, _Budget] = {}

    async def reserve(
        self, rid: str, scopes: Sequence[ScopeLimits], tokens: int, cost: int = 0, shrink: Shrink | None = None
    ) -> tuple[Decision, Reservation]:
        return self.reserve_now(rid, scopes, tokens, cost, shrink)

    def _budget_check(
        self, scopes: Sequence[ScopeLimits], res: Reservation, shrink: Shrink | None
    ) -> tuple[Decision | None, Quota | None, Quota | None]:
        """The budgets of every scope: a refusal (None: they all fit) and the first budgeted scope's quotas.
        With `shrink`, the reservation (`res.tokens`, `res.cost`) is first cut to what the budgets have room for."""
        wall = self._wall()
        refusal: Decision | None = None
        bt: Quota | None = None
        bc: Quota | None = None
        found: list[tuple[ScopeLimits, str, float, _Budget]] = []
        room_t: int | None = None
        room_c: int | None = None
        for s in scopes:
            if s.budget_tokens is None and s.budget_cost is None:  # (not the property: a call less a scope)
                continue
            pid, end = period_of(s.period, wall)
            res.periods[s.scope] = pid
            b = self._budgets.get(s.scope) or self._budgets.setdefault(s.scope, _Budget())
            reset = end - wall
            found.append((s, pid, reset if reset > 0.001 else 0.001, b))  # (no builtin min/max: a call each)
            if s.budget_tokens is not None:
                left = s.budget_tokens - b.tokens.get(pid, 0)
                if room_t is None or left < room_t:
                    room_t = left
            if s.budget_cost is not None:
                left = s.budget_cost - b.cost.get(pid, 0)
                if room_c is None or left < room_c:
                    room_c = left
        tokens, cost = res.tokens, res.cost
        if shrink is not None:
            asked = tokens - shrink.prompt
            granted = shrink.grant(asked, room_t, room_c)
            if 0 <= granted < asked:
                tokens = res.tokens = shrink.prompt + granted
                cost = res.cost = min(cost, shrink.cost_of(granted))
            elif granted < 0:  # refused for what the smallest grant needs
                tokens = shrink.prompt + min(asked, shrink.choices)
                cost = shrink.cost_of(min(asked, shrink.choices))
        for s, pid, reset, b in found:
            if s.budget_tokens is not None:
                used = b.tokens.get(pid, 0)
                if refusal is None and used + tokens > s.budget_tokens:
                    refusal = Decision(False, "budget", reset, budget_message("tokens", s, used, tokens))
                if bt is None:
                    left = s.budget_tokens - used
                    bt = Quota(s.budget_tokens, left if left > 0 else 0, reset)
            if s.budget_cost is not None:
                used = b.cost.get(pid, 0)
                if refusal is None and used + cost > s.budget_cost:
                    refusal = Decision(False, "budget", reset, budget_message("cost", s, used, cost))
                if bc is None:
                    left = s.budget_cost - used
                    bc = Quota(s.budget_cost, left if left > 0 else 0, reset)
        return refusal, bt, bc

    def reserve_now(
        self, rid: str, scopes: Sequence[ScopeLimits], tokens: int, cost: int = 0, shrink: Shrink | None = None
    ) -> tuple[Decision, Reservation]:
        now = self._clock()
        horizon = now - WINDOW_S
        res = Reservation(f"{rid}#{next(self._ids)}", tuple(scopes), tokens, cost=cost)  # unique even if rid repeats
        first_req: Quota | None = None
        first_tok: Quota | None = None
        refusal: Decision | None = None
        bt: Quota | None = None
        bc: Quota | None = None
        for s in scopes:  # a loop, not any(genexpr) over the property: every request asks, few have budgets
            if s.budget_tokens is not None or s.budget_cost is not None:
                # a spent budget refuses first: its wait (the period's end) is the one that matters
                refusal, bt, bc = self._budget_check(scopes, res, shrink)
                tokens, cost = res.tokens, res.cost  # what the budgets granted
                break
        for s in scopes:
            if s.rpm is not None:
                w = self._req.get(s.scope) or self._req.setdefault(s.scope, _Window())  # no window made per call
                w.prune(horizon)
                if refusal is None and w.total + 1 > s.rpm:
                    refusal = Decision(
                        False,
                        "requests",
                        max(w.reset_after(now), 0.001),
                        f"Rate limit reached for requests: {s.rpm} per minute",
                    )
                if first_req is None:
                    first_req = Quota(s.rpm, int(s.rpm - w.total), w.reset_after(now))
            if s.tpm is not None:
                w = self._tok.get(s.scope) or self._tok.setdefault(s.scope, _Window())
                w.prune(horizon)
                if refusal is None and w.total + tokens > s.tpm:
                    if tokens > s.tpm:
                        msg = f"Request too large: it needs {tokens} tokens, more than the limit of {s.tpm} per minute"
                        wait = WINDOW_S
                    else:
                        msg = f"Rate limit reached for tokens: {s.tpm} per minute, {int(s.tpm - w.total)} left"
                        wait = w.wait_for(tokens, s.tpm, now)
                    refusal = Decision(False, "tokens", max(wait, 0.001), msg)
                if first_tok is None:
                    first_tok = Quota(s.tpm, max(0, int(s.tpm - w.total)), w.reset_after(now))
            if s.concurrency is not None:
                leases = self._conc.get(s.scope)
                if leases is None:
                    leases = self._conc[s.scope] = {}
                if len(leases) + 1 > s.concurrency:  # only then look for leases that expired
                    for k in [k for k, exp in leases.items() if exp <= now]:
                        del leases[k]
                if refusal is None and len(leases) + 1 > s.concurrency:
                    refusal = Decision(
                        False, "concurrency", 1.0, f"Too many concurrent requests: the limit is {s.concurrency}"
                    )
        if refusal is not None:
            refusal.requests, refusal.tokens = first_req, first_tok
            refusal.budget_tokens, refusal.budget_cost = bt, bc
            res.active = False
            return refusal, res
        for s in scopes:
            pid = res.periods.get(s.scope)
            if pid is not None:
                b = self._budgets[s.scope]
                b.enter(pid)
                if s.budget_tokens is not None:
                    b.tokens[pid] = b.tokens.get(pid, 0) + tokens
                if s.budget_cost is not None:
                    b.cost[pid] = b.cost.get(pid, 0) + cost
            if s.rpm is not None:
                self._req[s.scope].add(now, 1.0)
            if s.tpm is not None:
                w = self._tok[s.scope]
                res.handles.append((w, w.add(now, float(tokens))))
            if s.concurrency is not None:
                self._conc[s.scope][res.request_id] = now + s.lease_s
        if first_req is not None:
            first_req.remaining = max(0, first_req.remaining - 1)
            if first_req.reset_s <= 0:
                first_req.reset_s = WINDOW_S
        if first_tok is not None:
            first_tok.remaining = max(0, first_tok.remaining - tokens)
            if first_tok.reset_s <= 0:
                first_tok.reset_s = WINDOW_S
        if bt is not None:
            left = bt.remaining - tokens
            bt.remaining = left if left > 0 else 0
        if bc is not None:
            left = bc.remaining - cost
            bc.remaining = left if left > 0 else 0
        return Decision(True, requests=first_req, tokens=first_tok, budget_tokens=bt, budget_cost=bc), res

    def restore(self, spend: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        """Budget counters from what was spent before this process (`spend_of`), added to any counted here."""
        for (scope, pid), (tokens, cost) in spend.items():
            b = self._budgets.get(scope) or self._budgets.setdefault(scope, _Budget())
            b.tokens[pid] = b.tokens.get(pid, 0) + tokens
            b.cost[pid] = b.cost.get(pid, 0) + cost

    async def finish(self, res: Reservation, actual_tokens: int | None, actual_cost: int | None = None) -> None:
        self.finish_now(res, actual_tokens, actual_cost)

    async def warm_up(self) -> None:
        """Nothing to get ready: the counters are this process's own."""

    def finish_now(self, res: Reservation, actual_tokens: int | None, actual_cost: int | None = None) -> None:
        if not res.active:
            return
        res.active = False
        if actual_tokens is not None and actual_tokens != res.tokens:
            for handle in res.handles:
                assert isinstance(handle, tuple)
                window, seq = handle
                window.adjust(seq, float(actual_tokens))
        for s in res.scopes:  # the period the reservation was charged to, even if a new one began since
            pid = res.periods.get(s.scope)
            b = self._budgets.get(s.scope)
            if pid is None or b is None:
                continue
            if s.budget_tokens is not None and actual_tokens is not None and pid in b.tokens:
                b.tokens[pid] += actual_tokens - res.tokens
            if s.budget_cost is not None and actual_cost is not None and pid in b.cost:
                b.cost[pid] += actual_cost - res.cost
        for s in res.scopes:
            if s.concurrency is not None:
                self._conc.get(s.scope, {}).pop(res.request_id, None)

    async def aclose(self) -> None:
        return None
