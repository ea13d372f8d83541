#!/usr/bin/env python3
"""Load generators for the public boards' scenarios (bench/board.py), bounded in count and time.

rate (`rate URL --rate R -d S`): open loop. Requests are due at a fixed rate whatever the target does
  (no coordinated omission: a slow answer never delays the next request); each due request takes an idle
  keep-alive connection or opens one (up to --max-conns, then it waits for one, and the wait counts).
  Raw HTTP/1.1 on an asyncio.Protocol (uvloop) with the request pre-serialised, so one core reaches
  ~10k req/s; answers are read by Content-Length or chunked framing. Prints `RATEJSON {...}`.
streams (`streams URL -c C -d S`): closed loop, C streams back to back, each on its own connection. Per
  stream the time to first body byte and the gaps between the reads that follow (the inter-event gap a
  client sees). Raw HTTP/1.1 too (sse_conn.py: chunked body decoded, SSE checked): several times cheaper per
  read than aiohttp, so the load core can read tens of thousands of paced events a second.
ramp (`ramp URL --n N --open-rate R`): opens N streams at R per second and reads each to its end; a stream
  stalls when a gap after its first byte exceeds --stall-ms; it lost frames when it has not exactly
  --tokens token deltas. Both print `STREAMSJSON {...}`.
Streams are checked with stream_client.SSEReader (status 200, SSE, JSON frames, `[DONE]` last). The body is
--body (request.json) with `fake_tpot_ms` for the fake engine. Latencies in the JSON are microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from collections import deque
from pathlib import Path

import stream_client as sc
import uvloop
from sse_conn import StreamConn, StreamStats


def pct(vals: list[float], p: float) -> float:
    return sc.pct(vals, p)


def response_end(buf: bytearray) -> tuple[int, int] | None:
    """(status, length of the whole response) once `buf` holds one full HTTP/1.1 response, else None."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return None
    head = bytes(buf[:head_end]).lower()
    status = int(head[9:12])
    pos = head.find(b"\r\ncontent-length:")
    if pos >= 0:
        end = head.find(b"\r\n", pos + 2)
        total = head_end + 4 + int(head[pos + 17 : end if end > 0 else None])
        return (status, total) if len(buf) >= total else None
    if b"\r\ntransfer-encoding: chunked" not in head:
        raise ValueError("response without Content-Length or chunked framing")
    i = head_end + 4
    while True:  # chunk: size line, data, CRLF; the last chunk has size 0 (no trailers expected)
        nl = buf.find(b"\r\n", i)
        if nl < 0:
            return None
        size = int(bytes(buf[i:nl]).split(b";")[0], 16)
        if size == 0:
            return (status, nl + 4) if len(buf) >= nl + 4 else None
        i = nl + 2 + size + 2
        if i > len(buf):
            return None


