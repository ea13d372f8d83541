"""Managed backends (routing/managed.py, routing/swap_policy.py): which engine is unloaded to make room, the
batching bound that keeps swaps from thrashing, and the manager's loop driven with a fake process launcher
(the real-process acceptance test is tests/e2e/test_managed_llama.py)."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

from llm_gateway.errors import NoHealthyBackend
from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.managed import Manager
from llm_gateway.routing.swap_policy import Slot, contend, frozen, may_pass, next_to_load, victim
from llm_gateway.routing.table import Backend, build_table
from llm_gateway.settings import GatewayConfig

# -- the policy, pure ---------------------------------------------------------------------------------


def test_the_victim_is_idle_longest_never_one_in_flight_or_waited_for() -> None:
    busy = Slot("busy", resident=True, in_flight=1, last_used=0.0)
    waited = Slot("waited", resident=True, waiting=[5.0], last_used=1.0)
    old = Slot("old", resident=True, last_used=2.0)
    new = Slot("new", resident=True, last_used=9.0)
    starting = Slot("starting", resident=True, starting=True, last_used=0.0)
    gone = Slot("gone", resident=False, last_used=0.0)
    assert victim([busy, waited, new, old, starting, gone], 10.0, 8, 10.0) is old
    assert victim([busy, waited, starting], 10.0, 8, 10.0) is None  # nothing may go: the newcomer waits


def test_a_lower_priority_idle_engine_goes_before_an_older_one() -> None:
    keep = Slot("keep", resident=True, priority=5, last_used=0.0)
    cheap = Slot("cheap", resident=True, priority=0, last_used=8.0)
    assert victim([keep, cheap], 10.0, 8, 10.0) is cheap


def test_the_model_waiting_longest_loads_next() -> None:
    a = Slot("a", waiting=[3.0, 1.0])
    b = Slot("b", waiting=[2.0])
    resident = Slot("r", resident=True, waiting=[0.0])
    assert next_to_load([b, a, resident]) is a
    assert next_to_load([Slot("idle"), resident]) is None


def test_the_batching_bound_holds_newcomers_back_after_a_batch_and_then_the_engine_can_go() -> None:
    s = Slot("a", resident=True, ready_at=100.0, last_used=100.0)
    contend([s], True, 110.0)
    assert s.contended_since == 110.0
    assert may_pass(s, 99.0, 111.0, 2, 10.0)  # queued for this load: always served
    for _ in range(2):
        assert may_pass(s, 110.5, 111.0, 2, 10.0)
        s.batch_admitted += 1
    assert not may_pass(s, 110.5, 111.0, 2, 10.0)  # the third newcomer waits for the next turn
    assert frozen(s, 111.0, 2, 10.0)
    s.waiting.append(110.5)  # it waits: the engine may still go, since the batching rule holds it back
    assert victim([s], 111.0, 2, 10.0) is s
    s2 = Slot("b", resident=True, ready_at=100.0)
    contend([s2], True, 110.0)
    assert not may_pass(s2, 115.0, 120.5, 99, 10.0)  # the hold time bounds it too
    contend([s, s2], False, 121.0)
    assert s.contended_since is None and may_pass(s, 121.0, 121.0, 2, 10.0)


# -- the manager, with a fake launcher ---------------------------------------------------------------------


class FakeProc:
    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._done = asyncio.Event()

    async def wait(self) -> int:
        await self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def exit(self, rc: int) -> None:
        self.returncode = rc
        self._done.set()


class FakeLauncher:
    def __init__(self, start_s: float = 0.05) -> None:
        self.start_s = start_s
        self.procs: dict[str, FakeProc] = {}  # by port: the live ones
        self.started: list[str] = []
        self.max_alive = 0
        self.next_pid = 1000

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None, log: Path | None) -> FakeProc:
        self.next_pid += 1
        p = FakeProc(self.next_pid)
        port = argv[-1]
        self.procs[port] = p
        self.started.append(port)
        self.max_alive = max(self.max_alive, sum(1 for q in self.procs.values() if q.returncode is None))
        return p

    async def stop(self, proc: FakeProc, timeout_s: float) -> None:
        if proc.returncode is None:
            proc.exit(-15)

    async def ready(self, b: Backend) -> bool:
        p = self.procs.get(str(b.cfg.url.rsplit(":", 1)[1]))
        await asyncio.sleep(self.start_s)
        return p is not None and p.returncode is None


def config(
    budget: float | None,
    ttl: float | None = 60.0,
    batch: int = 3,
    hold_s: float = 5.0,
    groups: dict[str, list[str]] | None = None,
    n: int = 3,
) -> GatewayConfig:
    backends = [
        {
            "name": f"m{i}",
            "engine": "llama-server",
            "url": f"http://127.0.0.1:{9100 + i}",
            "managed": {
                "command": ["engine", "--port", "{port}"],
                "memory_mb": 100,
                "idle_ttl_s": ttl,
                "restart_backoff_s": 0.05,
                "max_restarts": 1,
            },
        }
        for i in range(n)
    ]
    models = [
        {"name": f"m{i}", "deployments": [{"backend": f"m{i}", "model": "tiny", "format": "gguf"}]} for i in range(n)
    ]
    return GatewayConfig(
        backends=backends,
        models=models,
        managed={
            "memory_budget_mb": {} if budget is None else {"local": budget},
            "swap_batch": batch,
            "swap_hold_s": hold_s,
            "swap_groups": groups or {},
        },
    )


async def serve(b: Backend, n: int, seconds: float = 0.02, log: list[str] | None = None) -> int:
    """`n` requests one after another through the gate, each in flight for `seconds`; how many were served."""
    assert b.managed is not None
    served = 0
    for _ in range(n):
        assert await b.managed.gate(20.0, None, 1.0)
        b.in_flight += 1  # what dispatch's Attempt does at once after the gate
        if log is not None:
            log.append(b.name)
        await asyncio.sleep(seconds)
        b.in_flight -= 1
        served += 1
    return served


async def make(cfg: GatewayConfig, launcher: FakeLauncher) -> tuple[Manager, dict[str, Backend]]:
    table = build_table(cfg)
    m = Manager(lambda: None, Metrics(), launcher=launcher, ready_check=launcher.ready)  # type: ignore[arg-type,return-value]
    await m.sync(table)
    return m, table.backends


async def test_three_models_with_room_for_one_all_served_never_two_resident_swaps_bounded() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=150, batch=3), launcher)
    try:
        order: list[str] = []
        done = await asyncio.wait_for(asyncio.gather(*(serve(bs[f"m{i}"], 6, log=order) for i in range(3))), 30)
        assert done == [6, 6, 6]
        runs = [len(list(g)) for _, g in itertools.groupby(order)]
        assert max(runs) <= 4, order  # a turn: the request that queued for the load + 3 newcomers, then swap
        assert launcher.max_alive == 1  # the budget holds one
        # batching: each swap serves a batch (what queued + up to 3 newcomers), so 18 requests need few loads
        loads = sum(e.loads for e in m.engines())
        assert 3 <= loads <= 9, launcher.started
    finally:
        await m.aclose()
    assert all(p.returncode is not None for p in launcher.procs.values())  # shutdown stopped them all


async def test_an_idle_engine_is_stopped_after_its_ttl_and_started_again_on_demand() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=1000, ttl=0.3), launcher)
    try:
        await serve(bs["m0"], 1)
        e = bs["m0"].managed
        assert e is not None and e.describe()["phase"] == "ready"
        for _ in range(100):
            if e.describe()["phase"] == "stopped":
                break
            await asyncio.sleep(0.05)
        assert e.describe()["phase"] == "stopped"
        assert bs["m0"].routable()  # stopped, but it starts on demand
        await serve(bs["m0"], 1)
        assert launcher.started == ["9100", "9100"]
    finally:
        await m.aclose()


async def test_a_dead_engine_is_restarted_with_backoff_then_marked_failed() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=1000), launcher)
    try:
        await serve(bs["m1"], 1)
        launcher.procs["9101"].exit(-9)  # killed under it
        await serve(bs["m1"], 1)  # waits for the restart
        assert launcher.started == ["9101", "9101"]
        launcher.procs["9101"].exit(-9)  # dies again: max_restarts (1) spent
        e = bs["m1"].managed
        assert e is not None
        for _ in range(100):
            if e.describe()["phase"] == "failed":
                break
            await asyncio.sleep(0.02)
        assert not bs["m1"].routable()
        with pytest.raises(NoHealthyBackend):
            await e.gate(1.0, None, 1.0)
    finally:
        await m.aclose()


async def test_an_engine_with_a_request_in_flight_is_never_unloaded() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=100, hold_s=0.1, batch=1), launcher)
    try:
        a, b = bs["m0"], bs["m1"]
        assert a.managed is not None and b.managed is not None
        assert await a.managed.gate(5.0, None, 1.0)
        a.in_flight += 1  # a long request on m0
        waiter = asyncio.ensure_future(b.managed.gate(0.5, None, 1.0))
        assert await waiter is False  # m1 could not load: m0 is busy, and stays
        assert a.managed.describe()["phase"] == "ready"
        a.in_flight -= 1
        assert await b.managed.gate(5.0, None, 1.0)  # once m0 is idle, it makes room
        assert a.managed.describe()["phase"] == "stopped"
    finally:
        await m.aclose()


async def test_a_reload_that_drops_a_managed_backend_stops_its_engine_and_keeps_the_others() -> None:
    launcher = FakeLauncher()
    cfg = config(budget=1000)
    m, bs = await make(cfg, launcher)
    try:
        await serve(bs["m0"], 1)
        await serve(bs["m1"], 1)
        kept = cfg.model_copy(update={"backends": cfg.backends[:1] + cfg.backends[2:], "models": cfg.models[:1]})
        table = build_table(kept, previous=build_table(cfg))  # (a reload: m0 is taken over, m1 is gone)
        table.backends["m0"] = bs["m0"]
        await m.sync(table)
        assert launcher.procs["9101"].returncode is not None  # m1's engine was stopped
        assert launcher.procs["9100"].returncode is None  # m0's runs on
        assert [e.backend.name for e in m.engines()] == ["m0", "m2"]
    finally:
        await m.aclose()


async def test_a_request_waiting_for_a_load_is_told_its_place_at_once_and_then_every_progress_s() -> None:
    launcher = FakeLauncher(start_s=0.5)  # a slow load
    m, bs = await make(config(budget=1000), launcher)
    told: list[tuple[int, float | None]] = []

    async def progress(position: int, eta_s: float | None) -> None:
        told.append((position, eta_s))

    try:
        e = bs["m0"].managed
        assert e is not None
        assert await e.gate(5.0, progress, 0.1)
        assert 3 <= len(told) <= 8 and told[0] == (0, None), told
        told.clear()
        assert await e.gate(5.0, progress, 0.1)  # ready: no wait, nothing told
        assert told == []
    finally:
        await m.aclose()


# -- swap groups: models that exclude each other, whatever the budget -----------------------------------


async def test_two_models_of_one_swap_group_alternate_with_one_resident_at_a_time() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=None, groups={"gpu0": ["m0", "m1"]}, batch=2), launcher)
    try:
        for name in ("m0", "m1", "m0"):  # one after another: each load stops the other
            await serve(bs[name], 1)
        assert launcher.started == ["9100", "9101", "9100"]
        order: list[str] = []
        done = await asyncio.wait_for(asyncio.gather(serve(bs["m0"], 6, log=order), serve(bs["m1"], 6, log=order)), 30)
        assert done == [6, 6]  # both served, alternating under the batching rule
        assert max(len(list(g)) for _, g in itertools.groupby(order)) <= 3, order
        assert launcher.max_alive == 1  # never both at once
        await serve(bs["m2"], 1)  # outside the group, no budget: it runs beside the resident one
        assert launcher.max_alive == 2
    finally:
        await m.aclose()


async def test_models_of_different_swap_groups_without_a_budget_run_together() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=None, groups={"a": ["m0", "m1"], "b": ["m2", "m3"]}, n=4), launcher)
    try:
        await serve(bs["m0"], 1)
        await serve(bs["m2"], 1)
        assert launcher.started == ["9100", "9102"]
        assert launcher.procs["9100"].returncode is None and launcher.procs["9102"].returncode is None
    finally:
        await m.aclose()


async def test_a_swap_group_never_unloads_an_engine_with_a_request_in_flight() -> None:
    launcher = FakeLauncher()
    m, bs = await make(config(budget=None, groups={"gpu0": ["m0", "m1"]}, hold_s=0.1, batch=1), launcher)
    try:
        a, b = bs["m0"], bs["m1"]
        assert a.managed is not None and b.managed is not None
        assert await a.managed.gate(5.0, None, 1.0)
        a.in_flight += 1  # a long request on m0
        assert await b.managed.gate(0.5, None, 1.0) is False  # m1 waits: m0 is busy, and stays
        assert a.managed.describe()["phase"] == "ready"
        assert launcher.max_alive == 1
        a.in_flight -= 1
        assert await b.managed.gate(5.0, None, 1.0)  # once m0 is idle, its group makes room
        assert a.managed.describe()["phase"] == "stopped"
        assert launcher.max_alive == 1
    finally:
        await m.aclose()


@pytest.mark.parametrize(
    ("groups", "error"),
    [
        ({"gpu0": ["m0", "nope"]}, "swap_groups.gpu0: no backend named 'nope'"),
        ({"gpu0": ["m0", "plain"]}, "swap_groups.gpu0: backend 'plain' is not managed"),
        (
            {"gpu0": ["m0", "m1"], "gpu1": ["m1", "m2"]},
            "swap_groups.gpu1: backend 'm1' is already in swap group 'gpu0'",
        ),
        ({"gpu0": ["m0"]}, "swap_groups.gpu0: a swap group needs at least two backends (distinct)"),
        ({"gpu0": ["m0", "m0"]}, "swap_groups.gpu0: a swap group needs at least two backends (distinct)"),
        ({"gpu0": ["m0", "far"]}, "swap_groups.gpu0: its backends must share one host"),
        ({"gpu 0": ["m0", "m1"]}, "swap_groups"),
        ({"gpu0": "m0,m1"}, "swap_groups"),
    ],
)
def test_a_swap_group_naming_an_unknown_or_unfit_backend_is_a_config_error(groups: object, error: str) -> None:
    cfg = config(budget=None).model_dump(mode="json")
    cfg["backends"].append({"name": "plain", "engine": "llama-server", "url": "http://127.0.0.1:9200"})
    far = dict(cfg["backends"][0], name="far", url="http://127.0.0.1:9201")
    far["managed"] = dict(far["managed"], host="other")
    cfg["backends"].append(far)
    cfg["managed"]["swap_groups"] = groups
    with pytest.raises(ValidationError, match=re.escape(error)):
        GatewayConfig(**cfg)
