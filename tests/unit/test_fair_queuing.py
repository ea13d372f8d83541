"""The ordering rules of a deployment's wait queue, shown deterministically: priority classes with a
starvation bound, token-weighted fair share across keys inside a class (with weights, the lift of a key
that starts waiting, and correction by the real usage), FIFO inside one key, a client that leaves, the
queue position, and Retry-After from the drain rate. A fake clock; no timing."""

from __future__ import annotations

import asyncio

from llm_gateway.routing.admission import Admission, Ticket


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def settle_loop() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def queue_up(a: Admission, tickets: list[tuple[str, Ticket]], served: list[str]) -> list[asyncio.Task[None]]:
    """One waiter per ticket, queued in this order; each appends its name to `served` when admitted."""

    async def wait(name: str, t: Ticket) -> None:
        if await a.wait_enter(60.0, t):
            served.append(name)

    tasks = []
    before = a.queued
    for name, t in tickets:
        tasks.append(asyncio.create_task(wait(name, t)))
        await settle_loop()
    assert a.queued == before + len(tickets)
    return tasks


async def drain(a: Admission, n: int) -> None:
    for _ in range(n):
        a.leave()
        await settle_loop()


async def test_a_flooding_key_gets_its_share_not_every_slot() -> None:
    a = Admission(1, max_queue=100)
    flood = Ticket("A", cost=100)
    assert a.try_enter(flood)
    served: list[str] = []
    tasks = await queue_up(a, [(f"A{i}", flood) for i in range(6)] + [("B0", Ticket("B", cost=100))], served)
    await drain(a, 7)
    await asyncio.gather(*tasks)
    # B joined behind six of A's, but A was already being served and B was not: B goes first, not seventh
    assert served[0] == "B0"
    assert served[1:] == ["A0", "A1", "A2", "A3", "A4", "A5"]  # one key's own requests stay in order


async def test_alternation_between_two_busy_keys_by_tokens() -> None:
    a = Admission(1, max_queue=100)
    assert a.try_enter(Ticket("A", cost=10))
    served: list[str] = []
    big, small = Ticket("A", cost=300), Ticket("B", cost=100)
    tasks = await queue_up(
        a, [("A1", big), ("A2", big), ("B1", small), ("B2", small), ("B3", small), ("B4", small)], served
    )
    await drain(a, 6)
    await asyncio.gather(*tasks)
    # token-weighted: one 300-token request of A is worth three 100-token ones of B
    assert served == ["B1", "A1", "B2", "B3", "B4", "A2"]


async def test_weights_buy_a_larger_share() -> None:
    a = Admission(1, max_queue=100)
    assert a.try_enter(Ticket("x", cost=1))
    served: list[str] = []
    heavy, light = Ticket("H", cost=100, weight=2.0), Ticket("L", cost=100)
    tasks = await queue_up(a, [(f"L{i}", light) for i in range(3)] + [(f"H{i}", heavy) for i in range(6)], served)
    await drain(a, 9)
    await asyncio.gather(*tasks)
    first_six = served[:6]
    assert sum(n.startswith("H") for n in first_six) == 4  # weight 2 : 1 -> 4 : 2 of the slots
    assert sum(n.startswith("L") for n in first_six) == 2


async def test_a_higher_class_goes_first_even_when_it_came_later() -> None:
    a = Admission(1, max_queue=100)
    assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(
        a,
        [("batch1", Ticket("b", priority=0)), ("batch2", Ticket("b", priority=0)), ("inter", Ticket("i", priority=2))],
        served,
    )
    await drain(a, 3)
    await asyncio.gather(*tasks)
    assert served == ["inter", "batch1", "batch2"]


async def test_a_lower_class_waiting_past_the_starvation_bound_goes_next() -> None:
    clock = Clock()
    a = Admission(1, max_queue=100, starvation_s=10.0, clock=clock)
    assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(a, [("batch", Ticket("b", priority=0))], served)
    clock.t += 11.0  # the batch request has waited 11 s
    tasks += await queue_up(a, [("inter1", Ticket("i", priority=2)), ("inter2", Ticket("i", priority=2))], served)
    await drain(a, 3)
    await asyncio.gather(*tasks)
    assert served == ["batch", "inter1", "inter2"]


async def test_below_the_bound_the_lower_class_waits() -> None:
    clock = Clock()
    a = Admission(1, max_queue=100, starvation_s=10.0, clock=clock)
    assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(a, [("batch", Ticket("b", priority=0))], served)
    clock.t += 9.0
    tasks += await queue_up(a, [("inter", Ticket("i", priority=2))], served)
    await drain(a, 2)
    await asyncio.gather(*tasks)
    assert served == ["inter", "batch"]


