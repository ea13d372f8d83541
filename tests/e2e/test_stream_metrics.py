"""A stream's metrics when the gateway relays in push mode: a gateway process (uvicorn, the hardened
protocol's direct chunk writer) in front of a vLLM emulator over the gateway's own HTTP/1.1 client,
where each engine chunk is fed, timed and written inside the upstream connection's callback
(service/stream.py: sink). The in-process tests drive the pull loop instead (httpx's ASGI transport has no
direct writer), so this is where the inter-token latencies of the push path are counted: every gap
once, across batches of 64, the last partial batch included."""

from __future__ import annotations

import httpx
import orjson

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import sample, scrape

TOKENS = 150  # two full batches of 64 gaps and a partial one


def test_a_pushed_stream_counts_each_inter_token_gap_once(tmp_path) -> None:
    # 10 ms a token: the emulator runs in this process's thread, and a stall of it longer than the pace sends two
    # chunks together, which the gateway may read and relay as one write (one gap fewer); at 3 ms four such
    # merges in 150 tokens happened once on a busy machine
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", tpot_ms=10)) as emu:
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: emu, engine: vllm, url: "{emu.url}", probe: {{interval_s: 0.5}}}}
models:
  - {{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
            body["max_tokens"] = TOKENS
            texts = []
            with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body, timeout=60) as r:
                assert r.status_code == 200
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        for choice in orjson.loads(line[6:]).get("choices", []):
                            if choice.get("delta", {}).get("content"):
                                texts.append(choice["delta"]["content"])
            m = scrape(gw.url)
    assert len(texts) == TOKENS  # every token relayed, one event each
    labels = {"model": "m", "backend": "emu"}
    count = sample(m, "gateway_inter_token_latency_seconds_count", **labels)
    total = sample(m, "gateway_inter_token_latency_seconds_sum", **labels)
    inf = sample(m, "gateway_inter_token_latency_seconds_bucket", le="+Inf", **labels)
    assert count is not None and total is not None
    # one gap per relayed write after the first that carried output: the tokens' writes, and the end's
    # (the finish chunk, [DONE]) unless the engine's last chunks came in one read; never a slot counted twice
    # or an unused one (a whole batch of 64 at the end would make it 192); below, room for a few merged reads,
    # none for a lost batch (the last partial one is 21 gaps)
    assert TOKENS - 10 <= count <= TOKENS + 2, count
    assert inf == count
    assert 0 < total < 60  # seconds: real gaps, not a batch of zeros