class Conn(asyncio.Protocol):
    """One keep-alive connection carrying one request at a time."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.transport: asyncio.Transport | None = None
        self.dead = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not a subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        w = self.waiter
        if w is None or w.done():
            return
        try:
            got = response_end(self.buf)
        except ValueError as e:
            w.set_exception(e)
            return
        if got is not None:
            del self.buf[: got[1]]
            w.set_result(got[0])

    def connection_lost(self, exc: Exception | None) -> None:
        self.dead = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection closed"))

    async def request(self, data: bytes) -> int:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return await self.waiter

    def close(self) -> None:
        self.dead = True
        if self.transport is not None:
            self.transport.close()


async def rate_run(a: argparse.Namespace) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    clock = time.perf_counter  # uvloop's loop.time() has 1 ms steps and is cached per loop iteration
    host, port, path = _split(a.url)
    body = Path(a.body).read_bytes() if a.body else b'{"model": "fake-model", "messages": []}'
    req = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {os.environ.get('BENCH_API_KEY', 'sk-x')}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    idle: list[Conn] = []
    waiters: deque[asyncio.Future[Conn]] = deque()
    n_conns = 0
    lat: list[float] = []
    lags: list[float] = []
    errors: dict[str, int] = {}
    ok_all = 0

    async def connect() -> Conn:
        nonlocal n_conns
        n_conns += 1
        try:
            return (await loop.create_connection(Conn, host, port))[1]
        except OSError:
            n_conns -= 1
            raise

    def release(c: Conn) -> None:
        nonlocal n_conns
        if c.dead:
            n_conns -= 1
            return
        while waiters:
            w = waiters.popleft()
            if not w.done():
                w.set_result(c)
                return
        idle.append(c)

    async def one(due: float, record: bool) -> None:
        nonlocal ok_all
        c: Conn | None = None
        try:
            if idle:
                c = idle.pop()
            elif n_conns < a.max_conns:
                c = await connect()
            else:
                w: asyncio.Future[Conn] = loop.create_future()
                waiters.append(w)
                c = await w
            status = await asyncio.wait_for(c.request(req), a.timeout)
        except Exception as e:  # count it; the connection is not reused
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            if c is None:
                return
            c.close()
        else:
            if status == 200:
                ok_all += 1
                if record:
                    lat.append(clock() - due)
            else:
                errors[f"status_{status}"] = errors.get(f"status_{status}", 0) + 1
        release(c)

    for c in [await connect() for _ in range(min(a.preopen, a.max_conns))]:
        idle.append(c)
    n_warm, n_total = int(a.warmup * a.rate), int((a.warmup + a.duration) * a.rate)
    tasks: set[asyncio.Task[None]] = set()
    t0 = clock() + 0.01
    i = 0
    while i < n_total:  # dispatch every request that is due, then sleep until the next one is
        now = clock()
        while i < n_total and t0 + i / a.rate <= now:
            due = t0 + i / a.rate
            if i >= n_warm:
                lags.append(now - due)
            # latency counts from dispatch (a connection wait included): the timer's own lateness (libuv
            # timers have 1 ms steps) is the client's, reported as dispatch_lag
            t = loop.create_task(one(now, i >= n_warm))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
            i += 1
        if i < n_total:
            await asyncio.sleep(max(0.0, t0 + i / a.rate - clock()))
    t_end = clock()
    if tasks:
        await asyncio.wait(set(tasks), timeout=a.timeout + 1)
    for t in list(tasks):
        t.cancel()
    for c in idle:
        c.close()
    lat.sort()
    lags.sort()
    recorded = n_total - n_warm
    return {
        "rate": a.rate,
        "duration_us": us(t_end - t0 - a.warmup),
        "offered": recorded,
        "ok": len(lat),
        "ok_all": ok_all,  # warm-up included: what the target's CPU during the whole step served
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "unfinished": recorded - len(lat) - sum(errors.values()),
        "conns": n_conns,
        "p50_us": us(pct(lat, 50)),
        "p90_us": us(pct(lat, 90)),
        "p99_us": us(pct(lat, 99)),
        "max_us": us(lat[-1]) if lat else 0,
        "dispatch_lag_p99_us": us(pct(lags, 99)),  # the client's own lateness (> 1 ms: the load side lags)
    }


def us(seconds: float) -> int:
    return int(seconds * 1e6)


def _split(url: str) -> tuple[str, int, str]:
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    return host, int(port or 80), "/" + path


async def one_stream(a: argparse.Namespace, req: bytes, st: StreamStats) -> None:
    loop = asyncio.get_running_loop()
    host, port, _ = _split(a.url)
    done: asyncio.Future[None] = loop.create_future()
    conn: StreamConn | None = None
    try:
        _, conn = await loop.create_connection(lambda: StreamConn(req, st, a.tokens, done), host, port)
        await asyncio.wait_for(asyncio.shield(done), a.timeout)
    except asyncio.CancelledError:
        if conn is not None:
            conn.finish("deadline")
        raise
    except Exception as e:  # count it and carry on
        if conn is not None:
            conn.finish(type(e).__name__)
        else:
            st.error(type(e).__name__)


async def streams_run(a: argparse.Namespace) -> dict[str, object]:
    chat = json.loads(Path(a.body).read_bytes()) if a.body else {"messages": [{"role": "user", "content": "Hi"}]}
    body = {**sc.dialect_body(chat, "chat", a.tokens), "fake_tpot_ms": a.tpot_ms}
    data = json.dumps(body).encode()
    host, port, path = _split(a.url)
    req = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {os.environ.get('BENCH_API_KEY', 'sk-x')}\r\nContent-Length: {len(data)}\r\n\r\n"
    ).encode() + data
    st = StreamStats()
    t_start = time.perf_counter()
    tasks: list[asyncio.Task[None]] = []
    if a.mode == "ramp":
        for i in range(a.n):
            delay = t_start + i / a.open_rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one_stream(a, req, st)))
    else:
        deadline = t_start + a.duration

        async def worker() -> None:
            while time.perf_counter() < deadline:
                await one_stream(a, req, st)

        tasks = [asyncio.create_task(worker()) for _ in range(a.concurrency)]
    left = a.deadline - (time.perf_counter() - t_start)
    await asyncio.wait(tasks, timeout=max(1.0, left))
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.perf_counter() - t_start
    ttft, gaps, mg = sorted(st.ttfts), sorted(st.gaps), st.max_gaps
    stall_s = a.stall_ms / 1e3
    return {
        "streams": st.done,
        "duration_us": us(elapsed),
        "errors": sum(st.errors.values()),
        "error_kinds": st.errors,
        "peak_open": st.peak_open,
        "stalled": sum(g > stall_s for g in mg),
        "max_gap_us": us(max(mg, default=0.0)),
        "ttft_p50_us": us(pct(ttft, 50)),
        "ttft_p99_us": us(pct(ttft, 99)),
        "gap_p50_us": us(pct(gaps, 50)),
        "gap_p99_us": us(pct(gaps, 99)),
        "gaps": len(gaps),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("rate", "streams", "ramp"))
    ap.add_argument("url", help="full URL, path included")
    ap.add_argument("--body", help="request JSON file (an OpenAI chat body)")
    ap.add_argument("--rate", type=float, default=100.0, help="rate: requests due per second")
    ap.add_argument("-d", "--duration", type=float, default=5.0, help="rate/streams: measured seconds")
    ap.add_argument("--warmup", type=float, default=0.5, help="rate: seconds at the same rate, not recorded")
    ap.add_argument("--max-conns", type=int, default=512, help="rate: most connections")
    ap.add_argument("--preopen", type=int, default=8, help="rate: connections opened before the first request")
    ap.add_argument("--timeout", type=float, default=10.0, help="per request / stream, seconds")
    ap.add_argument("-c", "--concurrency", type=int, default=16, help="streams: closed-loop streams")
    ap.add_argument("--n", type=int, default=100, help="ramp: streams opened")
    ap.add_argument("--open-rate", type=float, default=1000.0, help="ramp: streams opened per second")
    ap.add_argument("--tokens", type=int, default=64, help="streams/ramp: tokens per stream")
    ap.add_argument("--tpot-ms", type=float, default=20.0, help="streams/ramp: the fake engine's pace")
    ap.add_argument("--stall-ms", type=float, default=200.0, help="ramp: a gap over this is a stall")
    ap.add_argument("--deadline", type=float, default=120.0, help="streams/ramp: overall limit, seconds")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if a.mode == "rate":
        print("RATEJSON " + json.dumps(uvloop.run(rate_run(a))), flush=True)
    else:
        print("STREAMSJSON " + json.dumps(uvloop.run(streams_run(a))), flush=True)


if __name__ == "__main__":
    main()
