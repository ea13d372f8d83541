"""A real vLLM (CPU build) started with `--kv-events-config` publishes its prefix cache's changes over ZeroMQ; a
gateway whose backend says `kv_events: auto` finds the publisher at vLLM's `/kv_event_sources`, subscribes, and
its /readyz and /metrics say the cache_aware record follows the engine's events, with the blocks the engine
stored for the prompts sent through the gateway (block size 128 tokens on the CPU build)."""

from __future__ import annotations

import asyncio
import socket
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from llm_gateway.app import create_app
from llm_gateway.settings.loader import parse_config
from tests.conftest import VLLM_KEY, engines_started
from tests.support.real_engines import VllmServer
from tests.unit.test_usage_ledger import running

pytest.importorskip("zmq", reason="the kv-events extra (dev extra)")

pytestmark = pytest.mark.real_engine  # its own vLLM (not the session fixture): marked here

SYSTEM = "You are a careful coding agent. Read the repository before you edit it. " * 12  # ~900 characters


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_vllm_kv_events_reach_the_cache_aware_record(tmp_path: Path) -> None:
    port = free_port()
    events = f'{{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:{port}"}}'
    eng = VllmServer(api_key=VLLM_KEY, workdir=tmp_path, max_model_len=2048, extra_args=("--kv-events-config", events))
    with engines_started([eng]):
        eng.start()
        cfg = parse_config(
            textwrap.dedent(f"""
            server: {{access_log: false}}
            auth: {{mode: none}}
            backends:
              - {{name: vllm, engine: vllm, url: '{eng.url}', api_key: {VLLM_KEY}, kv_events: auto}}
            models:
              - name: tiny
                strategy: cache_aware
                deployments: [{{backend: vllm, model: tiny-llama, format: safetensors}}]
            """),
            "t.yaml",
            {},
        )
        app = create_app(cfg, probes=False)
        try:
            async with (
                running(app),
                httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=120) as c,
            ):
                found: dict[str, object] = {}
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:  # the subscriber joins a moment after it connects: ask again
                    for q in ("first question", "second question"):
                        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]
                        resp = await c.post(
                            "/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, "messages": messages}
                        )
                        assert resp.status_code == 200, resp.text
                    await asyncio.sleep(0.5)
                    found = (await c.get("/readyz")).json()["backends"]["vllm"]["prefix_cache"]
                    if (
                        found["source"] == "kv_events"
                        and isinstance(found["cached_tokens"], int)
                        and found["cached_tokens"]
                    ):
                        break
                assert found["source"] == "kv_events", found
                assert found["endpoints"] == [f"tcp://127.0.0.1:{port}"]  # vLLM's `*` is the engine's host
                assert found["block_size"] == 128
                cached = found["cached_tokens"]
                assert isinstance(cached, int) and cached > 0 and cached % 128 == 0, found
                text = (await c.get("/metrics")).text
                assert 'gateway_kv_events_total{backend="vllm",event="BlockStored"}' in text
                assert 'gateway_prefix_cache_source{backend="vllm",gateway_prefix_cache_source="kv_events"} 1.0' in text
        finally:
            await app.gw.aclose()
