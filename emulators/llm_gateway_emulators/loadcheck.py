"""Load check: hold N concurrent streams against an emulator and report what it took.

``python -m llm_gateway_emulators.loadcheck --streams 10000`` starts an emulator subprocess (or uses
``--url``), opens N raw HTTP/1.1 connections, sends one streaming chat request on each,
reads every stream to its end and prints one JSON line: streams completed, wall time,
peak concurrent streams seen by the emulator (``stats.active``), emulator RSS and CPU
seconds. The client is raw asyncio on uvloop so it stays cheaper than the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import orjson


async def _stream(host: str, port: int, path: str, body: bytes, done_marker: bytes) -> int:
    reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
    try:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
        writer.write(head + body)
        total = 0
        tail = b""
        while True:
            data = await reader.read(65536)
            if not data:
                break
            total += len(data)
            tail = (tail + data)[-64:]
            if tail.endswith(b"0\r\n\r\n") and done_marker in tail:
                break
        return total
    finally:
        writer.close()


async def _stats(host: str, port: int) -> dict[str, Any]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET /_emulator/stats HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    raw = await reader.read()
    writer.close()
    return dict(orjson.loads(raw.split(b"\r\n\r\n", 1)[1]))


def _proc_usage(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds) of a process, from /proc."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


async def run(url: str, streams: int, tokens: int, engine: str, pid: int | None) -> dict[str, Any]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = "/api/chat" if engine == "ollama-native" else "/v1/chat/completions"
    body = orjson.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
    )
    marker = b"done" if engine == "ollama-native" else b"[DONE]"
    cpu0 = _proc_usage(pid)[1] if pid else 0.0
    t0 = time.perf_counter()
    peak = 0
    tasks = [asyncio.ensure_future(_stream(host, port, path, body, marker)) for _ in range(streams)]
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.5)
        peak = max(peak, int((await _stats(host, port))["active"]))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    wall = time.perf_counter() - t0
    ok = sum(1 for r in results if isinstance(r, int) and r > 0)
    out: dict[str, Any] = {"streams": streams, "completed": ok, "wall_s": round(wall, 2), "peak_active": peak}
    if pid:
        rss, cpu = _proc_usage(pid)
        out.update({"server_rss_mib": round(rss, 1), "server_cpu_s": round(cpu - cpu0, 2)})
    errors = [repr(r) for r in results if isinstance(r, BaseException)][:3]
    if errors:
        out["errors"] = errors
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m llm_gateway_emulators.loadcheck", description=__doc__)
    p.add_argument("--url", help="an emulator already running; default: start one")
    p.add_argument("--engine", default="vllm")
    p.add_argument("--streams", type=int, default=10000)
    p.add_argument("--tokens", type=int, default=20)
    p.add_argument("--tpot-ms", type=float, default=200.0)
    p.add_argument("--ttft-ms", type=float, default=200.0)
    args = p.parse_args(argv)
    proc = None
    url = args.url
    if url is None:
        cmd = [
            sys.executable,
            "-m",
            "emulators",
            args.engine,
            "--port",
            "0",
            "--slots",
            str(args.streams),
            "--tpot-ms",
            str(args.tpot_ms),
            "--ttft-ms",
            str(args.ttft_ms),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        url = line.rsplit(" ", 1)[-1]
    try:
        import uvloop

        result = uvloop.run(run(url, args.streams, args.tokens, args.engine, proc.pid if proc else None))
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
    print(json.dumps(result), flush=True)
    return 0 if result["completed"] == args.streams else 1


if __name__ == "__main__":
    sys.exit(main())
