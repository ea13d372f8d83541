"""Selection: `load_score` and `order()` over CandidateViews (pure functions, no I/O)."""

from __future__ import annotations

import random

import pytest

from llm_gateway.routing.selection import COLD_LOAD, KV_KNEE, UNKNOWN_LOAD, CandidateView, load_score, order
from llm_gateway.types import LoadSnapshot

NOW = 1000.0
STALE = 15.0


def cand(
    key: str,
    *,
    in_flight: int = 0,
    capacity: int = 4,
    reports_load: bool = True,
    load: LoadSnapshot | None = None,
    own_at_probe: int = 0,
    weight: float = 1.0,
    priority: int = 0,
    resident: bool | None = None,
) -> CandidateView:
    return CandidateView(key, in_flight, capacity, reports_load, load, own_at_probe, weight, priority, resident)


def snap(running: float | None = 0.0, waiting: float | None = 0.0, kv: float | None = None, at: float = NOW):
    return LoadSnapshot(running=running, waiting=waiting, kv=kv, at=at)


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


# -- load_score --------------------------------------------------------------------------------------


def test_fresh_idle_snapshot_scores_only_the_gateways_own_in_flight():
    c = cand("a", in_flight=2, capacity=4, load=snap(running=2, waiting=0), own_at_probe=2)
    assert load_score(c, NOW, STALE) == 0.5


def test_external_work_beyond_the_gateways_own_requests_counts_as_load():
    # engine runs 5, the gateway had 2 of them at probe time: 3 belong to other clients
    c = cand("a", in_flight=3, capacity=4, load=snap(running=5, waiting=0), own_at_probe=2)
    assert load_score(c, NOW, STALE) == (3 + 3) / 4


def test_external_load_never_goes_negative_when_own_count_exceeds_engine_report():
    c = cand("a", in_flight=1, capacity=2, load=snap(running=0, waiting=0), own_at_probe=5)
    assert load_score(c, NOW, STALE) == 0.5


def test_engine_queue_adds_its_own_term_on_top_of_external_work():
    c = cand("a", in_flight=0, capacity=4, load=snap(running=4, waiting=2), own_at_probe=0)
    # external = 4 + 2 = 6 -> 6/4, plus the queue 2/4
    assert load_score(c, NOW, STALE) == 6 / 4 + 2 / 4


def test_kv_cache_above_the_knee_adds_a_penalty_proportional_to_the_excess():
    base = cand("a", in_flight=0, capacity=4, load=snap(kv=KV_KNEE))
    hot = cand("a", in_flight=0, capacity=4, load=snap(kv=0.95))
    assert load_score(base, NOW, STALE) == 0.0
    assert load_score(hot, NOW, STALE) == pytest.approx((0.95 - KV_KNEE) * 10)


def test_fresh_snapshot_with_no_running_or_waiting_signal_counts_a_full_unknown_slot():
    c = cand("a", in_flight=1, capacity=4, load=snap(running=None, waiting=None, kv=0.1))
    assert load_score(c, NOW, STALE) == 0.25 + UNKNOWN_LOAD


def test_stale_snapshot_is_unknown_load_not_idle():
    c = cand("a", in_flight=1, capacity=4, load=snap(running=0, waiting=0, at=NOW - STALE - 0.001))
    assert load_score(c, NOW, STALE) == 0.25 + UNKNOWN_LOAD


def test_snapshot_exactly_stale_s_old_is_still_fresh():
    c = cand("a", in_flight=0, capacity=4, load=snap(running=0, waiting=0, at=NOW - STALE))
    assert load_score(c, NOW, STALE) == 0.0


def test_missing_snapshot_from_an_engine_that_reports_load_is_unknown():
    c = cand("a", in_flight=2, capacity=4, reports_load=True, load=None)
    assert load_score(c, NOW, STALE) == 0.5 + UNKNOWN_LOAD


