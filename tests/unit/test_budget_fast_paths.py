"""The budgets' per-request arithmetic gives what the slower computations it replaced gave (issue 36: the team
profile's cost over minimal).

- `cost_units` and `format_reset` round up without `round(x, n)` (a dtoa conversion) where the answer is plain:
  the reference is `math.ceil(round(x, n))`, for prices' products, tiny and huge amounts, and values a hair
  above a whole number (where the fast path must defer to `round`).
- `money` formats amounts below 2**23 of the currency from integers: the reference is the float's nine decimals.
- `period_of` remembers each (period, day): the reference computes the month's end with datetimes every time,
  across month and year ends.
- `Shrink.grant` compares instead of calling `min`: the reference is the old expression.
- The cost limit's header text is made once per limit, in each Limiter: the headers are those of a fresh
  computation, through one limiter that has seen many limits, and through two limiters each of its own limits.
"""

from __future__ import annotations

import datetime as dt
import math

from hypothesis import example, given
from hypothesis import strategies as st

from llm_gateway.access import store
from llm_gateway.access.limiter import Limiter
from llm_gateway.access.memory import MemoryStore
from llm_gateway.access.store import COST_UNITS, Decision, Quota, Shrink


def _cost_units_ref(amount: float) -> int:
    return max(0, math.ceil(round(amount * COST_UNITS, 3)))


def _money_ref(units: int) -> str:
    return f"{units / COST_UNITS:.9f}".rstrip("0").rstrip(".") or "0"


def _reset_ref(seconds: float) -> str:
    if seconds <= 0:
        return "0s"
    if seconds < 1 and math.ceil(seconds * 1000) < 1000:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    return store._reset_text(math.ceil(round(seconds * 10, 6)))


def _period_ref(period: str, now_s: float) -> tuple[str, float]:
    day = math.floor(now_s / 86400)
    if period == "day":
        return f"d{day}", (day + 1) * 86400.0
    d = dt.datetime.fromtimestamp(day * 86400, dt.UTC)
    y, m = (d.year + 1, 1) if d.month == 12 else (d.year, d.month + 1)
    return f"m{d.year * 12 + d.month - 1}", dt.datetime(y, m, 1, tzinfo=dt.UTC).timestamp()


PRICES = st.sampled_from([(0.5, 1.5), (0.15, 0.6), (3.0, 15.0), (0.1, 0.1), (2.5, 10.0), (0.075, 0.3), (1e-3, 7e-3)])


@given(PRICES, st.integers(0, 2_000_000), st.integers(0, 200_000))
def test_token_cost_is_the_rounded_up_units(price: tuple[float, float], prompt: int, completion: int) -> None:
    amount = (prompt * price[0] + completion * price[1]) / 1_000_000
    assert store.token_cost(price, prompt, completion) == _cost_units_ref(amount)


@given(st.floats(-1e9, 1e12, allow_nan=False))
@example(0.0)
@example(1.0)
@example(1.0000000005)  # 1.0005 units: a hair above whole, where round(x, 3) still gives the whole number
@example(1.000000001)
@example(1.0000000010001)
@example(-0.3)
@example(9_000_000.0)
def test_cost_units_fast_path(amount: float) -> None:
    assert store.cost_units(amount) == _cost_units_ref(amount)


@given(st.floats(1e-12, 1e-6) | st.floats(0, 1e6))
def test_cost_units_small_amounts(amount: float) -> None:
    assert store.cost_units(amount) == _cost_units_ref(amount)


@given(st.integers(-(10**10), 10**17))
@example(0)
@example(COST_UNITS)
@example(COST_UNITS + 1)
@example(2**23 * COST_UNITS - 1)
@example(2**23 * COST_UNITS)
@example(9_000_000 * COST_UNITS - 12_345)
def test_money_is_the_floats_nine_decimals(units: int) -> None:
    assert store.money(units) == _money_ref(units)


@given(st.integers(0, 2**23 * COST_UNITS - 1))
def test_money_below_the_exact_bound(units: int) -> None:
    assert store.money(units) == _money_ref(units)


@given(st.floats(-5, 40 * 86400, allow_nan=False))
@example(0.1)
@example(0.9995)
@example(1.00000005)
@example(59.99999)
@example(3600.000001)
def test_format_reset_fast_path(seconds: float) -> None:
    assert store.format_reset(seconds) == _reset_ref(seconds)


