"""The admission queue through HTTP, one deployment with max_concurrency 1: request A holds the slot (its
engine stalls until the test lets it answer), later requests wait in the deployment's bounded FIFO
queue. A queued request whose client leaves is taken out of the queue and never reaches the engine;
the next queued one is served when the slot frees. A full queue, or a wait past queue_timeout_s, is
429 queue_full with Retry-After, before any engine is asked.

The queue is observed two ways: the deployment's admission state and the
gateway_deployment_queue_length metric. What each engine call carried tells which request it was.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import httpx
import openai
import orjson
import pytest
from multidict import CIMultiDict

from llm_gateway.errors import UpstreamUnreachable
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.routing.table import Deployment
from tests.conftest import TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

ENGINE_CHAT = "http://engine-a.test/v1/chat/completions"


def config(max_queue: int = 4, queue_timeout_s: float = 30) -> Any:
    return make_config(
        f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
backends:
  - name: engine-a
    engine: vllm
    url: http://engine-a.test
    max_concurrency: 1
    max_queue: {max_queue}
    queue_timeout_s: {queue_timeout_s}
models:
  - name: solo
    deployments:
      - {{backend: engine-a, model: upstream-model, format: safetensors}}
"""
    )


def chat(tag: str, stream: bool = False) -> dict[str, Any]:
    return {"model": "solo", "messages": [{"role": "user", "content": tag}], "stream": stream}


class Engine:
    """One engine whose answers wait until `release` is set: the first call holds the only slot."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.up = FakeUpstream({("POST", ENGINE_CHAT): self.answer})

    async def answer(self, method: str, url: str, headers: CIMultiDict[str], body: bytes | None) -> FakeAnswer:
        await self.release.wait()
        tag = orjson.loads(body or b"{}")["messages"][0]["content"]
        if orjson.loads(body or b"{}").get("stream"):
            return FakeAnswer.sse(
                b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"upstream-model",'
                b'"choices":[{"index":0,"delta":{"content":"' + tag.encode() + b'"},"finish_reason":"stop"}]}\n\n'
                b"data: [DONE]\n\n"
            )
        return FakeAnswer.json(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": "upstream-model",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": tag}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
            }
        )

    def seen(self) -> list[str]:
        """The request each engine call was for."""
        return [c.json()["messages"][0]["content"] for c in self.up.calls]


def deployment(app: GatewayApp) -> Deployment:
    dep: Deployment = app.gw.runtime.table.models[0].deployments[0]
    return dep


def queue_metric(app: GatewayApp) -> float:
    text = app.gw.metrics.render().decode()
    m = re.search(r"^gateway_deployment_queue_length\{[^}]*\} (\S+)$", text, re.M)
    assert m is not None, "no gateway_deployment_queue_length series"
    return float(m.group(1))


async def until(what: Callable[[], bool], timeout_s: float = 10.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not what():
            await asyncio.sleep(0.005)


async def settled(task: asyncio.Task[Any]) -> Any:
    """The task's result; a broken queue that never serves it fails here instead of hanging."""
    return await asyncio.wait_for(task, 5)


async def hold_the_slot(client: httpx.AsyncClient, engine: Engine) -> asyncio.Task[httpx.Response]:
    a = asyncio.create_task(client.post("/v1/chat/completions", json=chat("A")))
    await until(lambda: len(engine.up.calls) == 1)
    return a


async def queue(
    client: httpx.AsyncClient, app: GatewayApp, tag: str, waiting: int, stream: bool = False
) -> asyncio.Task[httpx.Response]:
    t = asyncio.create_task(client.post("/v1/chat/completions", json=chat(tag, stream)))
    await until(lambda: deployment(app).admission.queued == waiting)
    return t


# -- a client that leaves while queued --------------------------------------------------------------------


