"""A key's priority class through the gateway: the class a request may lower (never raise) by header, passed on to
an engine that schedules by priority (vLLM: lower values first; SGLang: higher first) only where the deployment
asks, and refused in config for an engine that cannot; the fair queue's refusals naming their reason."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

from llm_gateway.settings.loader import ConfigError
from tests.conftest import OTHER_KEY, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.unit.test_queue_cancel import Engine, chat, deployment, settled, until

CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}", priority: interactive}
    - {name: bob, sha256: "${BOB_SHA}", priority: batch}
backends:
  - {name: v, engine: ENGINE, url: "http://engine.test"}
models:
  - name: m
    deployments: [{backend: v, model: up, format: safetensors, engine_priority: PASS}]
"""
ANSWER = {
    "id": "c",
    "object": "chat.completion",
    "model": "up",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def sent_priorities(engine: str, passed: bool, requests: list[tuple[str, str | None]]) -> list[Any]:
    up = FakeUpstream(default=FakeAnswer.json(ANSWER))
    cfg = make_config(CONFIG.replace("ENGINE", engine).replace("PASS", str(passed).lower()))
    async with gateway_client(cfg, upstream=up, key=None) as (client, _):
        for key, header in requests:
            headers = {"authorization": f"Bearer {key}"}
            if header is not None:
                headers["x-gateway-priority"] = header
            r = await client.post("/v1/chat/completions", json=HI, headers=headers)
            assert r.status_code == 200, r.text
    return [c.json().get("priority", "absent") for c in up.calls_to("http://engine.test/v1/chat/completions")]


async def test_vllm_gets_the_class_as_its_priority_lower_first() -> None:
    got = await sent_priorities(
        "vllm",
        True,
        [(TEST_KEY, None), (TEST_KEY, "batch"), (TEST_KEY, "default"), (OTHER_KEY, None), (OTHER_KEY, "interactive")],
    )
    # alice is interactive (0), lowers herself to batch (2) and default (1); bob is batch and cannot rise
    assert got == [0, 2, 1, 2, 2]


async def test_sglang_gets_the_class_as_its_priority_higher_first() -> None:
    assert await sent_priorities("sglang", True, [(TEST_KEY, None), (OTHER_KEY, None)]) == [2, 0]


async def test_nothing_is_passed_unless_the_deployment_asks() -> None:
    assert await sent_priorities("vllm", False, [(TEST_KEY, None)]) == ["absent"]


def test_an_engine_that_cannot_schedule_by_priority_is_refused_in_config() -> None:
    text = CONFIG.replace("ENGINE", "llama-server").replace("PASS", "true").replace("safetensors", "gguf")
    with pytest.raises(ConfigError) as e:
        make_config(text)
    assert "does not schedule by priority" in str(e.value)


# -- the queue through the gateway: order and refusals ------------------------------------------------------

QUEUED = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
    - {name: bob, sha256: "${BOB_SHA}", priority: interactive}
routing: {fair_queuing: FAIR}
backends:
  - {name: engine-a, engine: vllm, url: "http://engine-a.test", max_concurrency: 1, max_queue: 3}
models:
  - name: solo
    deployments: [{backend: engine-a, model: upstream-model, format: safetensors}]
"""


async def served_order(fair: bool) -> tuple[list[str], Any]:
    engine = Engine()
    cfg = make_config(QUEUED.replace("FAIR", str(fair).lower()))
    async with gateway_client(cfg, upstream=engine.up, key=None) as (client, app):

        def post(tag: str, key: str) -> asyncio.Task[Any]:
            return asyncio.create_task(
                client.post("/v1/chat/completions", json=chat(tag), headers={"authorization": f"Bearer {key}"})
            )

        first = post("A1", TEST_KEY)
        await until(lambda: len(engine.up.calls) == 1)
        tasks = [first]
        for n, (tag, key) in enumerate([("A2", TEST_KEY), ("A3", TEST_KEY), ("B1", OTHER_KEY)], start=1):
            tasks.append(post(tag, key))
            await until(lambda n=n: deployment(app).admission.queued == n)  # type: ignore[misc]
        full = await client.post(
            "/v1/chat/completions", json=chat("A4"), headers={"authorization": f"Bearer {TEST_KEY}"}
        )
        engine.release.set()
        for t in tasks:
            assert (await settled(t)).status_code == 200
    return engine.seen(), full


async def test_an_interactive_key_goes_before_a_default_keys_backlog() -> None:
    order, full = await served_order(fair=True)
    assert order == ["A1", "B1", "A2", "A3"]
    assert full.status_code == 429 and full.headers["x-gateway-reject-reason"] == "queue_full"
    assert int(full.headers["retry-after"]) >= 1


async def test_without_fair_queuing_it_is_first_come_first_served() -> None:
    order, _ = await served_order(fair=False)
    assert order == ["A1", "A2", "A3", "B1"]


# -- first come, first served (`fair_queuing: false`): the order ignores the class, nothing else does -------------

FIFO = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}", priority: ALICE_CLASS}
    - {name: bob, sha256: "${BOB_SHA}", priority: interactive}
routing: {fair_queuing: false RESERVE}
backends:
  - {name: engine-a, engine: vllm, url: "http://engine-a.test", max_concurrency: LIMIT, max_queue: 8}
models:
  - name: solo
    deployments: [{backend: engine-a, model: upstream-model, format: safetensors}]
"""


def fifo_config(alice: str, limit: int, reserve: str = "") -> Any:
    return make_config(FIFO.replace("ALICE_CLASS", alice).replace("LIMIT", str(limit)).replace("RESERVE", reserve))


def series(app: Any, name: str) -> dict[str, float]:
    """`name`'s samples on /metrics, by their label text."""
    text = app.gw.metrics.render().decode()
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{name}\{{([^}}]*)\}} (\S+)$", text, re.M)}