@given(st.sampled_from(["day", "month"]), st.floats(0, 4_102_444_800, allow_nan=False))
@example("month", 1_796_083_199.5)  # 2026-12-31 23:59:59.5: the month (and year) ends at midnight
@example("month", 1_796_083_200.0)
@example("day", 1_796_083_199.999)
def test_period_of_is_remembered_per_day(period: str, now_s: float) -> None:
    assert store.period_of(period, now_s) == _period_ref(period, now_s)  # type: ignore[arg-type]
    assert store.period_of(period, now_s) == _period_ref(period, now_s)  # type: ignore[arg-type]


@given(
    st.integers(0, 10_000),
    st.integers(1, 8),
    st.integers(0, 10**9),
    st.floats(0, 100.0, allow_nan=False),
    st.integers(0, 100_000),
    st.none() | st.integers(-1000, 200_000),
    st.none() | st.integers(-(10**9), 10**10),
)
def test_shrink_grant_as_before(
    prompt: int, choices: int, prompt_cost: int, unit: float, asked: int, room_t: int | None, room_c: int | None
) -> None:
    s = Shrink(prompt, choices, prompt_cost, unit)
    c = asked
    if room_t is not None:
        c = min(c, room_t - prompt)
    if room_c is not None:
        left = room_c - prompt_cost
        if left < 0:
            assert s.grant(asked, room_t, room_c) == -1
            return
        if unit > 0 and math.isfinite(left / unit):  # a subnormal unit: no cost bound at all
            c = min(c, math.floor(left / unit))
    c -= c % choices if c > 0 else 0
    assert s.grant(asked, room_t, room_c) == (c if c >= min(asked, choices) else -1)


def test_a_unit_cost_too_small_to_divide_by_bounds_nothing() -> None:
    """room / unit overflows to inf for a subnormal unit: the grant is the ask, not an OverflowError (a 500)."""
    assert Shrink(0, 1, 0, 2.225073858507203e-309).grant(7, None, 1) == 7


#: one limiter across the examples below: its cost-limit texts must stay each its own limit's
_SEEN_MANY = Limiter(MemoryStore(), fail_open=False)


@given(st.integers(0, 10**16), st.integers(-(10**10), 10**16), st.integers(0, 10**6), st.integers(-5, 10**6))
def test_budget_headers_as_a_fresh_computation(limit: int, remaining: int, t_limit: int, t_left: int) -> None:
    d = Decision(True, budget_tokens=Quota(t_limit, t_left, 3600.5), budget_cost=Quota(limit, remaining, 3600.5))
    for _ in range(2):  # the second: the limit's text remembered (by a limiter that has seen the examples before)
        assert dict(_SEEN_MANY.quota_headers(d)) == {
            b"x-ratelimit-limit-budget-tokens": str(t_limit).encode(),
            b"x-ratelimit-remaining-budget-tokens": str(max(0, t_left)).encode(),
            b"x-ratelimit-limit-budget-cost": _money_ref(limit).encode(),
            b"x-ratelimit-remaining-budget-cost": _money_ref(max(0, remaining)).encode(),
            b"x-ratelimit-reset-budget": b"1h0m0.5s",
        }


def _cost_limit_text(lim: Limiter, limit: int) -> bytes:
    d = Decision(True, budget_cost=Quota(limit, limit // 2, 60.0))
    return dict(lim.quota_headers(d))[b"x-ratelimit-limit-budget-cost"]


def test_each_limiter_keeps_its_own_cost_limit_texts_and_answers_each_limit_its_own() -> None:
    """Two limiters in one process (a reload makes a new one beside the old): each answers the text of the limit
    it is asked about, the first time and from what it kept, and what one keeps is its own. Past the bound (4096
    limits) a limiter keeps no more texts and still answers each its own."""
    a, b = Limiter(MemoryStore(), fail_open=False), Limiter(MemoryStore(), fail_open=False)
    for _ in range(2):  # made, then remembered
        assert _cost_limit_text(a, 5 * COST_UNITS) == b"5"
        assert _cost_limit_text(b, COST_UNITS // 4) == b"0.25"
        assert _cost_limit_text(a, COST_UNITS // 4) == b"0.25"
        assert _cost_limit_text(b, 5 * COST_UNITS) == b"5"
    fresh = Limiter(MemoryStore(), fail_open=False)
    assert fresh._cost_limits == {}  # nothing of a's or b's: the texts are the limiter's, not the module's
    for units in range(4100):
        assert _cost_limit_text(fresh, units) == _money_ref(units).encode()
    assert len(fresh._cost_limits) == 4096
    assert _cost_limit_text(fresh, 4099) == b"0.000004099"
