#!/usr/bin/env python3
"""Streaming load generator (aiohttp on uvloop). Two modes, both bounded in count and time.

closed loop (`-c C -d SECONDS`): C workers POST `"stream": true` chat requests back to back until
  the duration (or --max-requests) is reached. Prints `STREAMJSON {...}`.
hold (`--hold N`): opens N streams at --open-rate per second (at most --open-inflight waiting for
  their first byte at once), keeps them all open while they stream, reads each to the end. Prints
  `OPEN <open now> <first bytes so far> <started>` every second, `ALLOPEN N` the moment all N are
  open at once, and at the end `HOLDJSON {...}` with the peak number of streams open at once. With
  --engine-hold ID the fake engine keeps every stream going (one token per tpot) until the harness
  calls its /fake/release?hold=ID, so "all open at once" does not depend on timing.

Per stream: TTFT = first body bytes after the request was sent; total latency; SSE events
(`data:` lines); success = status 200, `data: [DONE]` at the end and no `"error"` in the stream.
Latencies in the JSON are microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from pathlib import Path

import aiohttp


def pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return 0.0
    return sorted_vals[min(len(sorted_vals) - 1, round(p / 100 * (len(sorted_vals) - 1)))]


class Stats:
    def __init__(self) -> None:
        self.ttfts: list[float] = []
        self.totals: list[float] = []
        self.events: list[int] = []
        self.errors: dict[str, int] = {}
        self.open = self.peak_open = self.first_bytes = 0
        self.t_all_open: float | None = None
        self.t_last_first_byte = 0.0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def summary(self, elapsed: float, **extra: object) -> dict[str, object]:
        t, f = sorted(self.ttfts), sorted(self.totals)
        us = lambda v: int(v * 1e6)  # noqa: E731
        return {
            "requests": len(self.totals),
            "duration_us": us(elapsed),
            "errors": sum(self.errors.values()),
            "error_kinds": self.errors,
            "events_median": sorted(self.events)[len(self.events) // 2] if self.events else 0,
            "p50_us": us(pct(f, 50)),
            "p90_us": us(pct(f, 90)),
            "p99_us": us(pct(f, 99)),
            "max_us": us(f[-1]) if f else 0,
            "ttft_p50_us": us(pct(t, 50)),
            "ttft_p90_us": us(pct(t, 90)),
            "ttft_p99_us": us(pct(t, 99)),
            "ttft_max_us": us(t[-1]) if t else 0,
            **extra,
        }


async def one_stream(
    s: aiohttp.ClientSession,
    a: argparse.Namespace,
    data: bytes,
    hdrs: dict[str, str],
    st: Stats,
    opened: asyncio.Semaphore | None = None,
) -> None:
    t0 = time.perf_counter()
    got_first = False
    counted_open = False
    try:
        async with s.post(a.url, data=data, headers=hdrs) as r:
            tail, events, bad = b"", 0, False
            async for chunk in r.content.iter_any():
                if not got_first:
                    got_first = True
                    ttft = time.perf_counter() - t0
                    st.first_bytes += 1
                    st.t_last_first_byte = time.perf_counter()
                    st.open += 1
                    counted_open = True
                    st.peak_open = max(st.peak_open, st.open)
                    if a.hold and st.open == a.hold and st.t_all_open is None:
                        st.t_all_open = time.perf_counter()
                        print(f"ALLOPEN {st.open}", flush=True)  # the harness waits for this line
                    if opened is not None:
                        opened.release()
                        opened = None
                if b'"error"' in chunk:
                    bad = True
                events += chunk.count(b"data:")
                tail = (tail + chunk)[-64:]
            t1 = time.perf_counter()
            if r.status != 200:
                st.error(f"status_{r.status}")
            elif not got_first:
                st.error("empty_body")
            elif bad:
                st.error("error_event")
            elif b"data: [DONE]" not in tail:
                st.error("no_done")
            else:
                st.ttfts.append(ttft)
                st.totals.append(t1 - t0)
                st.events.append(events)
    except asyncio.CancelledError:
        st.error("deadline")
        raise
    except Exception as e:  # count it and carry on
        st.error(type(e).__name__)
    finally:
        if counted_open:
            st.open -= 1
        if opened is not None:
            opened.release()


def request_body(a: argparse.Namespace) -> bytes:
    body = json.loads(Path(a.body).read_bytes()) if a.body else {"messages": [{"role": "user", "content": "Hi"}]}
    body["model"] = a.model or body.get("model", "fake-model")
    body["stream"] = True
    body["max_tokens"] = a.tokens
    if a.tpot_ms is not None:
        body["fake_tpot_ms"] = a.tpot_ms  # read by bench/fake_engine.py, passed through by the proxies
    if a.engine_hold:
        body["fake_hold"] = a.engine_hold  # the fake engine streams until the harness calls /fake/release?hold=ID
    return json.dumps(body).encode()


async def run(a: argparse.Namespace) -> None:
    data = request_body(a)
    hdrs = {"Content-Type": "application/json", "Authorization": "Bearer " + os.environ.get("BENCH_API_KEY", "sk-x")}
    st = Stats()
    conn = aiohttp.TCPConnector(
        limit=0 if a.hold else a.concurrency, local_addr=(a.local_addr, 0) if a.local_addr else None
    )
    timeout = aiohttp.ClientTimeout(total=a.timeout, sock_connect=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        t_start = time.perf_counter()
        if a.hold:
            opened = asyncio.Semaphore(a.open_inflight)
            tasks: list[asyncio.Task[None]] = []

            async def opener() -> None:
                for i in range(a.hold):
                    delay = t_start + i / a.open_rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await opened.acquire()
                    tasks.append(asyncio.create_task(one_stream(s, a, data, hdrs, st, opened)))

            async def progress() -> None:  # one line a second, for the harness to see a stalled ramp
                while True:
                    await asyncio.sleep(1.0)
                    print(f"OPEN {st.open} {st.first_bytes} {len(tasks)}", flush=True)

            op = asyncio.create_task(opener())
            prog = asyncio.create_task(progress())
            await asyncio.wait([op], timeout=a.deadline)
            left = max(0.0, a.deadline - (time.perf_counter() - t_start))
            if tasks and left > 0:
                await asyncio.wait(tasks, timeout=left)
            for t in [op, prog, *tasks]:
                t.cancel()
            await asyncio.gather(op, prog, *tasks, return_exceptions=True)
            elapsed = time.perf_counter() - t_start
            extra = {
                "hold": a.hold,
                "started": len(tasks),
                "first_bytes": st.first_bytes,
                "peak_open": st.peak_open,
                "all_open_s": round(st.t_all_open - t_start, 3) if st.t_all_open else None,
                "ramp_s": round(st.t_last_first_byte - t_start, 3) if st.first_bytes else None,
            }
            print("HOLDJSON " + json.dumps(st.summary(elapsed, **extra)), flush=True)
            return
        deadline = t_start + a.duration
        started = 0

        async def worker() -> None:
            nonlocal started
            while time.perf_counter() < deadline and started < a.max_requests:
                started += 1
                await one_stream(s, a, data, hdrs, st)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(a.concurrency))), a.duration + a.timeout + 5)
        elapsed = time.perf_counter() - t_start
    print("STREAMJSON " + json.dumps(st.summary(elapsed)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--body", help="request JSON file (model/stream/max_tokens are overridden)")
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens: the fake engine sends exactly that many")
    ap.add_argument("--tpot-ms", type=int, help="fake_tpot_ms in the body (fake engine's delay between tokens)")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("-d", "--duration", type=float, default=10.0)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--timeout", type=float, default=60.0, help="per stream, seconds")
    ap.add_argument("--hold", type=int, default=0, help="hold mode: open this many streams at once")
    ap.add_argument("--open-rate", type=float, default=1000.0, help="hold mode: streams opened per second")
    ap.add_argument("--open-inflight", type=int, default=256, help="hold mode: most streams awaiting first byte")
    ap.add_argument("--deadline", type=float, default=120.0, help="hold mode: overall limit, seconds")
    ap.add_argument("--engine-hold", metavar="ID", help="streams last until the engine's /fake/release?hold=ID")
    ap.add_argument("--local-addr", help="source address (127.0.0.x) to spread connections over 4-tuples")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if a.hold and a.hold + 64 > hard:
        raise SystemExit(f"--hold {a.hold} needs more fds than this process may open ({hard}); split the load")
    try:
        import uvloop

        uvloop.run(run(a))
    except ImportError:
        asyncio.run(run(a))


if __name__ == "__main__":
    main()
