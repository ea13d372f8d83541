#!/usr/bin/env python3
"""Fair sharing between keys on one scarce engine: a key that floods against a key that sends a little.

One vLLM emulator with `--slots` slots (4) behind one gateway process whose deployment admits exactly that
many at once (`max_concurrency`), so that the wait happens in the gateway's queue, where it can be ordered.
Key A keeps `--flood` (32) long streams in flight (`--long-tokens` each, closed loop); key B sends one
short streamed request (`--short-tokens`) every `--every-s` seconds and its time to first token is taken.
Each scenario runs with a fresh gateway:

- `alone`: B only (the baseline);
- `fifo`: A and B, `routing.fair_queuing: false` (first come, first served: B waits behind A's queue);
- `fair`: A and B, token-weighted fair queuing (both keys in the `default` class);
- `priority`: A in the `batch` class, B `interactive`;
- `priority-reserved`: the same, with `routing.reserved_slots: {interactive: 1}` (the last slot kept for
  interactive requests: B never waits for a batch stream to end, and A runs on one slot fewer).

Prints B's TTFT p50/p95 per scenario and A's throughput (generated tokens per second), then the ratios the
issue sets as targets: fair p95 / alone p95 (target <= 2x), priority p95 / alone p95 (<= 1.5x), and A's
throughput fair / fifo (>= 0.9). Traffic goes to 127.0.0.1 only, bounded in time (`--duration`).

    .venv/bin/python bench/fairness.py [--duration 20] [--slots 4] [--flood 32] [--tpot-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_compare import free_port, pct, start, stop

MODEL = "m"
KEY_A, KEY_B = "sk-bench-flood-0123456789", "sk-bench-short-0123456789"


def sha(k: str) -> str:
    return hashlib.sha256(k.encode()).hexdigest()


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    b_errors: int = 0
    a_tokens: int = 0
    a_errors: int = 0


async def stream(
    session: aiohttp.ClientSession, url: str, key: str, tokens: int, window: tuple[float, float] | None = None
) -> tuple[float | None, int]:
    """(seconds to the first content delta, content deltas) of one streamed chat request; with a `window`
    (monotonic start, end), only the deltas that arrived inside it are counted."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    t0 = time.perf_counter()
    first: float | None = None
    n = 0
    async with session.post(url, json=body, headers={"authorization": f"Bearer {key}"}) as r:
        if r.status != 200:
            await r.read()
            return None, 0
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content":"' in line and b'"content":""' not in line:
                if window is None or window[0] <= time.monotonic() <= window[1]:
                    n += 1
                if first is None:
                    first = time.perf_counter() - t0
    return first, n


async def run(url: str, args: argparse.Namespace, flood: bool) -> Result:
    res = Result()
    deadline = time.monotonic() + args.duration
    warm = time.monotonic() + args.warmup_s

    async def flooder(s: aiohttp.ClientSession) -> None:
        while time.monotonic() < deadline:
            ttft, n = await stream(s, url, KEY_A, args.long_tokens, (warm, deadline))
            if ttft is None:
                res.a_errors += 1
            res.a_tokens += n  # the tokens that arrived between the warm-up and the end

    async def short(s: aiohttp.ClientSession) -> None:
        while time.monotonic() < warm:
            await asyncio.sleep(0.05)
        while time.monotonic() < deadline - args.long_tokens * args.tpot_ms / 1000:
            t = time.monotonic()
            ttft, n = await stream(s, url, KEY_B, args.short_tokens)
            if ttft is None or n == 0:
                res.b_errors += 1
            else:
                res.ttft.append(ttft)
            await asyncio.sleep(max(0.0, args.every_s - (time.monotonic() - t)))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        tasks = [short(s)] + ([flooder(s) for _ in range(args.flood)] if flood else [])
        await asyncio.gather(*tasks)
    return res


def config(port: int, args: argparse.Namespace, fair: bool, a_class: str, b_class: str, reserve: int = 0) -> str:
    routing = f"{{fair_queuing: {str(fair).lower()}" + (
        f", reserved_slots: {{interactive: {reserve}}}}}" if reserve else "}"
    )
    return f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: flood, sha256: "{sha(KEY_A)}", priority: {a_class}}}
    - {{name: short, sha256: "{sha(KEY_B)}", priority: {b_class}}}
