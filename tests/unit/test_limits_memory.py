"""MemoryStore: the in-process sliding-window (60 s) log, with an injected clock; format_reset."""

from __future__ import annotations

import pytest

from llm_gateway.access.memory import MemoryStore
from llm_gateway.access.store import WINDOW_S, Quota, ScopeLimits, format_reset


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(clock: Clock) -> MemoryStore:
    return MemoryStore(clock=clock)


def rpm(n: int, scope: str = "k:alice") -> ScopeLimits:
    return ScopeLimits(scope, n, None, None)


def tpm(n: int, scope: str = "k:alice") -> ScopeLimits:
    return ScopeLimits(scope, None, n, None)


def conc(n: int, scope: str = "k:alice", lease_s: float = 3600.0) -> ScopeLimits:
    return ScopeLimits(scope, None, None, n, lease_s)


# -- requests per minute -----------------------------------------------------------------------------


def test_rpm_admits_exactly_the_limit_within_the_window(store: MemoryStore, clock: Clock):
    results = []
    for _ in range(4):
        d, _ = store.reserve_now("r", [rpm(3)], 0)
        results.append(d.allowed)
        clock.advance(1)
    assert results == [True, True, True, False]


def test_rpm_refusal_names_the_limit_and_waits_for_the_oldest_entry(store: MemoryStore, clock: Clock):
    store.reserve_now("r", [rpm(2)], 0)
    clock.advance(10)
    store.reserve_now("r", [rpm(2)], 0)
    clock.advance(5)
    d, res = store.reserve_now("r", [rpm(2)], 0)
    assert (d.allowed, d.kind) == (False, "requests")
    assert d.message == "Rate limit reached for requests: 2 per minute"
    assert d.retry_after_s == pytest.approx(WINDOW_S - 15)
    assert res.active is False


def test_rpm_window_slides_an_entry_out_exactly_60s_later(store: MemoryStore, clock: Clock):
    store.reserve_now("r", [rpm(1)], 0)
    clock.advance(WINDOW_S - 0.001)
    assert store.reserve_now("r", [rpm(1)], 0)[0].allowed is False
    clock.advance(0.001)
    assert store.reserve_now("r", [rpm(1)], 0)[0].allowed is True


def test_sliding_window_is_not_a_fixed_bucket(store: MemoryStore, clock: Clock):
    store.reserve_now("r", [rpm(2)], 0)  # t=0
    clock.advance(30)
    store.reserve_now("r", [rpm(2)], 0)  # t=30
    clock.advance(30)  # t=60: the first one left the window
    assert store.reserve_now("r", [rpm(2)], 0)[0].allowed is True
    clock.advance(1)  # t=61: entries at 30 and 60 still count
    d, _ = store.reserve_now("r", [rpm(2)], 0)
    assert d.allowed is False
    assert d.retry_after_s == pytest.approx(29.0)


def test_rpm_zero_refuses_with_a_positive_retry_after(store: MemoryStore):
    d, _ = store.reserve_now("r", [rpm(0)], 0)
    assert (d.allowed, d.kind) == (False, "requests")
    assert d.retry_after_s == 0.001


def test_scopes_are_counted_independently(store: MemoryStore):
    assert store.reserve_now("r", [rpm(1, "k:alice")], 0)[0].allowed
    assert store.reserve_now("r", [rpm(1, "k:bob")], 0)[0].allowed
    assert not store.reserve_now("r", [rpm(1, "k:alice")], 0)[0].allowed


# -- quotas reported for headers ---------------------------------------------------------------------


def test_allowed_decision_reports_remaining_requests_and_reset(store: MemoryStore, clock: Clock):
    d1, _ = store.reserve_now("r", [rpm(3)], 0)
    assert d1.requests == Quota(3, 2, WINDOW_S)
    clock.advance(10)
    d2, _ = store.reserve_now("r", [rpm(3)], 0)
    assert d2.requests == Quota(3, 1, WINDOW_S - 10)
    assert d2.tokens is None


def test_allowed_decision_reports_remaining_tokens(store: MemoryStore, clock: Clock):
    d1, _ = store.reserve_now("r", [ScopeLimits("k:a", 10, 1000, None)], 300)
    assert d1.tokens == Quota(1000, 700, WINDOW_S)
    clock.advance(20)
    d2, _ = store.reserve_now("r", [ScopeLimits("k:a", 10, 1000, None)], 200)
    assert d2.tokens == Quota(1000, 500, WINDOW_S - 20)