def test_engine_that_never_reports_load_is_judged_by_gateway_count_alone():
    c = cand("a", in_flight=2, capacity=4, reports_load=False, load=None)
    assert load_score(c, NOW, STALE) == 0.5


def test_zero_capacity_is_treated_as_one_slot():
    c = cand("a", in_flight=3, capacity=0, reports_load=False)
    assert load_score(c, NOW, STALE) == 3.0


# -- order: least_load -------------------------------------------------------------------------------


def test_least_load_puts_lowest_load_per_slot_first():
    cands = [
        cand("a", in_flight=3, capacity=4, reports_load=False),
        cand("b", in_flight=1, capacity=4, reports_load=False),
        cand("c", in_flight=2, capacity=4, reports_load=False),
    ]
    assert order("least_load", cands, now=NOW, stale_s=STALE) == [1, 2, 0]


def test_least_load_normalises_by_capacity():
    cands = [
        cand("small", in_flight=2, capacity=2, reports_load=False),  # 1.0
        cand("big", in_flight=4, capacity=16, reports_load=False),  # 0.25
    ]
    assert order("least_load", cands, now=NOW, stale_s=STALE) == [1, 0]


def test_silent_backend_never_looks_idle_next_to_one_that_reports_idle():
    cands = [
        cand("silent", in_flight=0, reports_load=True, load=None),
        cand("stale", in_flight=0, reports_load=True, load=snap(at=NOW - 100)),
        cand("idle", in_flight=0, reports_load=True, load=snap(running=0, waiting=0)),
    ]
    assert order("least_load", cands, now=NOW, stale_s=STALE)[0] == 2


def test_least_load_ties_take_turns_with_rotation():
    cands = [cand(k, reports_load=False) for k in "abc"]
    firsts = [order("least_load", cands, now=NOW, stale_s=STALE, rotation=r)[0] for r in range(6)]
    assert firsts == [0, 1, 2, 0, 1, 2]


def test_order_of_zero_or_one_candidate_is_trivial_for_any_strategy():
    assert order("no-such-strategy", [], now=NOW, stale_s=STALE) == []
    assert order("no-such-strategy", [cand("a")], now=NOW, stale_s=STALE) == [0]


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="unknown strategy 'fastest'"):
        order("fastest", [cand("a"), cand("b")], now=NOW, stale_s=STALE)


def test_order_is_a_permutation_of_all_candidates_for_every_strategy():
    cands = [cand(k, in_flight=i, reports_load=False, priority=i % 2) for i, k in enumerate("abcde")]
    for strategy in ("least_load", "round_robin", "priority", "weighted", "prefix_affinity"):
        got = order(strategy, cands, now=NOW, stale_s=STALE, rotation=3, affinity_key="k", rng=FixedRandom(0.7))
        assert sorted(got) == [0, 1, 2, 3, 4], strategy


# -- order: round_robin ------------------------------------------------------------------------------


def test_round_robin_rotates_the_start_and_ignores_load():
    cands = [
        cand("a", in_flight=9, reports_load=False),
        cand("b", in_flight=0, reports_load=False),
        cand("c", in_flight=5, reports_load=False),
    ]
    assert order("round_robin", cands, now=NOW, stale_s=STALE, rotation=0) == [0, 1, 2]
    assert order("round_robin", cands, now=NOW, stale_s=STALE, rotation=1) == [1, 2, 0]
    assert order("round_robin", cands, now=NOW, stale_s=STALE, rotation=5) == [2, 0, 1]


# -- order: priority ---------------------------------------------------------------------------------


def test_priority_orders_by_priority_value_before_load():
    cands = [
        cand("fallback", in_flight=0, priority=2, reports_load=False),
        cand("primary", in_flight=3, priority=0, reports_load=False),
        cand("secondary", in_flight=0, priority=1, reports_load=False),
    ]
    assert order("priority", cands, now=NOW, stale_s=STALE) == [1, 2, 0]


