"""Limiter: scopes per key and key+model, the store-outage policy, and the x-ratelimit-* headers."""

from __future__ import annotations

import fnmatch
import gc
import re
import weakref
from collections.abc import Sequence

import pytest

from llm_gateway.access.keys import Principal
from llm_gateway.access.limiter import Limiter
from llm_gateway.access.memory import MemoryStore
from llm_gateway.access.store import Decision, Quota, Reservation, ScopeLimits, StoreUnavailable
from llm_gateway.errors import RateLimited, ServiceUnavailable
from llm_gateway.settings import Limits


class Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


class DownStore:
    """A store whose backend (Redis) is unreachable."""

    def __init__(self) -> None:
        self.reserve_calls = 0
        self.finish_calls = 0

    async def reserve(self, rid: str, scopes: Sequence[ScopeLimits], tokens: int) -> tuple[Decision, Reservation]:
        self.reserve_calls += 1
        raise StoreUnavailable("redis is down")

    async def finish(self, res: Reservation, actual_tokens: int | None) -> None:
        self.finish_calls += 1

    async def warm_up(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


class SpyStore(MemoryStore):
    """The in-process store, its answers recorded: the limiter asks an inline store through `reserve_now` and
    `finish_now` (its coroutines are never made: they fail here if they are)."""

    def __init__(self) -> None:
        super().__init__(clock=Clock())
        self.reserved: list[tuple[ScopeLimits, ...]] = []
        self.finished: list[tuple[Reservation, int | None]] = []

    def reserve_now(self, rid, scopes, tokens, cost=0):
        self.reserved.append(tuple(scopes))
        return super().reserve_now(rid, scopes, tokens, cost)

    def finish_now(self, res, actual_tokens, actual_cost=None):
        self.finished.append((res, actual_tokens))
        super().finish_now(res, actual_tokens, actual_cost)

    async def reserve(self, rid, scopes, tokens, cost=0):
        raise AssertionError("an inline store is asked through reserve_now")

    async def finish(self, res, actual_tokens, actual_cost=None):
        raise AssertionError("an inline store is settled through finish_now")


def principal(name: str = "alice", limits: Limits | None = None, model_limits: dict[str, Limits] | None = None):
    return Principal(
        name=name,
        id=name,  # the limiter names scopes by the key's id
        model_patterns=(re.compile(".*"),),
        limits=limits or Limits(),
        model_limits=tuple((re.compile(fnmatch.translate(g)), lim) for g, lim in (model_limits or {}).items()),
    )


# -- scopes ------------------------------------------------------------------------------------------


def test_a_key_without_limits_has_no_scopes_and_never_touches_the_store():
    store = SpyStore()
    lim = Limiter(store, fail_open=False)
    assert lim.scopes(principal(), "m") == ()


async def test_admit_without_scopes_admits_without_a_reservation():
    store = SpyStore()
    lim = Limiter(store, fail_open=False)
    assert await lim.admit(principal(), "m", 100, "rid") == (None, None)
    assert store.reserved == []


def test_key_limits_form_one_scope_named_after_the_key():
    lim = Limiter(SpyStore(), fail_open=True, lease_s=99.0)
    got = lim.scopes(principal(limits=Limits(rpm=10, tpm=1000, concurrency=2)), "llama-3")
    assert got == (ScopeLimits("k:alice", 10, 1000, 2, 99.0),)


def test_a_matching_model_limit_adds_a_key_and_model_scope():
    who = principal(limits=Limits(rpm=10), model_limits={"llama-*": Limits(tpm=500)})
    lim = Limiter(SpyStore(), fail_open=True)
    assert lim.scopes(who, "llama-3") == (
        ScopeLimits("k:alice", 10, None, None, 3600.0),
        ScopeLimits("k:alice@m:llama-3", None, 500, None, 3600.0),
    )
    assert lim.scopes(who, "qwen3") == (ScopeLimits("k:alice", 10, None, None, 3600.0),)


def test_model_limits_alone_give_only_the_model_scope():
    who = principal(model_limits={"big-*": Limits(concurrency=1)})
    lim = Limiter(SpyStore(), fail_open=True)
    assert lim.scopes(who, "big-70b") == (ScopeLimits("k:alice@m:big-70b", None, None, 1, 3600.0),)
    assert lim.scopes(who, "small") == ()


def test_an_empty_model_limit_entry_adds_no_scope():
    who = principal(limits=Limits(rpm=1), model_limits={"*": Limits()})
    assert Limiter(SpyStore(), fail_open=True).scopes(who, "x") == (ScopeLimits("k:alice", 1, None, None, 3600.0),)


def test_different_keys_get_different_scopes():
    lim = Limiter(SpyStore(), fail_open=True)
    alice, bob = principal("alice", Limits(rpm=1)), principal("bob", Limits(rpm=2))
    a = lim.scopes(alice, "m")
    b = lim.scopes(bob, "m")
    assert (a, b) == (
        (ScopeLimits("k:alice", 1, None, None, 3600.0),),
        (ScopeLimits("k:bob", 2, None, None, 3600.0),),
    )


def test_scopes_of_a_new_principal_never_come_from_a_freed_one():
    # A cache keyed by id() would hand a freed Principal's scopes to whatever object reuses its address.
    # Whether an interpreter reuses it is luck, so check what rules it out, on any interpreter: the cache
    # keeps its keys alive (a cached Principal is never freed) and tells apart two Principals alike in
    # every field (identity, not equality).
    lim = Limiter(SpyStore(), fail_open=True)
    first = principal("alice", Limits(rpm=1))
    assert lim.scopes(first, "m") == (ScopeLimits("k:alice", 1, None, None, 3600.0),)
    ref = weakref.ref(first)
    del first  # e.g. a config reload dropped the old key objects
    gc.collect()
    assert ref() is not None, "the cache let a cached Principal be freed: its address could be reused"
    twin = principal("alice", Limits(rpm=5))
    assert lim.scopes(twin, "m") == (ScopeLimits("k:alice", 5, None, None, 3600.0),)
    bob = principal("bob", Limits(rpm=2))
    assert lim.scopes(bob, "m") == (ScopeLimits("k:bob", 2, None, None, 3600.0),)


# -- admit / finish ----------------------------------------------------------------------------------


async def test_admit_within_limits_returns_the_decision_and_reservation():
    store = SpyStore()
    lim = Limiter(store, fail_open=False)
    decision, res = await lim.admit(principal(limits=Limits(rpm=5, tpm=1000)), "m", 100, "req-1")
    assert decision is not None and decision.allowed
    assert res is not None and res.active and res.tokens == 100
    assert res.request_id.startswith("req-1#")
    assert decision.requests == Quota(5, 4, 60.0)
    assert decision.tokens == Quota(1000, 900, 60.0)


async def test_over_the_request_limit_raises_429_with_retry_after_and_headers():
    rejected: list[tuple[str, str]] = []
    lim = Limiter(SpyStore(), fail_open=False, on_reject=lambda k, kind: rejected.append((k, kind)))
    who = principal(limits=Limits(rpm=1))
    await lim.admit(who, "m", 0, "r1")
    with pytest.raises(RateLimited) as ei:
        await lim.admit(who, "m", 0, "r2")
    e = ei.value
    assert (e.status, e.type, e.code) == (429, "requests", "rate_limit_exceeded")
    assert e.message == "Rate limit reached for requests: 1 per minute (key 'alice'). Retry after 60s."
    assert e.headers == {
        "retry-after": "60",
        "x-ratelimit-limit-requests": "1",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1m0s",
    }
    assert rejected == [("alice", "requests")]


async def test_over_the_token_limit_raises_429_of_type_tokens():
    rejected: list[tuple[str, str]] = []
    lim = Limiter(SpyStore(), fail_open=False, on_reject=lambda k, kind: rejected.append((k, kind)))
    with pytest.raises(RateLimited) as ei:
        await lim.admit(principal(limits=Limits(tpm=100)), "m", 500, "r")
    assert ei.value.type == "tokens"
    assert ei.value.headers["retry-after"] == "60"
    assert ei.value.headers["x-ratelimit-remaining-tokens"] == "100"
    assert rejected == [("alice", "tokens")]


async def test_concurrency_refusal_is_a_requests_429_with_retry_after_one_second():
    lim = Limiter(SpyStore(), fail_open=False)
    who = principal(limits=Limits(concurrency=1))
    await lim.admit(who, "m", 0, "r1")
    with pytest.raises(RateLimited) as ei:
        await lim.admit(who, "m", 0, "r2")
    assert ei.value.type == "requests"
    assert ei.value.headers == {"retry-after": "1"}


async def test_model_scope_limits_one_model_but_not_another():
    lim = Limiter(SpyStore(), fail_open=False)
    who = principal(limits=Limits(rpm=100), model_limits={"big-*": Limits(rpm=1)})
    await lim.admit(who, "big-70b", 0, "r1")
    with pytest.raises(RateLimited):
        await lim.admit(who, "big-70b", 0, "r2")
    decision, _ = await lim.admit(who, "small-1b", 0, "r3")
    assert decision is not None and decision.requests == Quota(100, 98, 60.0)


async def test_finish_releases_the_concurrency_lease_and_settles_tokens():
    store = SpyStore()
    lim = Limiter(store, fail_open=False)
    who = principal(limits=Limits(tpm=1000, concurrency=1))
    _, res = await lim.admit(who, "m", 900, "r1")
    await lim.finish(res, 50)
    assert store.finished == [(res, 50)]
    decision, _ = await lim.admit(who, "m", 950, "r2")
    assert decision is not None and decision.tokens == Quota(1000, 0, 60.0)


async def test_finish_without_a_reservation_or_of_an_inactive_one_does_nothing():
    store = SpyStore()
    lim = Limiter(store, fail_open=False)
    await lim.finish(None, 10)
    inactive = Reservation("x#0", (), 0, active=False)
    await lim.finish(inactive, 10)
    assert store.finished == []


# -- store outage policy -----------------------------------------------------------------------------


async def test_store_outage_with_fail_open_admits_and_counts_the_error():
    errors: list[int] = []
    store = DownStore()
    lim = Limiter(store, fail_open=True, on_store_error=lambda: errors.append(1))
    assert await lim.admit(principal(limits=Limits(rpm=1)), "m", 10, "r") == (None, None)
    assert await lim.admit(principal(limits=Limits(rpm=1)), "m", 10, "r") == (None, None)
    assert store.reserve_calls == 2
    assert errors == [1, 1]


async def test_store_outage_with_fail_closed_refuses_with_503():
    errors: list[int] = []
    lim = Limiter(DownStore(), fail_open=False, on_store_error=lambda: errors.append(1))
    with pytest.raises(ServiceUnavailable) as ei:
        await lim.admit(principal(limits=Limits(rpm=1)), "m", 10, "r")
    e = ei.value
    assert (e.status, e.code, e.type) == (503, "limits_unavailable", "service_unavailable")
    assert e.headers == {"retry-after": "1"}
    assert errors == [1]


async def test_store_outage_does_not_matter_for_keys_without_limits():
    store = DownStore()
    lim = Limiter(store, fail_open=False)
    assert await lim.admit(principal(), "m", 10, "r") == (None, None)
    assert store.reserve_calls == 0


async def test_finish_after_a_fail_open_admission_does_not_call_the_store():
    store = DownStore()
    lim = Limiter(store, fail_open=True)
    _, res = await lim.admit(principal(limits=Limits(rpm=1)), "m", 10, "r")
    await lim.finish(res, 5)
    assert store.finish_calls == 0


# -- Limiter.quota_headers ---------------------------------------------------------------------------


def quota_headers(d: Decision | None):
    return Limiter(MemoryStore(), fail_open=False).quota_headers(d)


def test_quota_headers_for_no_decision_are_empty():
    assert quota_headers(None) == []


def test_quota_headers_list_requests_then_tokens_in_openai_names():
    d = Decision(True, requests=Quota(60, 59, 1.0), tokens=Quota(150000, 149000, 0.25))
    assert quota_headers(d) == [
        (b"x-ratelimit-limit-requests", b"60"),
        (b"x-ratelimit-remaining-requests", b"59"),
        (b"x-ratelimit-reset-requests", b"1s"),
        (b"x-ratelimit-limit-tokens", b"150000"),
        (b"x-ratelimit-remaining-tokens", b"149000"),
        (b"x-ratelimit-reset-tokens", b"250ms"),
    ]


def test_quota_headers_clamp_negative_remaining_to_zero_and_skip_missing_dimensions():
    d = Decision(True, tokens=Quota(100, -20, 90.0))
    assert quota_headers(d) == [
        (b"x-ratelimit-limit-tokens", b"100"),
        (b"x-ratelimit-remaining-tokens", b"0"),
        (b"x-ratelimit-reset-tokens", b"1m30s"),
    ]


async def test_retry_after_header_is_rounded_up_to_whole_seconds():
    class OneShot(MemoryStore):  # in-process: asked through reserve_now
        def reserve_now(self, rid, scopes, tokens, cost=0):
            return Decision(False, "requests", 2.2, "nope"), Reservation(rid, tuple(scopes), tokens, active=False)

    lim = Limiter(OneShot(), fail_open=False)
    with pytest.raises(RateLimited) as ei:
        await lim.admit(principal(limits=Limits(rpm=1)), "m", 0, "r")
    assert ei.value.headers == {"retry-after": "3"}


async def test_a_store_that_may_suspend_is_asked_through_its_coroutines() -> None:
    # `reserve_now` / `finish_now` are taken only from an in-process store (`InlineStore`); a store that is
    # not one (Redis) is asked through its coroutines, and its settlements are shielded
    calls: list[str] = []

    class Remote:
        def __init__(self) -> None:
            self.counts = MemoryStore(clock=Clock())

        async def reserve(self, rid, scopes, tokens, cost=0, shrink=None):  # type: ignore[no-untyped-def]
            calls.append("reserve")
            return self.counts.reserve_now(rid, scopes, tokens, cost, shrink)

        async def finish(self, res, actual_tokens, actual_cost=None):  # type: ignore[no-untyped-def]
            calls.append("finish")
            self.counts.finish_now(res, actual_tokens, actual_cost)

        async def warm_up(self) -> None:
            return None

        async def aclose(self) -> None:
            return None

    lim = Limiter(Remote(), fail_open=False)
    assert lim.inline is False and Limiter(MemoryStore(), fail_open=False).inline is True
    who = principal(limits=Limits(rpm=10, concurrency=1))
    _, res = await lim.admit(who, "m", 10, "r1")
    await lim.finish(res, 5)
    assert calls == ["reserve", "finish"]
