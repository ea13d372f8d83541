#!/usr/bin/env python3
"""Managed backends (issue 38): time to first token for cold, warm and swapped requests.

Two real `llama-server` engines the gateway starts itself (managed backends, the tiny GGUF under two model
names), a memory budget for one, idle TTL `--ttl` seconds; the gateway is a real process. Each round, one
client, one request at a time (streamed chat, TTFT = first content delta at the client):
- cold: a request for m0 while no engine runs (the gateway spawns llama-server and waits for its probe);
- warm: two more requests for m0 (it runs);
- swapped: a request for m1 while m0 runs and fills the budget (m0 is stopped, then m1 started);
- warm again for m1; then the round waits until the TTL has stopped everything.
The gateway's own `gateway_managed_load_seconds` (spawn to ready) is printed beside it.

    .venv/bin/python bench/managed_ttft.py [--rounds 5] [--ttl 1.5]

Not part of the test verdicts; traffic on 127.0.0.1 only; stops only what it started (the gateway stops its
engines on shutdown).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.gateway_process import GatewayProcess  # noqa: E402
from tests.support.real_engines import free_port, llama_server_binary, tiny_gguf  # noqa: E402
from tests.support.waiting import sample, scrape, wait_until  # noqa: E402

BACKEND = """
  - name: m{i}
    engine: llama-server
    url: http://127.0.0.1:{port}
    capacity: 1
    queue_timeout_s: 120
    probe: {{interval_s: 0.5}}
    managed:
      command: [{binary}, -m, {gguf}, --alias, "{{model}}", --host, "{{host}}", --port, "{{port}}",
                -c, "512", -np, "1", -t, "1", --no-ui]
      memory_mb: 100
      idle_ttl_s: {ttl}
      start_timeout_s: 60
"""


def config(ttl: float) -> str:
    binary, gguf = llama_server_binary(), tiny_gguf()
    backends = "".join(BACKEND.format(i=i, port=free_port(), binary=binary, gguf=gguf, ttl=ttl) for i in range(2))
    models = "".join(
        f"\n  - {{name: m{i}, deployments: [{{backend: m{i}, model: tiny-{i}, format: gguf}}]}}" for i in range(2)
    )
    return (
        "server: {access_log: false}\nauth: {mode: none}\n"
        "managed: {memory_budget_mb: {local: 150}, swap_batch: 4, swap_hold_s: 5}\n"
        f"backends:{backends}models:{models}\n"
    )


def ttft(client: httpx.Client, url: str, model: str) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    t0 = time.perf_counter()
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{model}: HTTP {r.status_code}: {r.read()[:300]!r}")
        first = None
        for line in r.iter_lines():  # read to the end: the engine is idle before the next request
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError(f"{model}: no content delta")
    return first


def phases(url: str) -> dict[str, str]:
    body = httpx.get(url + "/readyz", timeout=10).json()
    return {n: b["managed"]["phase"] for n, b in body["backends"].items()}


def summary(xs: list[float]) -> dict[str, float]:
    ms = sorted(x * 1000 for x in xs)
    return {"n": len(ms), "p50_ms": round(statistics.median(ms), 1), "max_ms": round(ms[-1], 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ttl", type=float, default=1.5, help="idle TTL of each engine (s): ends each round")
    a = ap.parse_args()
    out: dict[str, list[float]] = {"cold": [], "warm": [], "swapped": []}
    with tempfile.TemporaryDirectory() as tmp, GatewayProcess(config(a.ttl), Path(tmp)) as gw:
        with httpx.Client(timeout=120) as client:
            for _ in range(a.rounds):
                wait_until(lambda: set(phases(gw.url).values()) == {"stopped"}, timeout=60, what="all stopped")
                out["cold"].append(ttft(client, gw.url, "m0"))
                out["warm"] += [ttft(client, gw.url, "m0") for _ in range(2)]
                out["swapped"].append(ttft(client, gw.url, "m1"))
                out["warm"].append(ttft(client, gw.url, "m1"))
        m = scrape(gw.url)
        loads = sum(sample(m, "gateway_managed_loads_total", backend=f"m{i}") or 0 for i in range(2))
        load_s = sum(sample(m, "gateway_managed_load_seconds_sum", backend=f"m{i}") or 0 for i in range(2))
        swaps = sample(m, "gateway_managed_swaps_total", host="local") or 0
    report = {k: summary(v) for k, v in out.items()}
    report["gateway"] = {"loads": loads, "mean_load_ms": round(1000 * load_s / max(loads, 1), 1), "swaps": swaps}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