def test_priority_ties_are_broken_by_load():
    cands = [
        cand("busy", in_flight=3, priority=0, reports_load=False),
        cand("free", in_flight=1, priority=0, reports_load=False),
        cand("later", in_flight=0, priority=1, reports_load=False),
    ]
    assert order("priority", cands, now=NOW, stale_s=STALE) == [1, 0, 2]


# -- order: weighted ---------------------------------------------------------------------------------


def test_weighted_picks_in_proportion_to_weight():
    cands = [cand("a", weight=1.0, reports_load=False), cand("b", weight=3.0, reports_load=False)]
    # r = x * 4: below 1 -> a, from 1 up -> b
    assert order("weighted", cands, now=NOW, stale_s=STALE, rng=FixedRandom(0.2))[0] == 0
    assert order("weighted", cands, now=NOW, stale_s=STALE, rng=FixedRandom(0.25))[0] == 1
    assert order("weighted", cands, now=NOW, stale_s=STALE, rng=FixedRandom(0.99))[0] == 1


def test_weighted_zero_weight_candidate_is_never_first():
    cands = [cand("off", weight=0.0, reports_load=False), cand("on", weight=1.0, reports_load=False)]
    for x in (0.0, 0.5, 0.999):
        assert order("weighted", cands, now=NOW, stale_s=STALE, rng=FixedRandom(x))[0] == 1


def test_weighted_failover_after_the_pick_is_by_load():
    cands = [
        cand("a", weight=1, in_flight=3, reports_load=False),
        cand("b", weight=1, in_flight=2, reports_load=False),
        cand("c", weight=1, in_flight=0, reports_load=False),
        cand("d", weight=1, in_flight=1, reports_load=False),
    ]
    # x = 0.3 -> r = 1.2 -> second candidate
    assert order("weighted", cands, now=NOW, stale_s=STALE, rng=FixedRandom(0.3)) == [1, 2, 3, 0]


def test_weighted_distribution_roughly_follows_weights():
    cands = [cand("a", weight=1.0, reports_load=False), cand("b", weight=9.0, reports_load=False)]
    rng = random.Random(1234)
    firsts = [order("weighted", cands, now=NOW, stale_s=STALE, rng=rng)[0] for _ in range(2000)]
    share_b = firsts.count(1) / len(firsts)
    assert 0.86 < share_b < 0.94


# -- order: prefix_affinity --------------------------------------------------------------------------


def _affinity_first(cands, key, **kw):
    return order("prefix_affinity", cands, now=NOW, stale_s=STALE, affinity_key=key, **kw)[0]


def test_prefix_affinity_sends_the_same_key_to_the_same_deployment():
    cands = [cand(f"backend-{i}/m", reports_load=False) for i in range(4)]
    for key in ("session-1", "session-2", "abc", "zzz"):
        firsts = {_affinity_first(cands, key, rotation=r) for r in range(4)}
        assert len(firsts) == 1, key


def test_prefix_affinity_spreads_different_keys_over_deployments():
    cands = [cand(f"backend-{i}/m", reports_load=False) for i in range(4)]
    used = {_affinity_first(cands, f"session-{n}") for n in range(200)}
    assert used == {0, 1, 2, 3}


def test_prefix_affinity_is_stable_when_another_deployment_goes_away():
    keys = [f"b{i}/m" for i in range(5)]
    full = [cand(k, reports_load=False) for k in keys]
    for n in range(100):
        sticky_key = keys[_affinity_first(full, f"s-{n}")]
        victim = next(k for k in keys if k != sticky_key)
        fewer = [c for c in full if c.key != victim]
        assert fewer[_affinity_first(fewer, f"s-{n}")].key == sticky_key


def test_prefix_affinity_leaves_an_overloaded_sticky_deployment_for_least_load():
    base = [cand(f"b{i}/m", reports_load=False) for i in range(3)]
    sticky = _affinity_first(base, "session-x")
    loaded = [
        cand(c.key, in_flight=(8 if i == sticky else i), capacity=4, reports_load=False) for i, c in enumerate(base)
    ]
    got = order("prefix_affinity", loaded, now=NOW, stale_s=STALE, affinity_key="session-x", max_affinity_load=1.5)
    assert got[0] != sticky
    assert got == order("least_load", loaded, now=NOW, stale_s=STALE)


