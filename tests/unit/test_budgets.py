"""Token and cost budgets per key per UTC day or month: reserve-then-settle in the memory store, the
period boundary (an injected wall clock), cost priced by the models' `price`, the config that carries
them, and the 429 `insufficient_quota` a spent budget answers, with its reset time, through HTTP.

Token arithmetic through HTTP (as in test_ratelimit_headers.py): a chat with one message "hello" and
max_tokens 100 reserves 6 + 100 = 106 tokens and settles at the engine's usage, 5 + 2 = 7.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import re
from typing import Any

import openai
import pytest

from llm_gateway.access.keys import Principal
from llm_gateway.access.limiter import Limiter
from llm_gateway.access.memory import MemoryStore
from llm_gateway.access.store import COST_UNITS, ScopeLimits, cost_units, format_reset, period_of, token_cost
from llm_gateway.errors import RateLimited
from llm_gateway.settings import Budget, Limits, Price
from llm_gateway.settings.loader import ConfigError
from tests.conftest import ONE_BACKEND, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

ENGINE_CHAT = "http://engine-a.test/v1/chat/completions"
CHAT = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100}
RESERVED, USED = 106, 7


def utc(*args: int) -> float:
    return dt.datetime(*args, tzinfo=dt.UTC).timestamp()


class Wall:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def budget(tokens: int | None = None, cost: int | None = None, period: str = "day") -> ScopeLimits:
    return ScopeLimits("k:alice", None, None, None, 3600.0, tokens, cost, period)  # type: ignore[arg-type]


def principal(limits: Limits, model_limits: dict[str, Limits] | None = None) -> Principal:
    return Principal(
        name="alice",
        id="alice",  # the limiter names scopes by the key's id
        model_patterns=(re.compile(".*"),),
        limits=limits,
        model_limits=tuple((re.compile(fnmatch.translate(g)), lim) for g, lim in (model_limits or {}).items()),
    )


# -- the memory store ---------------------------------------------------------------------------------


def test_a_token_budget_admits_until_the_reservations_no_longer_fit():
    store = MemoryStore(wall=Wall(utc(2026, 12, 1, 10)))
    admitted = [store.reserve_now("r", [budget(tokens=250)], 100)[0].allowed for _ in range(3)]
    assert admitted == [True, True, False]


def test_settling_gives_back_what_was_reserved_but_not_used():
    store = MemoryStore(wall=Wall(utc(2026, 12, 1, 10)))
    d, res = store.reserve_now("r", [budget(tokens=250)], 200)
    assert d.allowed and d.budget_tokens is not None and d.budget_tokens.remaining == 50
    assert not store.reserve_now("r", [budget(tokens=250)], 100)[0].allowed  # 200 reserved: 100 does not fit
    store.finish_now(res, 30)  # the real usage
    d2, _ = store.reserve_now("r", [budget(tokens=250)], 100)
    assert d2.allowed and d2.budget_tokens is not None and d2.budget_tokens.remaining == 250 - 30 - 100


def test_a_refusal_says_what_is_left_and_waits_until_the_end_of_the_utc_day():
    wall = Wall(utc(2026, 12, 1, 18, 30))
    store = MemoryStore(wall=wall)
    store.reserve_now("r", [budget(tokens=100)], 90)
    d, res = store.reserve_now("r", [budget(tokens=100)], 20)
    assert not d.allowed and d.kind == "budget" and not res.active
    assert d.retry_after_s == pytest.approx(5.5 * 3600)
    assert d.message == "Token budget exhausted: 100 tokens per day, 10 left, this request needs 20"
    assert d.budget_tokens is not None and (d.budget_tokens.limit, d.budget_tokens.remaining) == (100, 10)


def test_a_request_larger_than_the_whole_budget_says_so():
    d, _ = MemoryStore(wall=Wall(utc(2026, 12, 1))).reserve_now("r", [budget(tokens=100)], 500)
    assert not d.allowed and d.message.startswith("Request too large for the token budget: it needs 500 tokens")


def test_the_daily_counter_starts_again_at_midnight_utc():
    wall = Wall(utc(2026, 12, 1, 23, 59, 59))
    store = MemoryStore(wall=wall)
    assert store.reserve_now("r", [budget(tokens=100)], 100)[0].allowed
    assert not store.reserve_now("r", [budget(tokens=100)], 1)[0].allowed
    wall.t = utc(2026, 12, 2, 0, 0, 0)
    d, _ = store.reserve_now("r", [budget(tokens=100)], 100)
    assert d.allowed and d.budget_tokens is not None and d.budget_tokens.reset_s == 86400


def test_the_monthly_counter_holds_all_month_and_starts_again_on_the_first():
    wall = Wall(utc(2026, 1, 1, 0, 0, 0))
    store = MemoryStore(wall=wall)
    month = budget(tokens=100, period="month")
    assert store.reserve_now("r", [month], 100)[0].allowed
    wall.t = utc(2026, 1, 31, 23, 59, 59)
    d, _ = store.reserve_now("r", [month], 1)
    assert not d.allowed and d.retry_after_s == pytest.approx(1.0)
    wall.t = utc(2026, 2, 1)
    assert store.reserve_now("r", [month], 100)[0].allowed


def test_a_request_that_ends_after_midnight_settles_the_day_it_was_charged_to():
    wall = Wall(utc(2026, 12, 1, 23, 59))
    store = MemoryStore(wall=wall)
    _, res = store.reserve_now("r", [budget(tokens=1000)], 800)
    wall.t = utc(2026, 12, 2, 0, 1)
    d, _ = store.reserve_now("r", [budget(tokens=1000)], 100)  # the new day: all of it
    assert d.budget_tokens is not None and d.budget_tokens.remaining == 900
    store.finish_now(res, 50)  # yesterday's request: it gives back yesterday's 750, not today's
    d2, _ = store.reserve_now("r", [budget(tokens=1000)], 100)
    assert d2.budget_tokens is not None and d2.budget_tokens.remaining == 800


def test_counters_of_old_periods_are_dropped():
    wall = Wall(utc(2026, 12, 1, 12))
    store = MemoryStore(wall=wall)
    for day in range(1, 6):
        wall.t = utc(2026, 12, day, 12)
        store.reserve_now("r", [budget(tokens=10)], 1)
    assert sorted(store._budgets["k:alice"].tokens) == [period_of("day", utc(2026, 12, d))[0] for d in (4, 5)]


def test_a_spent_budget_refuses_first_even_when_the_rpm_also_would():
    store = MemoryStore(clock=lambda: 100.0, wall=Wall(utc(2026, 12, 1)))
    both = ScopeLimits("k:alice", 1, None, None, 3600.0, 10, None, "day")
    assert store.reserve_now("r", [both], 10)[0].allowed
    d, _ = store.reserve_now("r", [both], 1)
    assert d.kind == "budget"


def test_a_refusal_by_the_budget_takes_nothing_from_the_rpm():
    store = MemoryStore(clock=lambda: 100.0, wall=Wall(utc(2026, 12, 1)))
    both = ScopeLimits("k:alice", 2, None, None, 3600.0, 10, None, "day")
    for _ in range(5):
        store.reserve_now("r", [both], 50)  # too big for the budget: refused, nothing taken
    d, _ = store.reserve_now("r", [both], 5)
    assert d.allowed and d.requests is not None and d.requests.remaining == 1


@pytest.mark.parametrize(
    ("when", "period", "ends"),
    [
        (utc(2026, 12, 31, 23, 59, 59), "day", utc(2027, 1, 1)),
        (utc(2026, 12, 31, 23, 59, 59), "month", utc(2027, 1, 1)),
        (utc(2028, 2, 29, 12), "month", utc(2028, 3, 1)),
        (utc(2027, 2, 28, 12), "day", utc(2027, 3, 1)),
        (utc(1970, 1, 1), "month", utc(1970, 2, 1)),
    ],
)
def test_periods_are_utc_days_and_calendar_months(when: float, period: str, ends: float):
    pid, end = period_of(period, when)  # type: ignore[arg-type]
    assert end == ends
    assert pid == period_of(period, end - 1)[0] != period_of(period, end)[0]


# -- cost ---------------------------------------------------------------------------------------------


def test_cost_units_are_exact_for_prices_per_million():
    assert token_cost((0.15, 0.6), 7, 0) == 1050  # 7 x 0.15/1M = 0.00000105
    assert token_cost((3.0, 15.0), 1000, 500) == cost_units(0.003 + 0.0075)
    assert cost_units(12.5) == 12_500_000_000 and COST_UNITS == 10**9


async def test_cost_is_reserved_at_the_estimate_and_settled_at_the_real_usage():
    store = MemoryStore(wall=Wall(utc(2026, 12, 1)))
    lim = Limiter(store, fail_open=False, prices={"big": Price(input_per_million=1000, output_per_million=2000)})
    who = principal(Limits(budget=Budget(cost=1.0)))  # 1.00 a day; a token costs 0.001 in, 0.002 out
    d, res = await lim.admit(who, "big", 300, "r1", prompt_tokens=100)  # 100 x 0.001 + 200 x 0.002 = 0.5
    assert d is not None and d.budget_cost is not None and d.budget_cost.remaining == cost_units(0.5)
    await lim.finish(res, 150, prompt_tokens=120)  # the real usage: 120 x 0.001 + 30 x 0.002 = 0.18
    d2, _ = await lim.admit(who, "big", 10, "r2", prompt_tokens=10)
    assert d2 is not None and d2.budget_cost is not None and d2.budget_cost.remaining == cost_units(1.0 - 0.18 - 0.01)
    headers = dict((k.decode(), v.decode()) for k, v in lim.quota_headers(d2))
    assert headers["x-ratelimit-remaining-budget-cost"] == "0.81"


async def test_without_the_prompt_split_cost_is_reserved_at_the_dearer_rate():
    store = MemoryStore(wall=Wall(utc(2026, 12, 1)))
    lim = Limiter(store, fail_open=False, prices={"big": Price(input_per_million=1000, output_per_million=2000)})
    who = principal(Limits(budget=Budget(cost=1.0)))
    d, _ = await lim.admit(who, "big", 100, "r1")
    assert d is not None and d.budget_cost is not None and d.budget_cost.remaining == cost_units(1.0 - 0.2)


async def test_a_spent_cost_budget_refuses_priced_models_but_not_free_ones():
    wall = Wall(utc(2026, 12, 1, 12))
    store = MemoryStore(wall=wall)
    prices = {"big": Price(input_per_million=1000, output_per_million=1000)}
    lim = Limiter(store, fail_open=False, prices=prices, wall=wall)
    who = principal(Limits(budget=Budget(cost=0.1, period="month")))
    _, res = await lim.admit(who, "big", 100, "r1", prompt_tokens=50)
    await lim.finish(res, 100, prompt_tokens=50)
    with pytest.raises(RateLimited) as ei:
        await lim.admit(who, "big", 1, "r2", prompt_tokens=1)
    assert ei.value.code == "insufficient_quota" and ei.value.type == "insufficient_quota"
    assert "Cost budget exhausted: 0.1 per month, 0 left" in ei.value.message
    assert "resets at 2027-01-01T00:00:00Z" in ei.value.message
    assert (await lim.admit(who, "free-model", 1000, "r3"))[0] is not None  # no price: costs nothing


async def test_a_model_limits_entry_can_carry_its_own_budget():
    store = MemoryStore(wall=Wall(utc(2026, 12, 1)))
    lim = Limiter(store, fail_open=False)
    who = principal(Limits(), {"big-*": Limits(budget=Budget(tokens=100))})
    assert lim.scopes(who, "small") == ()
    await lim.admit(who, "big-70b", 100, "r1")
    with pytest.raises(RateLimited, match="Token budget exhausted"):
        await lim.admit(who, "big-70b", 1, "r2")
    assert await lim.admit(who, "small", 10_000, "r3") == (None, None)


async def test_the_refusal_counts_as_a_budget_rejection():
    rejected: list[tuple[str, str]] = []
    lim = Limiter(
        MemoryStore(wall=Wall(utc(2026, 12, 1))), fail_open=False, on_reject=lambda k, w: rejected.append((k, w))
    )
    with pytest.raises(RateLimited):
        await lim.admit(principal(Limits(budget=Budget(tokens=1))), "m", 5, "r")
    assert rejected == [("alice", "budget")]


def test_format_reset_goes_on_into_hours_for_budgets():
    assert format_reset(5.5 * 3600) == "5h30m0s"
    assert format_reset(86400) == "24h0m0s"


# -- config -------------------------------------------------------------------------------------------


def _keys(entry: str, models_extra: str = "") -> str:
    # budgets on the memory store are restored from the ledger at start: it must be on (never opened here:
    # the in-process client runs no lifespan)
    return (
        ONE_BACKEND.replace('{name: alice, sha256: "${ALICE_SHA}"}', entry).replace(
            "    aliases: [pm]\n", "    aliases: [pm]\n" + models_extra
        )
        + "usage: {ledger: true}\n"
    )


def test_a_budget_on_a_key_is_one_of_its_limits():
    cfg = make_config(_keys('{name: alice, sha256: "${ALICE_SHA}", budget: {tokens: 5000, period: month}}'))
    assert cfg.auth.keys[0].limits.budget == Budget(tokens=5000, period="month")


def test_a_cost_budget_needs_prices():
    with pytest.raises(ConfigError, match="a cost budget needs models"):
        make_config(_keys('{name: alice, sha256: "${ALICE_SHA}", budget: {cost: 5}}'))
    cfg = make_config(
        _keys(
            '{name: alice, sha256: "${ALICE_SHA}", budget: {cost: 5}}',
            "    price: {input_per_million: 0.5, output_per_million: 1.5}\n",
        )
    )
    assert cfg.models[0].price == Price(input_per_million=0.5, output_per_million=1.5)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('{name: alice, sha256: "${ALICE_SHA}", budget: {period: day}}', "a budget needs tokens, cost or both"),
        ('{name: alice, sha256: "${ALICE_SHA}", budget: {tokens: 5, period: week}}', "period"),
        (
            '{name: alice, sha256: "${ALICE_SHA}", budget: {tokens: 5}, limits: {budget: {tokens: 6}}}',
            "say different things",
        ),
    ],
)
def test_bad_budgets_are_refused(entry: str, message: str):
    with pytest.raises(ConfigError, match=message):
        make_config(_keys(entry))


# -- through HTTP -------------------------------------------------------------------------------------


def reset_seconds(value: str) -> float:
    """The reset format ("5h30m0s", "1m0s", "59.9s") in seconds."""
    m = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", value)
    assert m is not None and value, f"not a reset value: {value!r}"
    return int(m.group(1) or 0) * 3600 + int(m.group(2) or 0) * 60 + float(m.group(3) or 0)


def whole() -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "upstream-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": USED},
        }
    )


async def test_a_spent_budget_is_429_insufficient_quota_with_its_reset_before_any_engine_is_asked():
    cfg = make_config(_keys('{name: alice, sha256: "${ALICE_SHA}", budget: {tokens: 230}}'))
    up = FakeUpstream({("POST", ENGINE_CHAT): whole()})
    async with gateway_client(cfg, upstream=up) as (client, _):
        rs = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(3)]
        # 106 + 106 fit in 230 (each settled at 7); the third reservation fits again: 7 + 7 + 106 <= 230
        assert [r.status_code for r in rs] == [200, 200, 200]
        headers: dict[str, Any] = dict(rs[2].headers)
        assert headers["x-ratelimit-limit-budget-tokens"] == "230"
        assert headers["x-ratelimit-remaining-budget-tokens"] == str(230 - 2 * USED - RESERVED)
        # 216 asked, 209 left: admitted with the 203 output tokens that fit, and the engine is held to them
        fits = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 210})
        assert fits.status_code == 200 and fits.headers["x-ratelimit-remaining-budget-tokens"] == "0"
        assert up.calls_to(ENGINE_CHAT)[-1].json()["max_tokens"] == 203
        # a prompt of 205 tokens (estimated) and one token of output do not fit in the 202 left
        long = {**CHAT, "messages": [{"role": "user", "content": "x" * 800}]}
        big = await client.post("/v1/chat/completions", json=long)
    assert big.status_code == 429
    err = big.json()["error"]
    assert (err["type"], err["code"]) == ("insufficient_quota", "insufficient_quota")
    now = dt.datetime.now(dt.UTC)
    midnight = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    retry = int(big.headers["retry-after"])
    assert abs(retry - (midnight - now).total_seconds()) < 5
    assert err["message"].startswith(
        "Token budget exhausted: 230 tokens per day, 202 left, this request needs 206 (key 'alice'). "
        f"The budget resets at {midnight:%Y-%m-%dT%H:%M:%SZ} (in {retry}s)."
    )
    assert abs(reset_seconds(big.headers["x-ratelimit-reset-budget"]) - retry) <= 1
    assert big.headers["x-ratelimit-remaining-budget-tokens"] == str(230 - 4 * USED)
    assert len(up.calls_to(ENGINE_CHAT)) == 4  # the refused request never reached the engine


async def test_the_openai_sdk_raises_rate_limit_error_with_code_insufficient_quota():
    # 5 tokens: not even the prompt (6) fits, so the request is refused rather than cut to fit
    cfg = make_config(_keys('{name: alice, sha256: "${ALICE_SHA}", budget: {tokens: 5}}'))
    async with gateway_client(cfg) as (client, _):
        sdk = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key=TEST_KEY, http_client=client, max_retries=0)
        with pytest.raises(openai.RateLimitError) as ei:
            await sdk.chat.completions.create(**CHAT)
    assert ei.value.code == "insufficient_quota"