def test_quota_headers_come_from_the_first_scope_with_that_dimension(store: MemoryStore):
    scopes = [ScopeLimits("k:a", None, 1000, None), ScopeLimits("k:a:m:x", 5, 50, None)]
    d, _ = store.reserve_now("r", scopes, 10)
    assert d.tokens == Quota(1000, 990, WINDOW_S)
    assert d.requests == Quota(5, 4, WINDOW_S)


def test_refusal_carries_the_current_quotas(store: MemoryStore):
    store.reserve_now("r", [ScopeLimits("k:a", 1, 100, None)], 40)
    d, _ = store.reserve_now("r", [ScopeLimits("k:a", 1, 100, None)], 40)
    assert d.allowed is False
    assert d.requests is not None and d.requests.remaining == 0
    assert d.tokens is not None and d.tokens.remaining == 60


# -- tokens per minute -------------------------------------------------------------------------------


def test_tpm_refuses_when_the_reservation_would_exceed_the_limit(store: MemoryStore, clock: Clock):
    assert store.reserve_now("r", [tpm(1000)], 600)[0].allowed
    clock.advance(15)
    d, _ = store.reserve_now("r", [tpm(1000)], 500)
    assert (d.allowed, d.kind) == (False, "tokens")
    assert d.message == "Rate limit reached for tokens: 1000 per minute, 400 left"
    assert d.retry_after_s == pytest.approx(45.0)


def test_tpm_retry_after_waits_only_until_enough_tokens_have_expired(store: MemoryStore, clock: Clock):
    store.reserve_now("r", [tpm(1000)], 300)  # t=0
    clock.advance(10)
    store.reserve_now("r", [tpm(1000)], 300)  # t=10
    clock.advance(10)
    store.reserve_now("r", [tpm(1000)], 300)  # t=20, 100 left
    clock.advance(5)  # t=25
    d, _ = store.reserve_now("r", [tpm(1000)], 600)  # needs the first two to expire: at t=70
    assert d.allowed is False
    assert d.retry_after_s == pytest.approx(45.0)


def test_request_larger_than_the_whole_tpm_is_refused_as_too_large(store: MemoryStore):
    d, _ = store.reserve_now("r", [tpm(100)], 101)
    assert (d.allowed, d.kind) == (False, "tokens")
    assert d.message == "Request too large: it needs 101 tokens, more than the limit of 100 per minute"
    assert d.retry_after_s == WINDOW_S


def test_finish_settles_the_reservation_with_the_real_usage(store: MemoryStore):
    _, res = store.reserve_now("r", [tpm(1000)], 900)
    store.finish_now(res, 100)
    d, _ = store.reserve_now("r", [tpm(1000)], 900)
    assert d.allowed is True
    assert d.tokens == Quota(1000, 0, WINDOW_S)


def test_finish_can_also_charge_more_than_the_estimate(store: MemoryStore):
    _, res = store.reserve_now("r", [tpm(1000)], 100)
    store.finish_now(res, 950)
    d, _ = store.reserve_now("r", [tpm(1000)], 100)
    assert d.allowed is False
    assert d.message.endswith("50 left")


def test_finish_without_actual_tokens_keeps_the_estimate(store: MemoryStore):
    _, res = store.reserve_now("r", [tpm(1000)], 700)
    store.finish_now(res, None)
    assert store.reserve_now("r", [tpm(1000)], 400)[0].allowed is False
    assert store.reserve_now("r", [tpm(1000)], 300)[0].allowed is True


def test_finish_after_the_entry_left_the_window_does_not_corrupt_the_total(store: MemoryStore, clock: Clock):
    _, old = store.reserve_now("r", [tpm(1000)], 500)
    clock.advance(WINDOW_S + 1)
    store.reserve_now("r", [tpm(1000)], 400)  # prunes the old entry
    store.finish_now(old, 10)  # settling a pruned entry must not subtract from the live total
    assert store.reserve_now("r", [tpm(1000)], 600)[0].allowed is True
    assert store.reserve_now("r", [tpm(1000)], 1)[0].allowed is False


def test_finish_settles_every_token_scope_of_a_request(store: MemoryStore):
    scopes = [ScopeLimits("k:a", None, 1000, None), ScopeLimits("k:a:m:x", None, 500, None)]
    _, res = store.reserve_now("r", scopes, 500)
    store.finish_now(res, 50)
    d, _ = store.reserve_now("r", scopes, 450)
    assert d.allowed is True
    assert d.tokens == Quota(1000, 500, WINDOW_S)


def test_finish_twice_settles_only_once(store: MemoryStore):
    _, res = store.reserve_now("r", [ScopeLimits("k:a", None, 1000, 1)], 500)
    store.finish_now(res, 100)
    store.finish_now(res, 900)
    assert res.active is False
    assert store.reserve_now("r", [tpm(1000, "k:a")], 900)[0].allowed is True


