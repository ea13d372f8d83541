"""One attempt of a request on one deployment (routing/attempt.py): whatever ends it, its slot (a place in
the deployment's admission, one in its backend's in-flight count) is freed exactly once and the breaker is
told exactly once how it went.

Three levels: the `Attempt` alone, as dispatch takes one (every ending, then every call again: nothing
moves twice); `Dispatcher.run` with exchanges that fail, raise, are cancelled or succeed, and a client
that leaves its queue just as a slot is handed to it; and the whole gateway over raw ASGI, where a client
disconnects in the middle of a stream. The breaker is a `Breaker` that also writes down each report.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from llm_gateway.access.keys import Principal
from llm_gateway.errors import (
    ConnectFailed,
    EngineErrorAnswer,
    InvalidRequest,
    StreamInterrupted,
    UpstreamTimeout,
)
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.admission import Ticket
from llm_gateway.routing.attempt import Attempt
from llm_gateway.routing.breaker import Breaker
from llm_gateway.routing.dispatch import Dispatcher, Progress
from llm_gateway.routing.request_info import RequestInfo, read_request
from llm_gateway.routing.table import Deployment, ModelRoute, RoutingTable, build_table
from llm_gateway.settings import GatewayConfig
from tests.conftest import TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, Stall

ENGINE_CHAT = "http://engine-a.test/v1/chat/completions"


def config(max_concurrency: int = 2, breaker_failures: int = 5) -> GatewayConfig:
    return make_config(
        f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
routing: {{retries: 0, breaker_failures: {breaker_failures}, breaker_cooldown_s: 10}}
backends:
  - name: engine-a
    engine: vllm
    url: http://engine-a.test
    max_concurrency: {max_concurrency}
    max_queue: 4
    timeouts: {{idle_s: 60, total_s: 120}}
models:
  - name: solo
    deployments:
      - {{backend: engine-a, model: upstream-model, format: safetensors}}
"""
    )


class Told(Breaker):
    """A breaker that writes down each report it gets."""

    def __init__(self) -> None:
        super().__init__(threshold=5, cooldown_s=10.0)
        self.told: list[str] = []

    def success(self) -> None:
        self.told.append("success")
        super().success()

    def failure(self, now: float) -> None:
        self.told.append("failure")
        super().failure(now)

    def neutral(self) -> None:
        self.told.append("neutral")
        super().neutral()


def table(cfg: GatewayConfig | None = None) -> tuple[RoutingTable, ModelRoute, Deployment, Told]:
    t = build_table(cfg or config())
    route = t.models[0]
    dep = route.deployments[0]
    dep.breaker = told = Told()
    return t, route, dep, told


CHAT: dict[str, Any] = {"model": "solo", "messages": [{"role": "user", "content": "hi"}]}
TICKET = Ticket("k1", 1, 10.0, 1.0, "alice")


def take(dep: Deployment, route: ModelRoute) -> Attempt:
    """As dispatch takes an attempt: the admission slot, the breaker's permission, then the Attempt."""
    assert dep.admission.try_enter(TICKET)
    assert dep.breaker.acquire(0.0)
    return Attempt(dep, route, TICKET)


def slots(dep: Deployment) -> tuple[int, int]:
    return dep.admission.in_flight, dep.backend.in_flight


def every_call(a: Attempt) -> None:
    """Everything that may still be said to an attempt once it has ended: none of it may move a thing."""
    a.ok()
    a.failed(ConnectFailed("refused"))
    a.ended(StreamInterrupted("cut"))
    a.left()
    a.release()


ENDINGS: dict[str, tuple[Callable[[Attempt], None], list[str]]] = {
    "ok": (lambda a: a.ok(), ["success"]),
    "failed, the engine's fault": (lambda a: a.failed(ConnectFailed("refused")), ["failure"]),
    "failed, the client's fault": (lambda a: a.failed(InvalidRequest("no")), ["success"]),
    "failed, the engine busy": (
        lambda a: a.failed(EngineErrorAnswer("queue full", status=503, code="x", busy=True)),
        ["neutral"],
    ),
    "ended cleanly": (lambda a: a.ended(None), ["success"]),
    "ended by a cut": (lambda a: a.ended(StreamInterrupted("cut")), ["failure"]),
    "ended by a client-side error": (lambda a: a.ended(InvalidRequest("no")), ["success"]),
    "the client left": (lambda a: a.left(), ["neutral"]),
    "nothing said before the release": (lambda a: None, ["neutral"]),
}


@pytest.mark.parametrize("ending", ENDINGS)
def test_whatever_ends_an_attempt_the_slot_is_freed_once_and_the_breaker_told_once(ending: str) -> None:
    _, route, dep, told = table()
    end, expected = ENDINGS[ending]
    a = take(dep, route)
    assert slots(dep) == (1, 1) and not a.released
    end(a)
    assert slots(dep) == (1, 1)  # a report does not free the slot: the caller may still be draining
    a.release()
    assert slots(dep) == (0, 0) and a.released
    every_call(a)
    every_call(a)
    assert slots(dep) == (0, 0)
    assert told.told == expected


