"""Retries through HTTP: a backend's failure (connection refused, 503) is retried on another deployment,
bounded by `routing.retries` and by `routing.retry_budget_s`, with full-jitter backoff between attempts
(uniform in [0, backoff_base_ms * 2 ** (attempt - 1)]; no attempt starts once the budget is spent, so a
pause that would reach its end ends the retries at once); never for the client's own error (a 400 from
the engine), never after the first byte of a stream.

Engines are played by a FakeUpstream; the dispatcher's backoff is observed by standing in for
`asyncio` in llm_gateway.routing.dispatch (only its `sleep` is looked at) and through its `rng` seam. The budget
is checked on a virtual clock standing in for `time` in llm_gateway.routing.dispatch (engines "take" tens of
seconds by advancing it), so that a loaded machine cannot make these tests flaky; one test on the real
clock checks the same thing where it cannot flake (an attempt that alone outlasts the budget).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import orjson
import pytest
from multidict import CIMultiDict

from llm_gateway.routing import dispatch
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, cut, refused

NAMES = ["engine-a", "engine-b", "engine-c", "engine-d"]
CHAT = {"model": "quad", "messages": [{"role": "user", "content": "hello"}]}


def config(routing: str, first_byte_s: float = 5.0) -> Any:
    backends = "".join(
        f'  - {{name: {n}, engine: vllm, url: "http://{n}.test", timeouts: {{first_byte_s: {first_byte_s}}}}}\n'
        for n in NAMES
    )
    deps = "".join(f"      - {{backend: {n}, model: upstream-model, format: safetensors}}\n" for n in NAMES)
    return make_config(
        f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
routing: {routing}
backends:
{backends}models:
  - name: quad
    deployments:
{deps}"""
    )


def chat_json() -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "upstream-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    )


def unavailable(delay_s: float = 0.0) -> FakeAnswer:
    body = orjson.dumps({"object": "error", "message": "engine overloaded", "type": "ServiceUnavailable", "code": 503})
    return FakeAnswer(503, {"content-type": "application/json"}, [body], delay_s=delay_s)


def sse(*events: dict[str, Any] | str) -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n\n" for e in events)


def delta(content: str) -> dict[str, Any]:
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }


def all_answer(reply: Any) -> FakeUpstream:
    """Every engine answers its chat completions with `reply`."""
    return FakeUpstream({("POST", "/v1/chat/completions"): reply})


def hosts(up: FakeUpstream) -> list[str]:
    return [str(urlsplit(c.url).hostname).removesuffix(".test") for c in up.calls]


Handler = Callable[[str, str, CIMultiDict[str], bytes | None], Awaitable[FakeAnswer | BaseException]]


def by_call_number(answers: Callable[[int], FakeAnswer | BaseException]) -> Handler:
    """A handler answering the n-th engine call (from 0), whichever engine it reaches."""
    n = 0

    async def handler(method: str, url: str, headers: CIMultiDict[str], body: bytes | None) -> Any:
        nonlocal n
        n += 1
        return answers(n - 1)

    return handler


class Clock:
    """Stands in for `time` inside llm_gateway.routing.dispatch: real monotonic time plus what tests advance."""

    def __init__(self) -> None:
        self.offset = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class Sleeps:
    """Stands in for `asyncio` inside llm_gateway.routing.dispatch: records each backoff pause; sleeps it for
    real, or, given a virtual clock, advances that clock instead."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.delays: list[float] = []
        self.clock = clock

    async def sleep(self, seconds: float) -> None:
        self.delays.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)
            seconds = 0
        await asyncio.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


class RecordingRandom(random.Random):
    """The dispatcher's rng, recording the bounds it is asked to draw in."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.bounds: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        self.bounds.append((a, b))
        return super().uniform(a, b)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(dispatch, "time", c)
    return c


@pytest.fixture
def virtual_sleeps(monkeypatch: pytest.MonkeyPatch, clock: Clock) -> Sleeps:
    s = Sleeps(clock)
    monkeypatch.setattr(dispatch, "asyncio", s)
    return s


def taking(clock: Clock, seconds: float, answer: FakeAnswer | BaseException) -> Handler:
    """An engine that takes `seconds` of the virtual clock to give `answer`."""

    async def handler(method: str, url: str, headers: CIMultiDict[str], body: bytes | None) -> Any:
        clock.advance(seconds)
        return answer

    return handler


