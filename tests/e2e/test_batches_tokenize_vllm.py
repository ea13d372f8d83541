"""The Batch API and `/tokenize` / `/detokenize` against the real vLLM (CPU build, the tiny model) behind the gateway
as a real process: the `openai` SDK runs a batch of 2,000 lines (the acceptance's count) to `completed` with one
result per line and matching `custom_id`s, each line one vLLM generation by vLLM's own `vllm:request_success_total`
(about 20 s on 2 cores: the gateway keeps 8 lines in flight, vLLM runs `max_num_seqs` 2 of them at once); the token
ids are vLLM's own, and detokenize gives the text back."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.e2e.test_batches_sdk import REAL_LINES, config, finished, sdk, submit
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

pytestmark = pytest.mark.real_engine
LINES = REAL_LINES


def successes(engine: RealEngine) -> float:
    text = httpx.get(engine.url + "/metrics", headers=engine.headers, timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:request_success_total"))


def test_a_batch_and_the_token_routes_against_real_vllm(vllm_server: RealEngine, tmp_path: Path) -> None:
    extra = f", api_key: {vllm_server.api_key}" if vllm_server.api_key else ""
    text = config(tmp_path / "data", vllm_server.url, "vllm", vllm_server.model, "safetensors", extra)
    text = text.replace("format: safetensors}", "format: safetensors, capabilities: [chat, tokenize]}")
    before = successes(vllm_server)
    with GatewayProcess(text, tmp_path) as gw:
        client = sdk(gw)
        t0 = time.monotonic()
        out = finished(client, submit(client, tmp_path, LINES), LINES)  # each custom_id once, in order
        took = time.monotonic() - t0
        assert len(out) == LINES
        assert successes(vllm_server) - before == LINES  # vLLM's own count: one generation per line
        print(f"{LINES} lines through vLLM in {took:.1f}s (upload to output file)")

        prompt = "hello world, tokenized"
        own = httpx.post(
            vllm_server.url + "/tokenize",
            json={"model": vllm_server.model, "prompt": prompt},
            headers=vllm_server.headers,
        ).json()
        auth = {"authorization": f"Bearer {client.api_key}"}
        got = httpx.post(gw.url + "/tokenize", json={"model": "tiny", "prompt": prompt}, headers=auth)
        assert got.status_code == 200, got.text
        assert got.json()["tokens"] == own["tokens"] and got.json()["count"] == own["count"]
        back = httpx.post(gw.url + "/detokenize", json={"model": "tiny", "tokens": own["tokens"]}, headers=auth)
        assert back.status_code == 200 and prompt in back.json()["prompt"]
