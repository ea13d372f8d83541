"""Rate limits per key (and per key and model): requests/min, tokens/min, concurrent requests.

Semantics, identical in both stores: a *sliding window log* of 60 s. A request is admitted only if,
counting it, no scope exceeds its limit over the last 60 s; so N replicas sharing a store admit
exactly the limit, never N times it. Tokens are reserved up front (prompt estimate + max_tokens or
the configured default) and settled with the real usage when the request ends (a client that
aborts pays for what was generated). Concurrency is a lease per request, released at the end and
expiring on its own if a replica dies. All scopes of a request are checked and taken atomically.

Budgets (tokens and/or cost per UTC day or calendar month) are one more dimension of a scope, taken in
the same atomic step: a counter per scope and period, reserved with the same estimate as `tpm` (cost:
the estimate priced by the model's `price`) and corrected by the settlement. A reservation remembers the
period it was charged to, so a request that ends after midnight settles the day it started in. The
counter of a new period starts at zero: the budget resets at the period boundary (UTC). Cost is counted
in integer units of 1e-9 of the price's currency (`COST_UNITS`), so both stores add exactly.

A budgeted request may be admitted smaller than it asked (`Shrink`): when the whole reservation no longer
fits a budget, the store grants the largest one that does (the prompt estimate plus whole tokens per
choice), and the service holds the engine to it (`max_tokens`); only when not even the prompt and one
token per choice fit is the request refused. Granting and taking are one atomic step, as above.

Scopes are named so that no two can meet: a key's is `k:<name>`, a key and model's `k:<name>@m:<model>`
(names never hold `@`, see settings' NAME_PATTERN): a key named `a:m:b` is not key `a` on model `b`.

This module holds the vocabulary both stores share (scopes, decisions, reservations, the store
protocol and its in-process kind `InlineStore`, `StoreUnavailable`) and the UTC periods of budgets;
`MemoryStore` (memory.py) is for one process, `RedisStore` (redis_store.py, imported only when
configured) shares state across replicas.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

WINDOW_S = 60.0
LimitKind = Literal["requests", "tokens", "concurrency", "budget"]
Period = Literal["day", "month"]
#: cost budgets are counted in these units per unit of the price's currency (integers add exactly)
COST_UNITS = 1_000_000_000


def key_scope(key: str) -> str:
    """The scope of a key's own limits."""
    return f"k:{key}"


def model_scope(key: str, model: str) -> str:
    """The scope of a key's limits on one model (`model_limits`): `@` never occurs in a name, so this
    cannot be any key's own scope, nor another key's on another model."""
    return f"k:{key}@m:{model}"


@dataclass(slots=True)  # not frozen: made for every budgeted request, and a frozen init sets each field by a call
class Shrink:
    """How a reservation may be made smaller to fit a budget: it is `prompt` tokens (costing `prompt_cost`)
    and a completion of whole tokens per choice (`choices` of them), each output token costing `unit_cost`
    (COST_UNITS, a float: prices need not be whole units). The store grants `prompt` plus the largest
    multiple of `choices` that fits every budget (never more than asked); none: refused."""

    prompt: int
    choices: int = 1
    prompt_cost: int = 0
    unit_cost: float = 0.0

    def grant(self, asked: int, room_tokens: int | None, room_cost: int | None) -> int:
        """The completion tokens granted of `asked`, with `room_tokens` (tokens) and `room_cost` (COST_UNITS)
        left in the tightest budget (None: no such budget); -1 when not even one token per choice fits."""
        c = asked  # (comparisons, not builtin min: every budgeted request asks)
        if room_tokens is not None and room_tokens - self.prompt < c:
            c = room_tokens - self.prompt
        if room_cost is not None:
            left = room_cost - self.prompt_cost
            if left < 0:
                return -1
            if self.unit_cost > 0:
                fits = left / self.unit_cost  # inf for a tiny unit: no bound, and never floored
                if fits < c:  # floor(fits) < c exactly when fits < c (c an integer)
                    c = math.floor(fits)
        c -= c % self.choices if c > 0 else 0
        return c if c >= (asked if asked < self.choices else self.choices) else -1

    def cost_of(self, completion: int) -> int:
        """What the prompt and `completion` output tokens may cost, rounded up (COST_UNITS)."""
        return self.prompt_cost + math.ceil(completion * self.unit_cost)


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """One scope to check: a key, or a key and model."""

    scope: str
    rpm: int | None
    tpm: int | None
    concurrency: int | None
    lease_s: float = 3600.0
    budget_tokens: int | None = None
    budget_cost: int | None = None  # in COST_UNITS
    period: Period = "day"

    @property
    def has_budget(self) -> bool:
        return self.budget_tokens is not None or self.budget_cost is not None


