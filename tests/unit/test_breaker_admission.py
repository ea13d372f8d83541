"""Breaker (closed / open / half-open with one trial) and Admission (slots + bounded FIFO wait queue)."""

from __future__ import annotations

import asyncio

import pytest

from llm_gateway.routing.admission import Admission
from llm_gateway.routing.breaker import STATE_VALUE, Breaker

# -- Breaker -----------------------------------------------------------------------------------------


def tripped(threshold: int = 3, cooldown: float = 10.0, at: float = 100.0) -> Breaker:
    b = Breaker(threshold, cooldown)
    for _ in range(threshold):
        b.failure(at)
    return b


def test_new_breaker_is_closed_and_lets_everything_through():
    b = Breaker(3, 10.0)
    assert b.state == "closed"
    assert all(b.acquire(0.0) for _ in range(10))
    assert b.available(0.0) is True


def test_breaker_opens_after_threshold_consecutive_failures():
    b = Breaker(3, 10.0)
    b.failure(1.0)
    b.failure(2.0)
    assert b.state == "closed"
    b.failure(3.0)
    assert (b.state, b.opened_at) == ("open", 3.0)


def test_a_success_resets_the_consecutive_failure_count():
    b = Breaker(3, 10.0)
    b.failure(1.0)
    b.failure(2.0)
    b.success()
    b.failure(3.0)
    b.failure(4.0)
    assert (b.state, b.failures) == ("closed", 2)


def test_neutral_outcomes_do_not_count_as_failures_or_successes():
    b = Breaker(2, 10.0)
    b.failure(1.0)
    b.neutral()
    assert (b.state, b.failures) == ("closed", 1)
    b.failure(2.0)
    assert b.state == "open"


def test_open_breaker_refuses_until_the_cooldown_has_passed():
    b = tripped(cooldown=10.0, at=100.0)
    assert b.available(109.99) is False
    assert b.acquire(109.99) is False
    assert b.state == "open"
    assert b.available(110.0) is True


def test_available_does_not_take_the_half_open_trial():
    b = tripped(cooldown=10.0, at=100.0)
    assert b.available(200.0) is True
    assert b.available(200.0) is True
    assert b.state == "open"
    assert b.acquire(200.0) is True


def test_after_cooldown_exactly_one_trial_request_goes_through():
    b = tripped(cooldown=10.0, at=100.0)
    assert b.acquire(110.0) is True
    assert (b.state, b.trial_in_flight) == ("half_open", True)
    assert b.acquire(110.0) is False
    assert b.acquire(111.0) is False
    assert b.available(111.0) is False


def test_successful_trial_closes_the_breaker():
    b = tripped(at=100.0)
    assert b.acquire(110.0)
    b.success()
    assert (b.state, b.failures, b.trial_in_flight) == ("closed", 0, False)
    assert b.acquire(110.0) and b.acquire(110.0)


def test_failed_trial_reopens_the_breaker_for_a_fresh_cooldown():
    b = tripped(cooldown=10.0, at=100.0)
    assert b.acquire(115.0)
    b.failure(115.0)
    assert (b.state, b.opened_at, b.trial_in_flight) == ("open", 115.0, False)
    assert b.acquire(124.0) is False
    assert b.acquire(125.0) is True


def test_a_single_failure_in_half_open_reopens_even_below_threshold():
    b = Breaker(5, 1.0)
    for _ in range(5):
        b.failure(0.0)
    b.acquire(1.0)
    b.success()
    for _ in range(5):
        b.failure(2.0)
    assert b.acquire(3.0) and b.state == "half_open"
    b.failure(3.0)
    assert b.state == "open"


def test_neutral_trial_frees_the_trial_slot_without_closing():
    b = tripped(at=100.0)
    assert b.acquire(110.0)
    b.neutral()
    assert (b.state, b.trial_in_flight) == ("half_open", False)
    assert b.available(110.0) is True
    assert b.acquire(110.0) is True
    assert b.acquire(110.0) is False


def test_state_values_order_closed_half_open_open_for_the_metric():
    assert STATE_VALUE == {"closed": 0, "half_open": 1, "open": 2}


# -- Admission: without waiting ----------------------------------------------------------------------


def test_try_enter_takes_slots_up_to_the_limit():
    a = Admission(2, max_queue=0)
    assert [a.try_enter(), a.try_enter(), a.try_enter()] == [True, True, False]
    assert a.in_flight == 2


def test_leave_without_waiters_frees_a_slot():
    a = Admission(1, max_queue=0)
    a.try_enter()
    a.leave()
    assert a.in_flight == 0
    assert a.try_enter() is True


