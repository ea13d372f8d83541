#!/usr/bin/env python3
"""An interactive key's time to first token while a batch runs on the same engine (issue 41: within 1.3x of its
figure without the batch).

One vLLM emulator with `--slots` slots behind one gateway process whose deployment admits that many at once
(`max_concurrency`), so that the wait happens in the gateway's fair queue. Key B sends one short streamed request
(`--short-tokens`) every `--every-s` seconds and its TTFT is taken. Scenarios, each with a fresh gateway and
database:

- `alone`: B only (the baseline);
- `batch`: key A's batch of `--lines` lines (`--long-tokens` each) runs through the Batch API meanwhile, in the
  `batch` class with `batches.concurrency` = `--batch-concurrency` (more than the slots: lines queue);
- `batch-reserved`: the same, with `routing.reserved_slots: {default: 1}` (the last slot kept for the `default`
  class and above: batch lines run on the other slots, B never waits for a batch line to end).

Prints B's TTFT p50/p95 per scenario, the lines the batch finished, and the ratio batch p95 / alone p95 against the
1.3x target. Traffic goes to 127.0.0.1 only, bounded in time (`--duration`).

    .venv/bin/python bench/batch_ttft.py [--duration 20] [--slots 4] [--lines 2000] [--tpot-ms 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fairness import KEY_A, KEY_B, MODEL, sha, stream
from routing_compare import free_port, pct, start, stop


def config(port: int, data: str, args: argparse.Namespace, reserve: int) -> str:
    routing = f"{{reserved_slots: {{default: {reserve}}}}}" if reserve else "{}"
    return f"""
server: {{access_log: false, data_dir: "{data}"}}
auth:
  mode: keys
  keys:
    - {{name: batcher, sha256: "{sha(KEY_A)}"}}
    - {{name: live, sha256: "{sha(KEY_B)}"}}
routing: {routing}
batches: {{concurrency: {args.batch_concurrency}, poll_s: 0.5}}
backends:
  - {{name: emu, engine: vllm, url: "http://127.0.0.1:{port}", capacity: {args.slots},
     max_concurrency: {args.slots}, max_queue: 1024, queue_timeout_s: 600, probe: {{interval_s: 0.5}}}}
models:
  - name: {MODEL}
    deployments: [{{backend: emu, model: tiny, format: safetensors}}]
"""


async def submit_batch(s: aiohttp.ClientSession, base: str, args: argparse.Namespace) -> str:
    auth = {"authorization": f"Bearer {KEY_A}"}
    lines = []
    for i in range(args.lines):
        body = {"model": MODEL, "messages": [{"role": "user", "content": f"line {i}"}], "max_tokens": args.long_tokens}
        lines.append(
            orjson.dumps({"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
        )
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", b"\n".join(lines), filename="batch.jsonl")
    async with s.post(base + "/v1/files", data=form, headers=auth) as r:
        file_id = (await r.json())["id"]
    req = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    async with s.post(base + "/v1/batches", json=req, headers=auth) as r:
        return str((await r.json())["id"])


async def run(base: str, args: argparse.Namespace, with_batch: bool) -> tuple[list[float], int, int]:
    ttft: list[float] = []
    errors = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        batch_id = await submit_batch(s, base, args) if with_batch else None
        warm = time.monotonic() + args.warmup_s
        deadline = time.monotonic() + args.duration
        while time.monotonic() < warm:
            await asyncio.sleep(0.05)
        while time.monotonic() < deadline:
            t = time.monotonic()
            first, n = await stream(s, base + "/v1/chat/completions", KEY_B, args.short_tokens)
            if first is None or n == 0:
                errors += 1
            else:
                ttft.append(first)
            await asyncio.sleep(max(0.0, args.every_s - (time.monotonic() - t)))
        done = 0
        if batch_id is not None:
            async with s.get(f"{base}/v1/batches/{batch_id}", headers={"authorization": f"Bearer {KEY_A}"}) as r:
                done = (await r.json())["request_counts"]["completed"]
    return ttft, errors, done


def scenario(args: argparse.Namespace, name: str) -> tuple[list[float], int, int]:
    py = sys.executable
    ep, gp = free_port(), free_port()
    emu = start(
        [py, "-m", "llm_gateway_emulators", "vllm", "--port", str(ep), "--model", "tiny", "--slots", str(args.slots),
         "--tpot-ms", str(args.tpot_ms), "--ttft-ms", str(args.ttft_ms)],
        marker=b"listening on",
    )  # fmt: skip
    with tempfile.TemporaryDirectory() as data:
        path = Path(data, "gateway.yaml")
        path.write_text(config(ep, data, args, 1 if name == "batch-reserved" else 0))
        gw = start(
            [py, "-m", "llm_gateway", "serve", "--config", str(path), "--port", str(gp)],
            ready_url=f"http://127.0.0.1:{gp}/readyz",
        )
        try:
            return asyncio.run(run(f"http://127.0.0.1:{gp}", args, with_batch=name != "alone"))
        finally:
            for p in (gw, emu):
                stop(p)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--warmup-s", type=float, default=3.0)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--batch-concurrency", type=int, default=8)
    ap.add_argument("--long-tokens", type=int, default=50)
    ap.add_argument("--short-tokens", type=int, default=8)
    ap.add_argument("--every-s", type=float, default=0.5)
    ap.add_argument("--tpot-ms", type=float, default=10.0)
    ap.add_argument("--ttft-ms", type=float, default=100.0)
    ap.add_argument("--scenarios", default="alone,batch,batch-reserved")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    results = {name: scenario(args, name) for name in args.scenarios.split(",")}
    print(
        f"\n{args.slots} slots (gateway max_concurrency = slots); batch: {args.lines} lines of {args.long_tokens} "
        f"tokens, {args.batch_concurrency} at once; interactive: one {args.short_tokens}-token stream every "
        f"{args.every_s:g} s; engine TTFT {args.ttft_ms:g} ms, {args.tpot_ms:g} ms/token; {args.duration:g} s each\n"
    )
    head = "| scenario | B requests | B TTFT p50 ms | B TTFT p95 ms | p95 / alone (<= 1.3x) | batch done | B errors |"
    print(head)
    print("|---|---|---|---|---|---|---|")
    alone = results.get("alone")
    base95 = pct(alone[0], 95) if alone and alone[0] else None
    for name, (ttft, errors, done) in results.items():
        p50 = f"{pct(ttft, 50):.0f}" if ttft else "-"
        p95 = pct(ttft, 95) if ttft else None
        ratio = f"{p95 / base95:.2f}x" if p95 and base95 and name != "alone" else "-"
        shown = f"{p95:.0f}" if p95 else "-"
        print(f"| {name} | {len(ttft)} | {p50} | {shown} | {ratio} | {done} | {errors} |")


if __name__ == "__main__":
    main()