routing: {routing}
backends:
  - {{name: emu, engine: vllm, url: "http://127.0.0.1:{port}", capacity: {args.slots},
     max_concurrency: {args.slots}, max_queue: 1024, queue_timeout_s: 600, probe: {{interval_s: 0.5}}}}
models:
  - name: m
    deployments: [{{backend: emu, model: tiny, format: safetensors}}]
"""


def scenario(args: argparse.Namespace, name: str) -> Result:
    py = sys.executable
    ep, gp = free_port(), free_port()
    emu = start(
        [py, "-m", "llm_gateway_emulators", "vllm", "--port", str(ep), "--model", "tiny", "--slots", str(args.slots),
         "--tpot-ms", str(args.tpot_ms), "--ttft-ms", str(args.ttft_ms)],
        marker=b"listening on",
    )  # fmt: skip
    fair = name != "fifo"
    a_class, b_class = ("batch", "interactive") if name.startswith("priority") else ("default", "default")
    reserve = args.reserve if name == "priority-reserved" else 0
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(config(ep, args, fair, a_class, b_class, reserve))
    gw = start(
        [py, "-m", "llm_gateway", "serve", "--config", f.name, "--port", str(gp)],
        ready_url=f"http://127.0.0.1:{gp}/readyz",
    )
    try:
        return asyncio.run(run(f"http://127.0.0.1:{gp}/v1/chat/completions", args, flood=name != "alone"))
    finally:
        for p in (gw, emu):
            stop(p)
        os.unlink(f.name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--flood", type=int, default=32)
    ap.add_argument("--long-tokens", type=int, default=100)
    ap.add_argument("--short-tokens", type=int, default=8)
    ap.add_argument("--every-s", type=float, default=1.0)
    ap.add_argument("--tpot-ms", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=100.0)
    ap.add_argument("--reserve", type=int, default=1, help="slots kept for interactive in priority-reserved")
    ap.add_argument("--scenarios", default="alone,fifo,fair,priority,priority-reserved")
    args = ap.parse_args()
    results = {name: scenario(args, name) for name in args.scenarios.split(",")}
    span = args.duration - args.warmup_s
    print(
        f"\n{args.slots} slots (gateway max_concurrency = slots), key A: {args.flood} streams of {args.long_tokens} "
        f"tokens in flight, key B: one {args.short_tokens}-token stream every {args.every_s:g} s; engine TTFT "
        f"{args.ttft_ms:g} ms, {args.tpot_ms:g} ms/token; {args.duration:g} s per scenario\n"
    )
    alone = results.get("alone")
    base95 = pct(alone.ttft, 95) if alone and alone.ttft else None
    rows = []
    if base95:
        for name, target in (("fair", 2.0), ("priority", 1.5), ("priority-reserved", 1.5)):
            r = results.get(name)
            if r and r.ttft:
                v = pct(r.ttft, 95) / base95
                verdict = "met" if v <= target else "NOT met"
                rows.append(f"| B's TTFT p95, {name} / alone | {v:.2f}x | <= {target:g}x | {verdict} |")
    fifo, fair_r = results.get("fifo"), results.get("fair")
    if fifo and fair_r and fifo.a_tokens:
        v = fair_r.a_tokens / fifo.a_tokens
        rows.append(f"| A's throughput, fair / fifo | {v:.2f}x | >= 0.9x | {'met' if v >= 0.9 else 'NOT met'} |")
    print("| ratio | value | target | |\n|---|---|---|---|")
    print("\n".join(rows))
    print("\n| scenario | B requests | B TTFT p50 ms | B TTFT p95 ms | A tokens/s | errors (A, B) |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        p50 = f"{pct(r.ttft, 50):.0f}" if r.ttft else "-"
        p95 = f"{pct(r.ttft, 95):.0f}" if r.ttft else "-"
        print(f"| {name} | {len(r.ttft)} | {p50} | {p95} | {r.a_tokens / span:.0f} | {r.a_errors}, {r.b_errors} |")


if __name__ == "__main__":
    main()