def test_no_limit_means_unlimited_slots():
    a = Admission(None, max_queue=0)
    assert all(a.try_enter() for _ in range(1000))
    assert a.in_flight == 1000


async def test_can_queue_reflects_the_queue_bound():
    a = Admission(1, max_queue=1)
    assert a.can_queue() is True
    a.try_enter()
    task = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    assert a.can_queue() is False
    a.leave()
    assert await task is True


# -- Admission: waiting ------------------------------------------------------------------------------


async def _queued(a: Admission, n: int) -> None:
    for _ in range(100):
        if a.queued >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"expected {n} waiters, have {a.queued}")


async def test_wait_enter_with_room_enters_at_once():
    a = Admission(1, max_queue=0)
    assert await a.wait_enter(1.0) is True
    assert a.in_flight == 1


async def test_wait_enter_with_a_full_queue_is_refused_immediately():
    a = Admission(1, max_queue=0)
    a.try_enter()
    assert await asyncio.wait_for(a.wait_enter(5.0), 0.5) is False
    assert (a.in_flight, a.queued) == (1, 0)


async def test_leave_hands_the_slot_to_the_waiter_without_freeing_it():
    a = Admission(1, max_queue=4)
    a.try_enter()
    task = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    a.leave()
    assert a.in_flight == 1  # passed on, not released
    assert await task is True
    assert (a.in_flight, a.queued) == (1, 0)


async def test_waiters_are_served_first_in_first_out():
    a = Admission(1, max_queue=4)
    a.try_enter()
    served: list[str] = []

    async def waiter(name: str) -> None:
        if await a.wait_enter(5.0):
            served.append(name)

    tasks = []
    for name in ("first", "second", "third"):
        tasks.append(asyncio.create_task(waiter(name)))
        await _queued(a, len(tasks))
    for _ in range(3):
        a.leave()
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert served == ["first", "second", "third"]
    assert a.in_flight == 1


async def test_a_newcomer_cannot_jump_the_queue_during_hand_over():
    a = Admission(1, max_queue=4)
    a.try_enter()
    task = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    a.leave()  # the slot now belongs to the waiter
    assert a.try_enter() is False
    assert await task is True


async def test_queue_bound_refuses_the_next_waiter():
    a = Admission(1, max_queue=1)
    a.try_enter()
    t1 = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    assert await a.wait_enter(5.0) is False
    a.leave()
    assert await t1 is True


async def test_wait_times_out_without_taking_a_slot():
    a = Admission(1, max_queue=2)
    a.try_enter()
    assert await a.wait_enter(0.01) is False
    assert (a.in_flight, a.queued) == (1, 0)
    a.leave()
    assert a.in_flight == 0


async def test_a_timed_out_waiter_is_skipped_by_leave():
    a = Admission(1, max_queue=2)
    a.try_enter()
    short = asyncio.create_task(a.wait_enter(0.01))
    await _queued(a, 1)
    long = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 2)
    assert await short is False
    a.leave()
    assert await long is True
    assert (a.in_flight, a.queued) == (1, 0)


async def test_cancelling_a_waiter_leaks_no_slot_and_no_queue_place():
    a = Admission(1, max_queue=1)
    a.try_enter()
    task = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (a.in_flight, a.queued, a.can_queue()) == (1, 0, True)
    a.leave()
    assert a.in_flight == 0


async def test_a_waiter_cancelled_just_as_the_slot_is_handed_over_passes_it_on():
    a = Admission(1, max_queue=2)
    a.try_enter()
    doomed = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    nxt = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 2)
    doomed.cancel()  # the cancellation lands first ...
    a.leave()  # ... and the slot is handed to the doomed waiter right after
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert await nxt is True
    assert (a.in_flight, a.queued) == (1, 0)


async def test_a_waiter_cancelled_just_as_the_slot_is_handed_over_releases_it_when_alone():
    a = Admission(1, max_queue=1)
    a.try_enter()
    doomed = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    doomed.cancel()
    a.leave()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    assert (a.in_flight, a.queued) == (0, 0)


async def test_hand_over_racing_a_cancel_never_leaks_a_slot():
    # leave() first, then cancel(): whichever way the race goes, the slot is either held by the
    # waiter (wait_enter returned True) or released again; it is never lost.
    a = Admission(1, max_queue=1)
    a.try_enter()
    task = asyncio.create_task(a.wait_enter(5.0))
    await _queued(a, 1)
    a.leave()
    task.cancel()
    try:
        got = await task
    except asyncio.CancelledError:
        got = False
    if got:
        a.leave()
    assert (a.in_flight, a.queued) == (0, 0)