@dataclass(slots=True)
class Quota:
    """What the x-ratelimit-* headers report for one dimension."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(slots=True)
class Decision:
    allowed: bool
    kind: LimitKind | None = None  # what refused it
    retry_after_s: float = 0.0
    message: str = ""
    requests: Quota | None = None
    tokens: Quota | None = None
    store_error: bool = False
    budget_tokens: Quota | None = None  # the first budgeted scope's, as the headers report it
    budget_cost: Quota | None = None  # limit and remaining in COST_UNITS


@dataclass(slots=True)
class Reservation:
    request_id: str
    scopes: tuple[ScopeLimits, ...]
    tokens: int
    handles: list[object] = field(default_factory=list)  # store-specific
    active: bool = True
    cost: int = 0  # reserved against cost budgets, in COST_UNITS
    periods: dict[str, str] = field(default_factory=dict)  # scope -> the budget period it was charged to
    # what the limiter needs to price the settlement: (input, output) per million, and the prompt estimate
    price: tuple[float, float] | None = None
    prompt_estimate: int | None = None


class LimitStore(Protocol):
    """Where the limits' counters are kept: reserved before a request, settled after it."""

    async def reserve(
        self, rid: str, scopes: Sequence[ScopeLimits], tokens: int, cost: int = 0, shrink: Shrink | None = None
    ) -> tuple[Decision, Reservation]:
        """Take `tokens` (and `cost`) in every scope, or with `shrink` the largest part of them that fits
        the budgets (the `Reservation` says how much: its `tokens` and `cost`)."""
        ...

    async def finish(self, res: Reservation, actual_tokens: int | None, actual_cost: int | None = None) -> None:
        """Settle the token (and cost) reservation with the real count (None: keep the estimate) and
        release the concurrency lease."""
        ...

    async def warm_up(self) -> None:
        """Get ready before the first request (a shared store connects and loads its scripts); failing to is
        logged, not raised: the requests retry."""
        ...

    async def aclose(self) -> None: ...