async def test_idle_time_is_not_banked_a_key_that_starts_waiting_is_lifted() -> None:
    a = Admission(1, max_queue=100)
    for _ in range(5):  # A used a lot before; C never did
        assert a.try_enter(Ticket("A", cost=100))
        a.leave()
    assert a.try_enter(Ticket("A", cost=100))
    served: list[str] = []
    tasks = await queue_up(a, [("A1", Ticket("A", cost=100)), ("A2", Ticket("A", cost=100))], served)
    tasks += await queue_up(a, [("C1", Ticket("C", cost=100)), ("C2", Ticket("C", cost=100))], served)
    assert a.counter("C") == a.counter("A") - 0.5  # lifted to just below the keys waiting, not left at 0
    await drain(a, 4)
    await asyncio.gather(*tasks)
    assert served == ["C1", "A1", "C2", "A2"]  # alternation, not C twice for its idle past


async def test_settling_with_the_real_usage_corrects_the_counter() -> None:
    a = Admission(2, max_queue=10)
    est = Ticket("A", cost=1000)
    assert a.try_enter(est)
    before = a.counter("A")
    a.settle(est, 100)  # it used 100 of the 1000 reserved
    assert a.counter("A") == before - 900
    a.settle(est, None)  # unknown usage: the estimate stands
    assert a.counter("A") == before - 900


async def test_a_client_that_leaves_is_removed_at_once() -> None:
    a = Admission(1, max_queue=10)
    assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(a, [("gone", Ticket("A")), ("stays", Ticket("B"))], served)
    tasks[0].cancel()
    await settle_loop()
    assert a.queued == 1
    await drain(a, 1)
    await asyncio.gather(tasks[1])
    assert served == ["stays"] and a.in_flight == 1


async def test_queue_positions_follow_the_serving_order() -> None:
    a = Admission(1, max_queue=10)
    assert a.try_enter(Ticket("A", cost=100))
    served: list[str] = []
    tasks = await queue_up(
        a, [("A1", Ticket("A", cost=100)), ("A2", Ticket("A", cost=100)), ("B1", Ticket("B", cost=100))], served
    )
    futs = {w.seq: w.fut for keys in a._classes.values() for q in keys.values() for w in q}
    a1, a2, b1 = (futs[k] for k in sorted(futs))
    assert [a.position(f) for f in (b1, a1, a2)] == [0, 1, 2]  # B1 (not served yet), then A1, then A2
    assert a.queued == 3  # asking changed nothing
    assert a.position(asyncio.get_running_loop().create_future()) is None
    await drain(a, 3)
    await asyncio.gather(*tasks)


async def test_retry_after_comes_from_the_drain_rate() -> None:
    clock = Clock()
    a = Admission(1, max_queue=100, clock=clock)
    assert a.retry_after_s() == 1  # nothing measured yet
    for _ in range(5):  # one slot every 2 s
        assert a.try_enter()
        clock.t += 2.0
        a.leave()
    assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(a, [(f"w{i}", Ticket("A")) for i in range(4)], served)
    assert a.retry_after_s() == 10  # 4 waiting + the newcomer, at 0.5 per second
    await drain(a, 4)
    await asyncio.gather(*tasks)


async def test_reserved_slots_keep_the_last_ones_for_the_higher_class() -> None:
    a = Admission(4, max_queue=10, reserved={2: 1})  # one of four slots kept for interactive (rank 2)
    batch, inter = Ticket("b", priority=0), Ticket("i", priority=2)
    assert [a.try_enter(batch) for _ in range(4)] == [True, True, True, False]  # batch fills three
    assert a.cap(0) == 3 and a.cap(2) == 4
    served: list[str] = []
    tasks = await queue_up(a, [("batch", batch)], served)
    assert a.try_enter(inter)  # the kept slot: at once, past the waiting batch request
    a.leave()  # the interactive one ends: its slot is not the batch's to take
    await settle_loop()
    assert served == [] and a.in_flight == 3
    a.leave()  # a batch slot frees: the batch waiter takes it
    await asyncio.gather(*tasks)
    assert served == ["batch"] and a.in_flight == 3


async def test_a_waiting_higher_class_takes_a_freed_slot_first() -> None:
    a = Admission(2, max_queue=10, reserved={2: 1})
    batch, inter = Ticket("b", priority=0), Ticket("i", priority=2)
    assert a.try_enter(batch) and a.try_enter(inter)
    served: list[str] = []
    tasks = await queue_up(a, [("batch", batch), ("inter", inter)], served)
    a.leave()
    await settle_loop()
    assert served == ["inter"]
    a.leave()  # one slot free, but it is the kept one: batch waits while one is in flight
    await settle_loop()
    assert served == ["inter"] and a.in_flight == 1
    a.leave()
    await asyncio.gather(*tasks)
    assert served == ["inter", "batch"]