def retried_metric(app: Any) -> float:
    total = 0.0
    for line in app.gw.metrics.render().decode().splitlines():
        if line.startswith("gateway_retries_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- count: each failing deployment once, on another deployment each time ----------------------------


async def test_a_refused_connection_is_retried_on_each_other_deployment_once_when_the_retry_count_allows() -> None:
    up = all_answer(refused())
    async with gateway_client(config("{retries: 10, backoff_base_ms: 0}"), upstream=up) as (client, app):
        r = await client.post("/v1/chat/completions", json=CHAT)
        states = {n: app.gw.runtime.table.backends[n].state for n in NAMES}
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_unreachable"
    assert sorted(hosts(up)) == NAMES  # four attempts, every one on a deployment not tried before
    assert states == dict.fromkeys(NAMES, "down")


async def test_after_the_last_deployment_fails_the_error_comes_at_once_with_no_pause_or_retry_counted(
    virtual_sleeps: Sleeps,
) -> None:
    up = all_answer(refused())
    async with gateway_client(config("{retries: 10, backoff_base_ms: 100}"), upstream=up) as (client, app):
        r = await client.post("/v1/chat/completions", json=CHAT)
        retried = retried_metric(app)
    assert r.status_code == 502, r.text
    assert sorted(hosts(up)) == NAMES
    assert retried == 3  # three retries happened, after the first attempt; the fourth failure ends it
    assert len(virtual_sleeps.delays) == 3  # a pause before each retry, none after the last failure


async def test_the_retry_count_bounds_the_attempts_even_when_more_deployments_are_left() -> None:
    up = all_answer(unavailable())
    async with gateway_client(config("{retries: 2, backoff_base_ms: 0, breaker_failures: 100}"), upstream=up) as (
        client,
        app,
    ):
        r = await client.post("/v1/chat/completions", json=CHAT)
        retried = retried_metric(app)
    assert r.status_code == 503, r.text
    assert r.json()["error"]["code"] == "upstream_error" and "engine overloaded" in r.json()["error"]["message"]
    tried = hosts(up)
    assert len(tried) == 3 and len(set(tried)) == 3  # 1 attempt + 2 retries, each on another deployment
    assert r.headers["x-gateway-backend"] == tried[-1]
    assert retried == 2


async def test_a_retry_that_succeeds_is_served_by_another_deployment_than_the_one_that_failed() -> None:
    up = all_answer(by_call_number(lambda n: unavailable() if n == 0 else chat_json()))
    async with gateway_client(config("{retries: 3, backoff_base_ms: 0}"), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200, r.text
    failed, served = hosts(up)
    assert failed != served and r.headers["x-gateway-backend"] == served


# -- time: the budget stops the attempts ------------------------------------------------------------------


async def test_attempts_stop_once_the_retry_budget_is_spent_even_with_retries_and_deployments_left(
    clock: Clock,
) -> None:
    # each attempt takes 40 s to fail: after two (80 s) the 100 s budget is not spent, after three it is
    up = all_answer(taking(clock, 40, unavailable()))
    cfg = config("{retries: 10, retry_budget_s: 100, backoff_base_ms: 0, breaker_failures: 100}")
    async with gateway_client(cfg, upstream=up) as (client, app):
        r = await client.post("/v1/chat/completions", json=CHAT)
        retried = retried_metric(app)
    assert r.status_code == 503, r.text
    tried = hosts(up)
    assert len(tried) == 3 and len(set(tried)) == 3, tried  # the fourth deployment is never asked
    assert r.headers["x-gateway-backend"] == tried[-1]
    assert retried == 2


async def test_with_a_budget_larger_than_the_failures_take_every_deployment_is_tried(clock: Clock) -> None:
    up = all_answer(taking(clock, 40, unavailable()))
    cfg = config("{retries: 10, retry_budget_s: 200, backoff_base_ms: 0, breaker_failures: 100}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and sorted(hosts(up)) == NAMES


async def test_on_the_real_clock_an_attempt_that_outlasts_the_budget_is_not_retried() -> None:
    # one attempt takes 0.5 s to fail (FakeUpstream sleeps it): the 0.3 s budget is spent by then
    up = all_answer(unavailable(delay_s=0.5))
    cfg = config("{retries: 10, retry_budget_s: 0.3, backoff_base_ms: 0, breaker_failures: 100}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        t = time.monotonic()
        r = await client.post("/v1/chat/completions", json=CHAT)
        took = time.monotonic() - t
    assert r.status_code == 503, r.text
    assert len(up.calls) == 1
    assert took >= 0.5  # the attempt itself ran to its end: the budget bounds retries, not one attempt


async def test_a_backoff_pause_that_would_spend_the_budget_ends_the_retries_without_waiting_for_it(
    virtual_sleeps: Sleeps,
) -> None:
    # backoff_base_ms 1000000: the first pause is drawn in [0, 1000 s] (seeded: 134 s), past the 100 s budget
    up = all_answer(unavailable())
    cfg = config("{retries: 10, retry_budget_s: 100, backoff_base_ms: 1000000, breaker_failures: 100}")
    rng = RecordingRandom(1)
    async with gateway_client(cfg, upstream=up) as (client, app):
        app.gw.runtime.dispatcher.rng = rng
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert rng.bounds[0] == (0, 1000000.0) and random.Random(1).uniform(0, 1000) > 100
    assert r.status_code == 503, r.text
    assert len(up.calls) == 1, f"an attempt started after the budget was spent: {hosts(up)}"
    assert virtual_sleeps.delays == []  # nor did the client wait out the rest of the budget for nothing


# -- backoff: jittered, within the bounds derived from backoff_base_ms ----------------------------------


async def test_backoff_is_uniform_between_zero_and_base_times_two_to_the_attempt(virtual_sleeps: Sleeps) -> None:
    up = all_answer(unavailable())
    cfg = config("{retries: 3, retry_budget_s: 30, backoff_base_ms: 40, breaker_failures: 100}")
    rng = RecordingRandom(2024)
    async with gateway_client(cfg, upstream=up) as (client, app):
        app.gw.runtime.dispatcher.rng = rng
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503 and len(up.calls) == 4
    assert rng.bounds == [(0, 40.0), (0, 80.0), (0, 160.0)]  # one pause between each two attempts
    same = random.Random(2024)
    assert virtual_sleeps.delays == pytest.approx(
        [same.uniform(0, 40) / 1000, same.uniform(0, 80) / 1000, same.uniform(0, 160) / 1000]
    )
    for k, d in enumerate(virtual_sleeps.delays):
        assert 0 <= d <= 0.040 * 2**k


async def test_consecutive_backoff_pauses_are_jittered_not_fixed(virtual_sleeps: Sleeps) -> None:
    # eight requests, each failing once then served by another deployment: eight first pauses
    up = all_answer(by_call_number(lambda n: unavailable() if n % 2 == 0 else chat_json()))
    cfg = config("{retries: 1, retry_budget_s: 30, backoff_base_ms: 50, breaker_failures: 100}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        rs = [await client.post("/v1/chat/completions", json=CHAT) for _ in range(8)]
    assert [r.status_code for r in rs] == [200] * 8
    assert len(virtual_sleeps.delays) == 8
    assert all(0 <= d <= 0.050 for d in virtual_sleeps.delays), virtual_sleeps.delays
    assert len(set(virtual_sleeps.delays)) == 8, f"the pauses repeat: {virtual_sleeps.delays}"
    assert max(virtual_sleeps.delays) - min(virtual_sleeps.delays) > 0.005  # spread, not one value with float noise
    tried = hosts(up)
    assert all(tried[i] != tried[i + 1] for i in range(0, 16, 2))  # each retry on another deployment


# -- what is not retried ----------------------------------------------------------------------------------


async def test_a_400_from_the_engine_is_the_clients_error_and_is_not_retried() -> None:
    body = orjson.dumps(
        {"object": "error", "message": "max_tokens is too large", "type": "BadRequestError", "code": 400}
    )
    up = all_answer(FakeAnswer(400, {"content-type": "application/json"}, [body]))
    async with gateway_client(config("{retries: 10, backoff_base_ms: 0}"), upstream=up) as (client, app):
        r = await client.post("/v1/chat/completions", json=CHAT)
        retried = retried_metric(app)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"].startswith("max_tokens is too large")
    assert len(up.calls) == 1
    assert r.headers["x-gateway-backend"] == hosts(up)[0]
    assert retried == 0


async def test_a_stream_that_fails_before_its_first_byte_is_retried_on_another_deployment() -> None:
    good = FakeAnswer.sse(sse(delta("hi"), "[DONE]"))
    up = all_answer(by_call_number(lambda n: refused() if n == 0 else good))
    async with gateway_client(config("{retries: 3, backoff_base_ms: 0}"), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    failed, served = hosts(up)
    assert failed != served and r.headers["x-gateway-backend"] == served
    assert '"content":"hi"' in r.text and r.text.rstrip().endswith("data: [DONE]")


async def test_a_stream_cut_after_its_first_byte_is_not_retried() -> None:
    broken = FakeAnswer.sse(sse(delta("Hel")), cut())
    good = FakeAnswer.sse(sse(delta("fresh"), "[DONE]"))
    up = all_answer(by_call_number(lambda n: broken if n == 0 else good))
    async with gateway_client(config("{retries: 3, backoff_base_ms: 0}"), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 200  # the head was sent with the first byte
    assert len(up.calls) == 1 and r.headers["x-gateway-backend"] == hosts(up)[0]
    events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e.startswith("data: ")]
    assert orjson.loads(events[0])["choices"][0]["delta"]["content"] == "Hel"
    assert orjson.loads(events[1])["error"]["code"] == "stream_interrupted"
    assert events[2:] == ["[DONE]"] and "fresh" not in r.text