def test_prefix_affinity_keeps_sticky_at_exactly_max_load_and_orders_the_rest_by_load():
    base = [cand(f"b{i}/m", reports_load=False) for i in range(3)]
    sticky = _affinity_first(base, "session-y")
    others = [i for i in range(3) if i != sticky]
    loads = {sticky: 6, others[0]: 3, others[1]: 1}  # sticky at 6/4 = 1.5 == max
    loaded = [cand(c.key, in_flight=loads[i], capacity=4, reports_load=False) for i, c in enumerate(base)]
    got = order("prefix_affinity", loaded, now=NOW, stale_s=STALE, affinity_key="session-y", max_affinity_load=1.5)
    assert got == [sticky, others[1], others[0]]


def test_prefix_affinity_without_a_key_is_least_load():
    cands = [
        cand("a", in_flight=2, reports_load=False),
        cand("b", in_flight=0, reports_load=False),
        cand("c", in_flight=1, reports_load=False),
    ]
    assert order("prefix_affinity", cands, now=NOW, stale_s=STALE, affinity_key=None) == [1, 2, 0]


# -- residency ---------------------------------------------------------------------------------------


def test_a_cold_deployment_counts_one_capacity_of_load_and_unknown_residency_counts_nothing():
    assert COLD_LOAD == 1.0
    warm, cold, unknown = (cand("x", in_flight=1, reports_load=False, resident=r) for r in (True, False, None))
    assert load_score(warm, NOW, STALE) == load_score(unknown, NOW, STALE) == 0.25
    assert load_score(cold, NOW, STALE) == 1.25


@pytest.mark.parametrize("strategy", ["least_load", "priority", "prefix_affinity"])
def test_resident_idle_then_resident_busy_then_cold(strategy: str):
    cands = [
        cand("cold", reports_load=False, resident=False),
        cand("busy", in_flight=3, reports_load=False, resident=True),
        cand("idle", in_flight=0, reports_load=False, resident=True),
    ]
    for rotation in range(3):
        assert order(strategy, cands, now=NOW, stale_s=STALE, rotation=rotation) == [2, 1, 0]


def test_a_cold_deployment_wins_only_once_the_warm_one_is_past_saturation():
    def first(warm_in_flight: int) -> str:
        cands = [
            cand("warm", in_flight=warm_in_flight, reports_load=False, resident=True),
            cand("cold", reports_load=False, resident=False),
        ]
        return cands[order("least_load", cands, now=NOW, stale_s=STALE)[0]].key

    assert [first(n) for n in (0, 3)] == ["warm", "warm"]  # busy but with a free slot: stay warm
    assert first(5) == "cold"  # 5 of 4 slots: a cold load is the lesser wait


def test_unknown_residency_is_ordered_as_before():
    cands = [cand("a", in_flight=2, reports_load=False), cand("b", in_flight=1, reports_load=False, resident=None)]
    assert order("least_load", cands, now=NOW, stale_s=STALE) == [1, 0]


def test_a_cold_engine_that_reports_load_is_still_behind_a_warm_busy_one():
    cands = [
        cand("cold", load=snap(running=0.0), resident=False),
        cand("warm", load=snap(running=2.0), resident=True),
    ]
    assert order("least_load", cands, now=NOW, stale_s=STALE) == [1, 0]


def test_weighted_failover_after_its_pick_puts_the_cold_deployment_last():
    cands = [
        cand("pick", weight=1.0, reports_load=False, resident=True),
        cand("cold", weight=0.0, reports_load=False, resident=False),
        cand("warm", weight=0.0, in_flight=2, reports_load=False, resident=True),
    ]
    assert order("weighted", cands, now=NOW, stale_s=STALE, rng=FixedRandom(0.0)) == [0, 2, 1]