def test_an_exception_or_a_cancel_inside_the_callers_block_still_releases_once() -> None:
    _, route, dep, told = table()

    async def answer(a: Attempt, fail: BaseException) -> None:
        try:
            await asyncio.sleep(0)
            raise fail
        finally:
            a.release()

    for fail in (RuntimeError("a bug"), asyncio.CancelledError()):
        a = take(dep, route)
        with pytest.raises(type(fail)):
            asyncio.run(answer(a, fail))
        a.release()
    assert slots(dep) == (0, 0)
    assert told.told == ["neutral", "neutral"]


def test_a_late_report_cannot_clear_the_half_open_trial_of_another_request() -> None:
    """The breaker is half open: A's trial fails (open again); after the cooldown B takes the next trial.
    A stray `left` from A (its client going away after the failure) must not free B's trial."""
    _, route, dep, told = table()
    br = dep.breaker
    br.state, br.opened_at = "open", -100.0  # cooled down: the next acquire is the trial
    a = take(dep, route)
    assert br.state == "half_open" and br.trial_in_flight
    a.ended(UpstreamTimeout("stalled"))
    assert br.state == "open"
    br.opened_at = -100.0
    b = take(dep, route)
    assert br.trial_in_flight
    a.left()
    a.release()
    assert br.trial_in_flight, "A's late report freed B's trial: a second trial could go through"
    b.ok()
    b.release()
    assert (br.state, told.told, slots(dep)) == ("closed", ["failure", "success"], (0, 0))


# -- through Dispatcher.run ----------------------------------------------------------------------------
class Job:
    """What dispatch reads of a request (routing/dispatch.py:Dispatched), with what it is told."""

    def __init__(self, route: ModelRoute, progress: Progress | None = None) -> None:
        self.route = route
        self.info: RequestInfo = read_request(
            "chat", {"model": "solo", "messages": [{"role": "user", "content": "hi"}]}
        )
        self.who = Principal("alice", (), id="k1")
        self.budget = 10
        self.asked_priority: bytes | None = None
        self.progress = progress
        self.progress_s = 0.01
        self.attempts: list[Attempt] = []
        self.waits: list[float] = []

    def session(self) -> str | None:
        return None

    def took(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)

    def waited(self, seconds: float) -> None:
        self.waits.append(seconds)


def dispatcher(cfg: GatewayConfig) -> Dispatcher:
    return Dispatcher(cfg.routing, Metrics(), random.Random(1))


@pytest.mark.parametrize(
    ("fail", "told"),
    [
        (ConnectFailed("refused"), ["failure"]),  # retryable, but no retry is configured and no other deployment
        (InvalidRequest("no"), ["success"]),  # not retryable: the engine answered
        (RuntimeError("a bug in the exchange"), ["neutral"]),
    ],
    ids=["the engine's failure", "the client's error", "a bug"],
)
async def test_an_exchange_that_fails_is_reported_and_released_by_dispatch(
    fail: BaseException, told: list[str]
) -> None:
    cfg = config()
    t, route, dep, br = table(cfg)
    job = Job(route)

    async def exchange(a: Attempt) -> None:
        assert slots(a.deployment) == (1, 1)
        raise fail

    with pytest.raises(type(fail)):
        await dispatcher(cfg).run(t, job, exchange)
    assert slots(dep) == (0, 0) and len(job.attempts) == 1 and job.attempts[0].released
    assert br.told == told


async def test_an_exchange_cancelled_in_flight_is_released_and_says_nothing_of_the_backend() -> None:
    cfg = config()
    t, route, dep, br = table(cfg)
    job = Job(route)
    started = asyncio.Event()

    async def exchange(a: Attempt) -> None:
        started.set()
        await asyncio.sleep(60)

    task = asyncio.create_task(dispatcher(cfg).run(t, job, exchange))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (slots(dep), br.told) == ((0, 0), ["neutral"])


async def test_the_attempt_that_succeeded_keeps_its_slot_until_the_caller_releases_it() -> None:
    cfg = config()
    t, route, dep, br = table(cfg)
    job = Job(route)

    async def exchange(a: Attempt) -> str:
        return "answer"

    a, result = await dispatcher(cfg).run(t, job, exchange)
    assert result == "answer" and job.attempts == [a]
    assert slots(dep) == (1, 1) and br.told == [] and not a.released
    a.ok()
    a.release()
    assert (slots(dep), br.told) == ((0, 0), ["success"])


