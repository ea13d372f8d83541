#!/usr/bin/env python3
"""Load-aware routing against round-robin, on two emulated engines of unequal speed.

Two vLLM emulators (`python -m llm_gateway_emulators`) with the same number of slots, one five times slower
per token than the other, behind one gateway process; the same closed-loop load (C clients, each
sending its next request when the last one is answered, for D seconds) is run once per strategy,
with a fresh gateway each time. Prints requests/s, latency p50/p95/p99 and the share of traffic the
fast engine got.

    .venv/bin/python bench/routing_compare.py [--clients 12] [--duration 15] [--tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cmd: list[str], ready_url: str | None = None, marker: bytes | None = None) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    if marker is not None:
        assert p.stdout is not None
        line = p.stdout.readline()
        if marker not in line:
            raise RuntimeError(f"{cmd[:4]} did not start: {line!r}")
    if ready_url is not None:
        for _ in range(300):
            try:
                if urllib.request.urlopen(ready_url, timeout=1).status == 200:
                    break
            except OSError:
                time.sleep(0.05)
        else:
            raise RuntimeError(f"{ready_url} never became ready")
    return p


def stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


async def load(url: str, clients: int, duration: float, tokens: int) -> tuple[list[float], dict[str, int], int]:
    lat: list[float] = []
    by_backend: dict[str, int] = {}
    errors = 0
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": tokens}
    deadline = time.monotonic() + duration

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal errors
        while time.monotonic() < deadline:
            t = time.perf_counter()
            async with session.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()
                if r.status != 200:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t)
                be = r.headers.get("x-gateway-backend", "?")
                by_backend[be] = by_backend.get(be, 0) + 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        await asyncio.gather(*(client(s) for _ in range(clients)))
    return lat, by_backend, errors


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--duration", type=float, default=15)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--fast-tpot-ms", type=float, default=2)
    ap.add_argument("--slow-tpot-ms", type=float, default=10)
    a = ap.parse_args()
    py = sys.executable
    rows = []
    for strategy in ("round_robin", "least_load"):
        fp, sp, gp = free_port(), free_port(), free_port()
        fast = start(
            [
                py,
                "-m",
                "llm_gateway_emulators",
                "vllm",
                "--port",
                str(fp),
                "--model",
                "tiny",
                "--slots",
                str(a.slots),
                "--tpot-ms",
                str(a.fast_tpot_ms),
            ],
            marker=b"listening on",
        )
        slow = start(
            [
                py,
                "-m",
                "llm_gateway_emulators",
                "vllm",
                "--port",
                str(sp),
                "--model",
                "tiny",
                "--slots",
                str(a.slots),
                "--tpot-ms",
                str(a.slow_tpot_ms),
            ],
            marker=b"listening on",
        )
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: fast, engine: vllm, url: "http://127.0.0.1:{fp}", capacity: {a.slots}, probe: {{interval_s: 0.5}}}}
  - {{name: slow, engine: vllm, url: "http://127.0.0.1:{sp}", capacity: {a.slots}, probe: {{interval_s: 0.5}}}}
models:
  - name: m
    strategy: {strategy}
    deployments:
      - {{backend: fast, model: tiny, format: safetensors}}
      - {{backend: slow, model: tiny, format: safetensors}}
"""
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
            f.write(cfg)
        gw = start(
            [py, "-m", "llm_gateway", "serve", "--config", f.name, "--port", str(gp)],
            ready_url=f"http://127.0.0.1:{gp}/readyz",
        )
        try:
            time.sleep(1.0)
            lat, by, errors = asyncio.run(load(f"http://127.0.0.1:{gp}", a.clients, a.duration, a.tokens))
        finally:
            for p in (gw, fast, slow):
                stop(p)
            os.unlink(f.name)
        n = len(lat)
        rows.append(
            (
                strategy,
                n,
                n / a.duration,
                pct(lat, 50),
                pct(lat, 95),
                pct(lat, 99),
                100 * by.get("fast", 0) / max(1, n),
                errors,
                statistics.mean(lat) * 1000 if lat else 0,
            )
        )
    print(
        f"\n{a.clients} clients, {a.duration:g} s each, {a.tokens} tokens/request, {a.slots} slots per engine, "
        f"fast {a.fast_tpot_ms:g} ms/token, slow {a.slow_tpot_ms:g} ms/token\n"
    )
    print("| strategy | requests | req/s | p50 ms | p95 ms | p99 ms | mean ms | to fast | errors |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.0f} | {r[4]:.0f} | {r[5]:.0f} | {r[8]:.0f} "
            f"| {r[6]:.0f}% | {r[7]} |"
        )
    rr, ll = rows
    print(f"\nleast_load p95 is {rr[4] / ll[4]:.2f}x better than round_robin's" if ll[4] else "")


if __name__ == "__main__":
    main()