# -- first come, first served (fair=False) ---------------------------------------------------------------------


async def test_first_come_first_served_ignores_class_and_share() -> None:
    a = Admission(1, max_queue=10, fair=False)
    batch, inter = Ticket("b", priority=0, cost=100), Ticket("i", priority=2, cost=1)
    assert a.try_enter(batch)
    served: list[str] = []
    tasks = await queue_up(a, [("b1", batch), ("i1", inter), ("b2", batch), ("i2", inter)], served)
    assert a.queued_by_class() == {0: 2, 2: 2}  # each waiter under its own class
    futs = {w.seq: w.fut for keys in a._classes.values() for q in keys.values() for w in q}
    assert [a.position(futs[k]) for k in sorted(futs)] == [0, 1, 2, 3]
    await drain(a, 4)
    await asyncio.gather(*tasks)
    assert served == ["b1", "i1", "b2", "i2"]  # fair queuing would serve i1 and i2 first


async def test_first_come_first_served_keeps_the_reserved_slot_for_its_class_and_lets_it_take_it() -> None:
    a = Admission(2, max_queue=10, reserved={2: 1}, fair=False)
    batch, inter = Ticket("b", priority=0), Ticket("i", priority=2)
    assert a.try_enter(batch) and not a.try_enter(batch)
    served: list[str] = []
    tasks = await queue_up(a, [("b1", batch)], served)
    assert a.try_enter(inter)  # the kept slot, past the waiting batch request
    a.leave()  # the interactive one ends: not a slot for the batch waiter
    await settle_loop()
    assert served == [] and a.in_flight == 1
    a.leave()
    await asyncio.gather(*tasks)
    assert served == ["b1"]


# -- eta_s: the observed release rate of the slots a waiter may take ---------------------------------------------


async def test_eta_counts_the_silence_since_the_last_release_not_only_the_gaps_between_releases() -> None:
    clock = Clock()
    a = Admission(4, max_queue=100, clock=clock)
    for _ in range(4):
        assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(a, [(f"w{i}", Ticket("A")) for i in range(8 + 13)], served)
    for _ in range(8):  # eight short requests end within 8 ms, each slot handed to the next waiter
        clock.t += 0.001
        await drain(a, 1)
    assert len(served) == 8 and a.queued == 13  # then four long ones hold every slot, with 13 waiting
    clock.t += 3.0  # nothing freed for 3 s: the 13th waiter is not "0.0 s" away
    eta = a.eta_s(12)
    assert eta is not None and eta > 3.0
    await drain(a, 13)
    await asyncio.gather(*tasks)


async def test_eta_of_lockstep_releases_is_the_rounds_ahead_not_the_gaps_inside_a_burst() -> None:
    clock = Clock()
    a = Admission(4, max_queue=100, clock=clock)
    for _ in range(4):
        assert a.try_enter()
    served: list[str] = []
    tasks = await queue_up(a, [(f"w{i}", Ticket("A")) for i in range(64)], served)
    assert a.eta_s(12) is None  # nothing measured yet
    for _ in range(10):  # rounds of 0.6 s: four equal generations end together, four waiters take their slots
        clock.t += 0.6
        await drain(a, 4)
        clock.t += 0.0005
    clock.t += 0.3  # half a round in
    eta = a.eta_s(12)  # 13 releases: three rounds and a quarter of 0.6 s (the sawtooth: 0.3 s of it has passed)
    assert eta is not None and 1.6 < eta < 2.4
    await drain(a, 24)
    await asyncio.gather(*tasks)


async def test_eta_counts_only_the_releases_of_slots_the_waiters_class_may_take() -> None:
    clock = Clock()
    a = Admission(4, max_queue=100, reserved={2: 1}, clock=clock)
    batch, inter = Ticket("b", priority=0), Ticket("i", priority=2)
    for _ in range(3):
        assert a.try_enter(batch)
    assert a.try_enter(inter)
    served: list[str] = []
    tasks = await queue_up(a, [(f"b{i}", batch) for i in range(5)], served)
    for _ in range(20):  # the kept slot turns over ten times a second; no batch slot frees
        clock.t += 0.1
        a.leave()
        assert a.try_enter(inter)
    eta = a.eta_s(0, priority=0)
    assert eta is None  # none of those was a slot a batch request may take
    clock.t += 1.0
    a.leave()  # the interactive one ends: three in flight are all a batch request may have
    await settle_loop()
    assert served == [] and a.eta_s(0, priority=0) is None
    a.leave()  # now a batch request ends: the batch waiter b0 takes its slot
    await settle_loop()
    assert served == ["b0"]
    eta = a.eta_s(0, priority=0)
    assert eta is not None and eta > 2.0  # one batch release in 3 s of busy time, not 22
    await drain(a, 6)
    await asyncio.gather(*tasks)