@runtime_checkable
class InlineStore(LimitStore, Protocol):
    """An in-process store: no I/O, so its coroutines never suspend, and a settlement needs no shield against
    cancellation (one is only delivered where a coroutine suspends). It gives the same two answers as plain
    calls too (`reserve_now`, `finish_now`): the limiter uses those, a coroutine less each on every request.
    Its counters start empty with the process: the budgets' are restored from the usage ledger (`restore`).
    The limiter checks for it once, when it is made (`Limiter.inline`)."""

    def reserve_now(
        self, rid: str, scopes: Sequence[ScopeLimits], tokens: int, cost: int = 0, shrink: Shrink | None = None
    ) -> tuple[Decision, Reservation]:
        """`reserve`, answered as a plain call."""
        ...

    def finish_now(self, res: Reservation, actual_tokens: int | None, actual_cost: int | None = None) -> None:
        """`finish`, done as a plain call."""
        ...

    def restore(self, spend: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        """Budget counters from what was spent before this process, {(scope, period id): (tokens, cost)},
        added to any counted here."""
        ...


def format_reset(seconds: float) -> str:
    """OpenAI's reset format: "1s", "6m0s", "1m30.5s", "250ms" (rounded up to a tenth of a second)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1 and math.ceil(seconds * 1000) < 1000:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    tenths = _ceil_rounded(seconds * 10, 1e-5, 6)
    text = _RESET_TEXTS.get(tenths)
    if text is None:  # each request's window resets within a minute: 600 texts cover every one of them
        text = _reset_text(tenths)
        if len(_RESET_TEXTS) < 4096:
            _RESET_TEXTS[tenths] = text
    return text


_RESET_TEXTS: dict[int, str] = {}


def _reset_text(tenths: int) -> str:
    m, t = divmod(tenths, 600)
    text = f"{t / 10:g}s"
    if m >= 60:  # budgets reset in hours or days: "13h5m0s"
        h, m = divmod(m, 60)
        return f"{h}h{m}m{text}"
    return f"{m}m{text}" if m else text


def cost_units(amount: float) -> int:
    """An amount of the price's currency in COST_UNITS, rounded up (never less than the real cost)."""
    n = _ceil_rounded(amount * COST_UNITS, 0.001, 3)
    return n if n > 0 else 0


def _ceil_rounded(x: float, step: float, digits: int) -> int:
    """`math.ceil(round(x, digits))` (`step` = 10 ** -digits), without `round`'s decimal conversion where the
    answer is plain: a non-negative `x` that is whole, or more than `step` above its floor, rounds to a value
    in (floor, floor + 1] whose ceiling is floor + 1 (`round(x, n)` costs a dtoa conversion, thousands of
    instructions: the budgets price each request and format its reset with it)."""
    if 0.0 <= x < 1e15:  # below 2**53: the int and the fraction are exact
        n = int(x)
        frac = x - n
        if frac == 0.0:
            return n
        if frac > step:
            return n + 1
    return math.ceil(round(x, digits))


def token_cost(price: tuple[float, float], prompt: int, completion: int) -> int:
    """What `prompt` input and `completion` output tokens cost at (input, output) per million, in COST_UNITS."""
    n = _ceil_rounded((prompt * price[0] + completion * price[1]) / 1_000_000 * COST_UNITS, 0.001, 3)  # cost_units
    return n if n > 0 else 0


def period_of(period: Period, now_s: float) -> tuple[str, float]:
    """The budget period holding unix time `now_s` (UTC): its id ("d<days since 1970>", "m<months since
    year 0>": the same ids the Redis script computes) and the unix time it ends. Remembered per (period, day):
    every budgeted request asks, and a month's end takes two datetimes to find."""
    day = math.floor(now_s / 86400)
    key = (period, day)
    found = _PERIODS.get(key)
    if found is None:
        found = _period_of_day(period, day)
        if len(_PERIODS) >= 64:  # days go by, and restore() asks for old ones: keep a few
            _PERIODS.clear()
        _PERIODS[key] = found
    return found


_PERIODS: dict[tuple[str, int], tuple[str, float]] = {}


def _period_of_day(period: Period, day: int) -> tuple[str, float]:
    if period == "day":
        return f"d{day}", (day + 1) * 86400.0
    d = dt.datetime.fromtimestamp(day * 86400, dt.UTC)
    y, m = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
    return f"m{d.year * 12 + d.month - 1}", dt.datetime(y, m, 1, tzinfo=dt.UTC).timestamp()


def money(units: int) -> str:
    """COST_UNITS as an amount of the currency: "12.5", "0.000123" (the float's nine decimals)."""
    if 0 <= units < _MONEY_EXACT:  # the same digits from integers: no float formatting
        whole, part = divmod(units, COST_UNITS)
        return f"{whole}.{part:09d}".rstrip("0") if part else str(whole)
    return f"{units / COST_UNITS:.9f}".rstrip("0").rstrip(".") or "0"


#: below 2**23 of the currency a double's error on units / COST_UNITS is under half a unit (half an ulp, at most
#: 2**-31 < 5e-10), so the float's nine decimals are the exact ones: the integers give the same text
_MONEY_EXACT = 2**23 * COST_UNITS


def budget_message(what: Literal["tokens", "cost"], s: ScopeLimits, used: int, need: int) -> str:
    """Why a budget refuses a request that needs `need` (tokens, or COST_UNITS) with `used` spent."""
    per = "per day" if s.period == "day" else "per month"
    if what == "tokens":
        limit = s.budget_tokens or 0
        if need > limit:
            return f"Request too large for the token budget: it needs {need} tokens, the budget is {limit} {per}"
        return f"Token budget exhausted: {limit} tokens {per}, {max(0, limit - used)} left, this request needs {need}"
    limit = s.budget_cost or 0
    if need > limit:
        return f"Request too large for the cost budget: it may cost {money(need)}, the budget is {money(limit)} {per}"
    return (
        f"Cost budget exhausted: {money(limit)} {per}, {money(max(0, limit - used))} left, "
        f"this request may cost {money(need)}"
    )


def utc_text(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StoreUnavailable(Exception):
    """The shared store could not be asked in time; the policy (open/closed) decides."""