async def test_without_fair_queuing_an_interactive_key_still_takes_the_slot_reserved_for_it() -> None:
    # the fairness check's D1: every FIFO waiter was `batch`, capped at limit - reserved: 3 of 4 slots, ever
    engine = Engine()
    async with gateway_client(fifo_config("batch", 4, ", reserved_slots: {interactive: 1}"), upstream=engine.up) as (
        client,
        app,
    ):

        def post(tag: str, key: str) -> asyncio.Task[Any]:
            return asyncio.create_task(
                client.post("/v1/chat/completions", json=chat(tag), headers={"authorization": f"Bearer {key}"})
            )

        tasks = [post(f"A{i}", TEST_KEY) for i in range(4)]  # batch fills its three slots, the fourth waits
        await until(lambda: len(engine.up.calls) == 3 and deployment(app).admission.queued == 1)
        tasks.append(post("B1", OTHER_KEY))  # interactive: the kept slot, at once
        await until(lambda: len(engine.up.calls) == 4, timeout_s=3)
        assert deployment(app).admission.in_flight == 4 and "B1" in engine.seen()
        engine.release.set()
        for t in tasks:
            assert (await settled(t)).status_code == 200


async def test_without_fair_queuing_the_queue_metrics_name_each_waiters_own_class_and_key() -> None:
    # the fairness check's D2: every FIFO waiter was counted as `batch`, and no admitted-tokens series existed
    engine = Engine()
    async with gateway_client(fifo_config("default", 1), upstream=engine.up) as (client, app):

        def post(tag: str, key: str) -> asyncio.Task[Any]:
            return asyncio.create_task(
                client.post("/v1/chat/completions", json=chat(tag), headers={"authorization": f"Bearer {key}"})
            )

        tasks = [post("A1", TEST_KEY)]
        await until(lambda: len(engine.up.calls) == 1)
        tasks.append(post("A2", TEST_KEY))
        await until(lambda: deployment(app).admission.queued == 1)
        tasks.append(post("B1", OTHER_KEY))
        await until(lambda: deployment(app).admission.queued == 2)
        assert series(app, "gateway_queue_length") == {
            'priority="batch"': 0.0,
            'priority="default"': 1.0,
            'priority="interactive"': 1.0,
        }
        engine.release.set()
        for t in tasks:
            assert (await settled(t)).status_code == 200
        assert engine.seen() == ["A1", "A2", "B1"]  # still first come, first served
        waits = series(app, "gateway_queue_wait_seconds_count")
        assert (waits['priority="batch"'], waits['priority="default"'], waits['priority="interactive"']) == (0, 1, 1)
        admitted = series(app, "gateway_queue_admitted_tokens_total")
        assert set(admitted) == {'key="alice",priority="default"', 'key="bob",priority="interactive"'}
        assert all(v > 0 for v in admitted.values())