async def test_a_failed_attempt_is_released_before_the_retry_takes_the_next() -> None:
    cfg = make_config(
        """
server: {access_log: false}
auth: {mode: none}
routing: {retries: 1, backoff_base_ms: 0}
backends:
  - {name: engine-a, engine: vllm, url: "http://engine-a.test", max_concurrency: 1}
  - {name: engine-b, engine: vllm, url: "http://engine-b.test", max_concurrency: 1}
models:
  - name: solo
    deployments:
      - {backend: engine-a, model: m, format: safetensors}
      - {backend: engine-b, model: m, format: safetensors}
"""
    )
    t = build_table(cfg)
    route = t.models[0]
    job = Job(route)

    async def exchange(a: Attempt) -> str:
        if len(job.attempts) == 1:
            raise ConnectFailed("refused")
        assert job.attempts[0].released  # the first one's slot is free before the second runs
        return a.deployment.backend.name

    taken, answered_by = await dispatcher(cfg).run(t, job, exchange)
    first, last = job.attempts
    assert taken is last
    assert last.deployment.backend.name == answered_by and first.deployment is not last.deployment
    assert slots(first.deployment) == (0, 0) and slots(last.deployment) == (1, 1)
    last.release()
    assert all(slots(d) == (0, 0) for d in route.deployments)


async def test_a_client_that_leaves_its_queue_just_as_the_slot_is_handed_over_gives_the_slot_back() -> None:
    """The stream's place in the queue is being reported (its answer started) when the holder finishes:
    the slot is handed to the waiter, and the report then fails (the client is gone). The slot the waiter
    was given goes back, or the deployment would be one slot short for good."""
    cfg = config(max_concurrency=1)
    t, route, dep, _ = table(cfg)
    holder = take(dep, route)

    async def report(position: int, eta_s: float | None) -> None:
        holder.ok()
        holder.release()  # the holder finishes: the slot passes to the waiter...
        await asyncio.sleep(0)
        await asyncio.sleep(0)  # ...whose wait completes...
        raise ConnectionResetError("the client went away")  # ...as its report finds the client gone

    job = Job(route, progress=report)

    async def exchange(a: Attempt) -> None:
        raise AssertionError("a client that left reaches no engine")

    with pytest.raises(ConnectionResetError):
        await dispatcher(cfg).run(t, job, exchange)
    assert (slots(dep), dep.admission.queued, job.attempts) == ((0, 0), 0, [])


# -- through the gateway ---------------------------------------------------------------------------------
def event(text: str) -> bytes:
    return b"data: " + orjson.dumps({"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]}) + b"\n\n"


async def raw_stream(app: GatewayApp, leave_after: int | None) -> list[dict[str, Any]]:
    """One streamed chat request over raw ASGI (as uvicorn drives the app); the client disconnects once it
    has had `leave_after` body messages (None: it stays)."""
    body = orjson.dumps({"model": "solo", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    inbox = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        if inbox:
            return inbox.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(dict(message))
        if leave_after is not None and sum(m["type"] == "http.response.body" for m in sent) >= leave_after:
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"gateway.test"),
            (b"authorization", f"Bearer {TEST_KEY}".encode()),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("gateway.test", 80),
    }
    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


def engine(*chunks: bytes | Stall | BaseException) -> FakeUpstream:
    return FakeUpstream({("POST", ENGINE_CHAT): FakeAnswer.sse(*chunks)})


STREAMS: dict[str, tuple[FakeUpstream, int | None, list[str]]] = {
    "relayed to its end": (engine(event("a"), event("b"), b"data: [DONE]\n\n"), None, ["success"]),
    "cut by the engine mid-body": (engine(event("a"), StreamInterrupted("reset")), None, ["failure"]),
    "left by its client mid-body": (engine(event("a"), Stall(30), event("b"), b"data: [DONE]\n\n"), 1, ["neutral"]),
}


@pytest.mark.parametrize("how", STREAMS)
async def test_a_stream_frees_its_slot_once_and_tells_the_breaker_once_however_it_ends(how: str) -> None:
    up, leave_after, told = STREAMS[how]
    async with gateway_client(config(), upstream=up) as (_, app):
        dep = app.gw.runtime.table.models[0].deployments[0]
        dep.breaker = br = Told()
        sent = await raw_stream(app, leave_after)
        assert sent[0]["status"] == 200
        assert slots(dep) == (0, 0)
        assert br.told == told


async def test_a_whole_answer_frees_its_slot_and_tells_the_breaker_once_answered_or_failed() -> None:
    answer = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
    up = FakeUpstream({("POST", ENGINE_CHAT): FakeAnswer.json(answer)})
    async with gateway_client(config(), upstream=up) as (client, app):
        dep = app.gw.runtime.table.models[0].deployments[0]
        dep.breaker = br = Told()
        r = await client.post(
            "/v1/chat/completions", json={"model": "solo", "messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code == 200 and r.headers["x-gateway-backend"] == "engine-a"
        assert (slots(dep), br.told) == ((0, 0), ["success"])
        bad = FakeAnswer.json({"error": {"message": "boom", "type": "server_error"}}, status=500)
        up.route("POST", ENGINE_CHAT, bad)
        r = await client.post(
            "/v1/chat/completions", json={"model": "solo", "messages": [{"role": "user", "content": "x"}]}
        )
        assert r.status_code >= 500
        assert (slots(dep), br.told) == ((0, 0), ["success", "failure"])