async def test_a_queued_request_whose_client_leaves_is_dropped_from_the_queue_at_once_and_the_next_is_served() -> None:
    engine = Engine()
    async with gateway_client(config(), upstream=engine.up) as (client, app):
        adm = deployment(app).admission
        a = await hold_the_slot(client, engine)
        b = await queue(client, app, "B", waiting=1)
        c = await queue(client, app, "C", waiting=2)
        assert (adm.in_flight, adm.queued, queue_metric(app)) == (1, 2, 2.0)

        b.cancel()  # B's client goes away while B waits, ahead of C
        with pytest.raises(asyncio.CancelledError):
            await b
        # at once: no waiting for a timeout or for the slot
        assert (adm.queued, queue_metric(app)) == (1, 1.0)
        assert engine.seen() == ["A"]

        engine.release.set()  # A ends: its slot goes to C, the next in the queue
        ra, rc = await settled(a), await settled(c)
        assert (adm.in_flight, adm.queued, queue_metric(app)) == (0, 0, 0.0)
        assert deployment(app).backend.in_flight == 0
    assert (ra.status_code, rc.status_code) == (200, 200), (ra.text, rc.text)
    assert ra.json()["choices"][0]["message"]["content"] == "A"
    assert rc.json()["choices"][0]["message"]["content"] == "C"
    assert rc.headers["x-gateway-backend"] == "engine-a"
    assert engine.seen() == ["A", "C"]  # B never reached the engine


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_a_queued_request_whose_client_disconnects_is_dropped_counted_as_cancelled_and_never_sent(
    stream: bool,
) -> None:
    """The production path: the server reports `http.disconnect` (raw ASGI here, as uvicorn sends it),
    the gateway's disconnect watcher cancels the queued request. For whole answers the watcher is armed
    0.25 s after the request arrives (service.DISCONNECT_WATCH_DELAY_S), so a disconnect is noticed
    within that; streams watch from the start."""
    engine = Engine()
    async with gateway_client(config(), upstream=engine.up) as (client, app):
        adm = deployment(app).admission
        a = await hold_the_slot(client, engine)

        body = orjson.dumps(chat("B", stream))
        gone = asyncio.Event()
        inbox = [{"type": "http.request", "body": body, "more_body": False}]
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            if inbox:
                return inbox.pop(0)
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(dict(message))

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
        b = asyncio.create_task(app(scope, receive, send))
        await until(lambda: adm.queued == 1)
        c = await queue(client, app, "C", waiting=2)

        before = list(sent)  # a queued stream has had its answer started, with its place as a comment
        if stream:
            assert [m["type"] for m in before] == ["http.response.start", "http.response.body"]
            assert before[1]["body"].startswith(b": queued position=0")  # none goes before it
        else:
            assert before == []
        gone.set()  # B's client disconnects
        await settled(b)  # the handler ends on its own, without an exception
        assert sent == before  # nothing more is answered to a client that left
        assert (adm.queued, queue_metric(app)) == (1, 1.0)
        metrics = app.gw.metrics.render().decode()
        assert re.search(r'^gateway_requests_total\{[^}]*outcome="cancelled"[^}]*\} 1\.0$', metrics, re.M), metrics

        engine.release.set()
        ra, rc = await settled(a), await settled(c)
    assert (ra.status_code, rc.status_code) == (200, 200)
    assert engine.seen() == ["A", "C"]


async def test_a_queued_stream_whose_client_leaves_is_dropped_and_the_next_stream_is_served() -> None:
    engine = Engine()
    async with gateway_client(config(), upstream=engine.up) as (client, app):
        adm = deployment(app).admission
        a = await hold_the_slot(client, engine)
        b = await queue(client, app, "B", waiting=1, stream=True)
        c = await queue(client, app, "C", waiting=2, stream=True)
        b.cancel()
        with pytest.raises(asyncio.CancelledError):
            await b
        assert adm.queued == 1
        engine.release.set()
        ra, rc = await settled(a), await settled(c)
    assert ra.status_code == 200 and rc.status_code == 200
    assert '"content":"C"' in rc.text and rc.text.rstrip().endswith("data: [DONE]")
    assert engine.seen() == ["A", "C"]


# -- a full queue, a wait too long ----------------------------------------------------------------------


def assert_queue_full(r: httpx.Response, message: str) -> None:
    assert r.status_code == 429, r.text
    assert r.json()["error"] == {
        "message": message,
        "type": "server_overloaded",
        "param": None,
        "code": "queue_full",
    }
    assert r.headers["retry-after"] == "1"


async def test_a_request_beyond_max_queue_is_429_queue_full_with_retry_after_and_never_sent() -> None:
    engine = Engine()
    async with gateway_client(config(max_queue=1), upstream=engine.up) as (client, app):
        a = await hold_the_slot(client, engine)
        b = await queue(client, app, "B", waiting=1)
        full = await client.post("/v1/chat/completions", json=chat("C"))
        full_stream = await client.post("/v1/chat/completions", json=chat("D", stream=True))
        assert deployment(app).admission.queued == 1  # the refused ones never queued
        engine.release.set()
        ra, rb = await settled(a), await settled(b)
    msg = "every deployment of this model is at its concurrency limit and its wait queue is full"
    assert_queue_full(full, msg)
    assert_queue_full(full_stream, msg)
    assert (ra.status_code, rb.status_code) == (200, 200)
    assert engine.seen() == ["A", "B"]


async def test_with_max_queue_zero_a_second_request_is_refused_at_once() -> None:
    engine = Engine()
    async with gateway_client(config(max_queue=0), upstream=engine.up) as (client, _):
        a = await hold_the_slot(client, engine)
        r = await client.post("/v1/chat/completions", json=chat("B"))
        engine.release.set()
        ra = await settled(a)
    assert_queue_full(r, "every deployment of this model is at its concurrency limit and its wait queue is full")
    assert ra.status_code == 200 and engine.seen() == ["A"]


async def test_a_request_queued_past_queue_timeout_s_is_429_queue_full_and_leaves_the_queue() -> None:
    engine = Engine()
    async with gateway_client(config(queue_timeout_s=0.2), upstream=engine.up) as (client, app):
        a = await hold_the_slot(client, engine)
        r = await client.post("/v1/chat/completions", json=chat("B"))  # A holds the slot all along
        assert deployment(app).admission.queued == 0
        engine.release.set()
        ra = await settled(a)
        assert deployment(app).admission.in_flight == 0
    assert_queue_full(r, "no slot of a deployment freed up within 0.2s")
    assert ra.status_code == 200 and engine.seen() == ["A"]


