"""Fixtures of the deployment tests: a gateway's /metrics after real traffic (in-process, engines
played by a FakeUpstream at the gateway's upstream seam), shared by the promtool, dashboard and
alert-rule checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from multidict import CIMultiDict

from llm_gateway.access.keys import digest_of
from llm_gateway.routing.kv_events import KvEvents
from llm_gateway.routing.prober import probe_once
from llm_gateway.service.reload import ConfigWatcher
from tests.conftest import OTHER_KEY, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, refused

METRICS_TOKEN = "metrics-token-for-the-deploy-tests"  # every series, the per-key ones too (server.metrics_auth)
# Engines: a (vLLM) answers (and publishes KV-cache events on a real ZeroMQ socket), b (SGLang) is overloaded (503,
# retried elsewhere), c (llama-server) fails with 500 (not retryable), d (LMDeploy) refuses connections.
TRAFFIC_CONFIG = f"""
server: {{access_log: false, metrics_auth: {{sha256: "{digest_of(METRICS_TOKEN)}"}}}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{digest_of(TEST_KEY)}"}}
    - {{name: bob, sha256: "{digest_of(OTHER_KEY)}", limits: {{rpm: 1}}}}
routing: {{retries: 2, backoff_base_ms: 0, breaker_failures: 1, breaker_cooldown_s: 600}}
backends:
  - {{name: engine-a, engine: vllm, url: "http://engine-a.test", kv_events: "tcp://127.0.0.1:KV_PORT"}}
  - {{name: engine-b, engine: sglang, url: "http://engine-b.test"}}
  - {{name: engine-c, engine: llama-server, url: "http://engine-c.test"}}
  - {{name: engine-d, engine: lmdeploy, url: "http://engine-d.test"}}
models:
  - name: chat-model
    strategy: priority
    deployments:
      - {{backend: engine-b, model: up-b, format: awq, priority: 0}}
      - {{backend: engine-a, model: up-a, format: safetensors, priority: 1, context_length: 8192}}
  - name: broken-model
    strategy: cache_aware
    deployments:
      - {{backend: engine-c, model: up-c, format: gguf}}
  - name: primary-model
    fallbacks: [chat-model]
    deployments:
      - {{backend: engine-d, model: up-d, format: awq}}
"""

CHAT = {"messages": [{"role": "user", "content": "hello"}]}
STREAM_TOKENS = ["Hel", "lo", " wor", "ld"]


def _sse(*events: dict | str) -> bytes:
    return b"".join(b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n\n" for e in events)


def _chunk(content: str | None = None, finish: str | None = None) -> dict:
    delta = {} if content is None else {"content": content}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "up-a",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def _engine_a(method: str, url: str, headers: CIMultiDict[str], content: bytes | None) -> FakeAnswer:
    body = orjson.loads(content or b"{}")
    usage = {"prompt_tokens": 5, "completion_tokens": len(STREAM_TOKENS), "total_tokens": 5 + len(STREAM_TOKENS)}
    if body.get("stream"):
        events = [_chunk(t) for t in STREAM_TOKENS] + [_chunk(finish="stop")]
        events.append({**_chunk(), "choices": [], "usage": usage})
        return FakeAnswer.sse(_sse(*events, "[DONE]"))
    return FakeAnswer.json(
        {
            "id": "x",
            "object": "chat.completion",
            "created": 1,
            "model": "up-a",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


VLLM_METRICS = (
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="up-a"} 1.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="up-a"} 2.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{engine="0",model_name="up-a"} 0.25\n'
    b"# TYPE vllm:prefix_cache_queries counter\n"
    b'vllm:prefix_cache_queries_total{engine="0",model_name="up-a"} 900.0\n'
    b"# TYPE vllm:prefix_cache_hits counter\n"
    b'vllm:prefix_cache_hits_total{engine="0",model_name="up-a"} 300.0\n'
)


async def _traffic(workdir: Path) -> str:
    with kv_publisher() as (port, publish):
        return await _traffic_with(workdir, TRAFFIC_CONFIG.replace("KV_PORT", str(port)), publish)


@contextmanager
def kv_publisher() -> Iterator[tuple[int, Callable[[], bool]]]:
    """engine-a's KV-event publisher: a ZeroMQ PUB on a free port; `publish()` sends vLLM's batch of one store and
    one eviction (tests/unit/test_kv_events.py has the encodings) and says whether the gateway counted one yet."""
    import msgspec
    import zmq

    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    stored = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None, "token_ids": [0] * 32,
              "block_size": 16, "lora_id": None, "medium": "GPU"}  # fmt: skip
    batch = msgspec.msgpack.encode([1.0, [stored, {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}], 0])
    seq = iter(range(1 << 30))

    def publish() -> bool:
        pub.send_multipart([b"", next(seq).to_bytes(8, "big"), batch])
        return True

    try:
        yield port, publish
    finally:
        pub.close(0)
        ctx.term()


async def _traffic_with(workdir: Path, cfg_text: str, publish: Callable[[], bool]) -> str:
    cfg = make_config(cfg_text)
    up = FakeUpstream(
        {
            ("POST", "http://engine-a.test/v1/chat/completions"): _engine_a,
            ("GET", "http://engine-a.test/health"): FakeAnswer(200),
            ("GET", "http://engine-a.test/v1/models"): FakeAnswer.json({"data": [{"id": "up-a"}]}),
            ("GET", "http://engine-a.test/metrics"): FakeAnswer(200, {}, [VLLM_METRICS]),
            ("POST", "http://engine-b.test/v1/chat/completions"): FakeAnswer.json(
                {"object": "error", "message": "busy", "type": "x", "code": 503}, 503
            ),
            ("POST", "http://engine-c.test/v1/chat/completions"): FakeAnswer.json(
                {"error": {"message": "boom", "type": "server_error", "code": 500}}, 500
            ),
            ("POST", "http://engine-d.test/v1/chat/completions"): refused(),
        }
    )
    async with gateway_client(cfg, upstream=up) as (client, app):
        # config reloads: one accepted, one rejected (the running config stays)
        path = workdir / "gateway.yaml"
        path.write_text(cfg_text)
        watcher = ConfigWatcher(app.gw, str(path), 0)
        assert await watcher.reload("test") is True
        path.write_text(cfg_text.replace("mode: keys", "mode: maybe"))
        assert await watcher.reload("test") is False
        # a probe of engine-a: state, models and load signals from its /metrics
        await probe_once(app.gw.upstream, app.gw.runtime.table.backends["engine-a"], app.gw.metrics)
        # engine-a's KV-cache events, as the app's startup follows them (a SUB joins a moment after it connects)
        kv_events = KvEvents(lambda: app.gw.upstream, app.gw.metrics)
        kv_events.sync(app.gw.runtime.table)
        engine_a = app.gw.runtime.table.backends["engine-a"]
        for _ in range(200):
            publish()
            await asyncio.sleep(0.02)
            if engine_a.kv is not None and engine_a.kv.batches:
                break
        await kv_events.aclose()

        async def chat(model: str, *, key: str = TEST_KEY, **extra: object) -> int:
            r = await client.post(
                "/v1/chat/completions",
                json={**CHAT, "model": model, **extra},
                headers={"authorization": f"Bearer {key}"},
            )
            await r.aread()
            return r.status_code

        statuses = {
            "unary": await chat("chat-model"),  # engine-b 503 -> retried -> engine-a (failover)
            "stream": await chat("chat-model", stream=True),
            "stream2": await chat("chat-model", stream=True, stream_options={"include_usage": True}),
            "broken": await chat("broken-model"),  # 5xx to the client
            "fallback": await chat("primary-model"),  # refused -> fallback model chat-model
            "unknown": await chat("no-such-model"),  # 404
            "limited1": await chat("chat-model", key=OTHER_KEY),
            "limited2": await chat("chat-model", key=OTHER_KEY),  # rpm 1: 429
        }
        expected = {
            "unary": 200,
            "stream": 200,
            "stream2": 200,
            "broken": 500,
            "fallback": 200,
            "unknown": 404,
            "limited1": 200,
            "limited2": 429,
        }
        assert statuses == expected
        metrics = await client.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
        assert metrics.status_code == 200
        assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
        return metrics.text


@pytest.fixture(scope="session")
def gateway_metrics_text(tmp_path_factory: pytest.TempPathFactory) -> str:
    """/metrics of an in-process gateway that served streaming and unary traffic, retries, a
    failover, a model fallback, a 5xx, a 404, a rate-limit rejection, a probe and two reloads."""
    return asyncio.run(_traffic(tmp_path_factory.mktemp("metrics")))