# -- concurrency -------------------------------------------------------------------------------------


def test_concurrency_lease_is_held_until_finish(store: MemoryStore):
    _, first = store.reserve_now("r", [conc(1)], 0)
    d, _ = store.reserve_now("r", [conc(1)], 0)
    assert (d.allowed, d.kind, d.retry_after_s) == (False, "concurrency", 1.0)
    assert d.message == "Too many concurrent requests: the limit is 1"
    store.finish_now(first, None)
    assert store.reserve_now("r", [conc(1)], 0)[0].allowed is True


def test_concurrency_lease_expires_on_its_own(store: MemoryStore, clock: Clock):
    store.reserve_now("r", [conc(1, lease_s=30)], 0)  # never finished (a replica died)
    clock.advance(29.9)
    assert store.reserve_now("r", [conc(1, lease_s=30)], 0)[0].allowed is False
    clock.advance(0.1)
    assert store.reserve_now("r", [conc(1, lease_s=30)], 0)[0].allowed is True


def test_the_same_request_id_twice_gets_two_distinct_leases(store: MemoryStore):
    _, a = store.reserve_now("same", [conc(2)], 0)
    _, b = store.reserve_now("same", [conc(2)], 0)
    assert a.request_id != b.request_id
    assert store.reserve_now("x", [conc(2)], 0)[0].allowed is False
    store.finish_now(a, None)
    assert store.reserve_now("x", [conc(2)], 0)[0].allowed is True


# -- atomicity ---------------------------------------------------------------------------------------


def test_a_refusal_in_one_scope_takes_nothing_from_the_others(store: MemoryStore):
    key = ScopeLimits("k:a", 10, 1000, 5)
    model = ScopeLimits("k:a:m:x", 1, None, None)
    assert store.reserve_now("r", [key, model], 100)[0].allowed
    d, res = store.reserve_now("r", [key, model], 100)
    assert d.allowed is False and d.kind == "requests"
    assert res.handles == []
    # only the admitted request counted in the key scope
    d, _ = store.reserve_now("r", [key], 100)
    assert d.requests == Quota(10, 8, WINDOW_S)
    assert d.tokens == Quota(1000, 800, WINDOW_S)


def test_finish_of_a_refused_reservation_releases_nothing(store: MemoryStore):
    _, held = store.reserve_now("r", [conc(1)], 0)
    _, refused = store.reserve_now("r", [conc(1)], 0)
    store.finish_now(refused, 5)
    assert store.reserve_now("r", [conc(1)], 0)[0].allowed is False
    assert held.active is True


def test_the_first_refusing_scope_names_the_refusal(store: MemoryStore):
    scopes = [ScopeLimits("k:a", 0, None, None), ScopeLimits("k:a:m:x", None, 10, None)]
    d, _ = store.reserve_now("r", scopes, 50)
    assert d.kind == "requests"


# -- async wrappers ----------------------------------------------------------------------------------


async def test_async_reserve_and_finish_behave_like_the_sync_ones(store: MemoryStore):
    d, res = await store.reserve("r", [ScopeLimits("k:a", 5, 100, 1)], 60)
    assert d.allowed is True
    assert (await store.reserve("r", [ScopeLimits("k:a", 5, 100, 1)], 10))[0].kind == "concurrency"
    await store.finish(res, 10)
    d2, _ = await store.reserve("r", [ScopeLimits("k:a", 5, 100, 1)], 90)
    assert d2.allowed is True
    assert d2.tokens == Quota(100, 0, WINDOW_S)
    assert await store.aclose() is None


# -- format_reset ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (-3, "0s"),
        (0.25, "250ms"),
        (0.0001, "1ms"),
        (1, "1s"),
        (1.5, "1.5s"),
        (1.01, "1.1s"),  # rounded up to a tenth: never earlier than the real reset
        (59, "59s"),
        (60, "1m0s"),
        (90.5, "1m30.5s"),
        (360, "6m0s"),
    ],
)
def test_format_reset_uses_openais_duration_format(seconds: float, text: str):
    assert format_reset(seconds) == text


def test_format_reset_never_prints_60_seconds_in_a_minute_field():
    assert format_reset(119.97) == "2m0s"


def test_format_reset_rounds_just_under_a_second_to_one_second():
    assert format_reset(0.9999) == "1s"


def test_format_reset_answers_the_same_text_from_its_memo():
    assert [format_reset(47105.0) for _ in range(2)] == ["13h5m5s", "13h5m5s"]  # the second from the memo
    assert [format_reset(x) for x in (0.25, 0.25, 61.04, 61.04)] == ["250ms", "250ms", "1m1.1s", "1m1.1s"]