# -- a queued stream hears its place -------------------------------------------------------------------------


async def test_a_queued_stream_gets_its_place_as_sse_comments_then_its_answer() -> None:
    engine = Engine()
    async with gateway_client(config(), upstream=engine.up) as (client, app):
        a = await hold_the_slot(client, engine)
        b = await queue(client, app, "B", waiting=1)
        c = await queue(client, app, "C", waiting=2, stream=True)
        engine.release.set()
        ra, rb, rc = await settled(a), await settled(b), await settled(c)
    assert (ra.status_code, rb.status_code, rc.status_code) == (200, 200, 200)
    assert rc.headers["content-type"].startswith("text/event-stream")
    lines = [x for x in rc.text.split("\n\n") if x]
    assert lines[0].startswith(": queued position=1")  # B goes before it
    assert '"content":"C"' in rc.text and lines[-1] == "data: [DONE]"
    assert engine.seen() == ["A", "B", "C"]


async def test_the_openai_sdk_reads_a_queued_stream_comments_and_all() -> None:
    engine = Engine()
    async with gateway_client(config(), upstream=engine.up) as (client, app):
        sdk = openai.AsyncOpenAI(base_url="http://gateway.test/v1", api_key=TEST_KEY, http_client=client, max_retries=0)
        a = await hold_the_slot(client, engine)

        async def streamed() -> list[str]:
            stream = await sdk.chat.completions.create(
                model="solo", messages=[{"role": "user", "content": "C"}], stream=True
            )
            return [ch.choices[0].delta.content or "" async for ch in stream if ch.choices]

        c = asyncio.create_task(streamed())
        await until(lambda: deployment(app).admission.queued == 1)  # C waits (and has had its comment)
        engine.release.set()
        await settled(a)
        assert await settled(c) == ["C"]


async def test_a_queued_stream_whose_wait_times_out_ends_with_the_error_event() -> None:
    engine = Engine()
    async with gateway_client(config(queue_timeout_s=0.2), upstream=engine.up) as (client, _):
        a = await hold_the_slot(client, engine)
        r = await client.post("/v1/chat/completions", json=chat("B", stream=True))
        engine.release.set()
        await settled(a)
    assert r.status_code == 200  # the answer had started while it waited
    events = [x for x in r.text.split("\n\n") if x]
    assert events[0].startswith(": queued position=0")
    assert orjson.loads(events[-2].removeprefix("data: "))["error"]["code"] == "queue_full"
    assert events[-1] == "data: [DONE]" and engine.seen() == ["A"]


async def test_a_queued_stream_whose_attempt_failed_before_any_engine_byte_is_retried_not_ended_with_an_error() -> None:
    # the rule is "before the engine's first byte", not "before the client's": the stream has its 200 and a
    # `: queued` comment, but nothing of the failed attempt, so another deployment answers it in full
    cfg = make_config(
        """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
backends:
  - {name: engine-a, engine: vllm, url: "http://engine-a.test", max_concurrency: 1}
  - {name: engine-b, engine: vllm, url: "http://engine-b.test", max_concurrency: 1}
models:
  - name: solo
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
      - {backend: engine-b, model: upstream-model, format: safetensors}
"""
    )
    engine = Engine()
    failed: list[str] = []

    async def answer(method: str, url: str, headers: CIMultiDict[str], body: bytes | None) -> Any:
        if orjson.loads(body or b"{}")["messages"][0]["content"] == "C" and not failed:
            failed.append(url)
            return UpstreamUnreachable("the engine closed the connection without answering")
        return await engine.answer(method, url, headers, body)

    engine.up.route("POST", "/v1/chat/completions", answer)
    engine.up.routes.pop(("POST", ENGINE_CHAT))
    async with gateway_client(cfg, upstream=engine.up) as (client, app):
        a = asyncio.create_task(client.post("/v1/chat/completions", json=chat("A")))
        b = asyncio.create_task(client.post("/v1/chat/completions", json=chat("B")))
        await until(lambda: len(engine.up.calls) == 2)  # both slots held
        deps = app.gw.runtime.table.models[0].deployments
        c = asyncio.create_task(client.post("/v1/chat/completions", json=chat("C", stream=True)))
        await until(lambda: sum(d.admission.queued for d in deps) == 1)
        engine.release.set()
        ra, rb, rc = await settled(a), await settled(b), await settled(c)
    assert (ra.status_code, rb.status_code, rc.status_code) == (200, 200, 200)
    lines = [x for x in rc.text.split("\n\n") if x]
    assert lines[0].startswith(": queued position=0")
    assert '"error"' not in rc.text and '"content":"C"' in rc.text and lines[-1] == "data: [DONE]"
    assert len(failed) == 1 and engine.seen().count("C") == 2  # the failed attempt, then the one that answered
