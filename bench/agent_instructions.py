"""User-space instructions per agent-sized request in each dialect, counted by callgrind (issue 36 item 2).

A coding agent's 74 KB request (bench/agent_request.py: the same conversation as a chat, a messages and a
responses body) costs the gateway more in `/v1/messages` and `/v1/responses` than in chat completions: the
translation. The acceptance is within 1.3x of chat's CPU per request; on a shared 2-core VM a CPU time moves
10-20 % between runs, so this counts instructions instead (callgrind, the same to about 0.5 % run to run).

The gateway runs as a whole process under `valgrind --tool=callgrind` (instrumentation off until warm, as
bench/instructions.py starts it) against the fake engine, with PYTHONHASHSEED fixed so that set and dict
orders are the same on every run. Per dialect: a few warm-up streams, then `--requests` streams of
`--tokens` tokens (one at a time) counted between a zero and a dump of the counters, less what the gateway
does idle for as long (timers, probes: counted alone). Prints instructions per request and each dialect's
ratio to chat.

  bench/agent_instructions.py --requests 30                      this checkout's gateway
  bench/agent_instructions.py --gateway-dir /work/main           another checkout's (A/B)
  BENCH_KEEP_DUMPS=1 bench/agent_instructions.py                 keep the dumps (callgrind_annotate them)

Needs valgrind. Each dialect's dump is `cg.<pid>.<n>` in the printed folder when kept (the last three: chat,
messages, responses, in that order).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import agent_request
import procstat as ps
import targets as tg
from instructions import Counted, report

BENCH = Path(__file__).resolve().parent
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def send(url: str, dialect: str, body: Path, n: int, a: argparse.Namespace) -> int:
    """`n` streams of the agent request in `dialect` (one at a time, the client on CPU 1); how many were good."""
    cmd = [tg.PROJECT_PY, str(BENCH / "stream_client.py"), url, "--dialect", dialect, "--native-body"]
    cmd += ["--body", str(body), "-c", str(a.concurrency), "-d", "600", "--max-requests", str(n)]
    cmd += ["--tokens", str(a.tokens), "--timeout", "300"]  # the pace: the engine's (Messages refuses fake_tpot_ms)
    env = {**os.environ, "BENCH_API_KEY": tg.API_KEY}
    out = subprocess.run(["taskset", "-c", "1", *cmd], capture_output=True, text=True, env=env, timeout=900)
    if "STREAMJSON" not in out.stdout:
        raise RuntimeError(f"stream client: {out.stdout[-400:]} {out.stderr[-400:]}")
    r = json.loads(out.stdout.split("STREAMJSON", 1)[1])
    if r["errors"]:
        print(f"    {dialect}: {r['errors']} of {n} streams failed: {r['error_kinds']}", flush=True)
    return int(r["requests"])


def measure(a: argparse.Namespace, engine_url: str, out: Path, bodies: dict[str, Path]) -> dict[str, float]:
    """Instructions per request for each dialect, one gateway process for all of them."""
    port = ps.free_port()
    env = {**os.environ, "BENCH_API_KEY": tg.API_KEY, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    config = tg.write_gateway_config(out / "gateway.yaml", [engine_url], profile=a.profile)
    cmd = tg.DEFAULT_GATEWAY_CMD.replace("{py}", tg.PROJECT_PY).replace("{config}", str(config))
    cmd = cmd.replace("{port}", str(port))
    target = Counted("gateway", cmd, out, Path(a.gateway_dir), env)
    base = f"http://127.0.0.1:{port}"
    per_request: dict[str, float] = {}
    try:
        deadline = time.monotonic() + a.start_timeout
        while ps.port_free(port):
            if target.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway did not start: see {out}/gateway.log")
            time.sleep(0.5)
        for d in PATHS:  # warm: imports, pools, caches of every path
            if send(base + PATHS[d], d, bodies[d], 3, a) != 3:
                raise RuntimeError(f"{d}: the warm-up failed (see above)")
        target.control("-i", "on")
        for d in PATHS:  # warm, now instrumented
            send(base + PATHS[d], d, bodies[d], 2, a)
        idle_rate = target.count(lambda: time.sleep(a.idle_s)) / a.idle_s
        for d in PATHS:
            good: list[int] = []

            def run(d: str = d, into: list[int] = good) -> None:
                into.append(send(base + PATHS[d], d, bodies[d], a.requests, a))

            t0 = time.monotonic()
            ir = target.count(run)
            busy = ir - idle_rate * (time.monotonic() - t0)
            if good[0] != a.requests:
                raise RuntimeError(f"{d}: {good[0]} of {a.requests} requests were good")
            per_request[d] = busy / a.requests
            print(f"  {d}: {per_request[d]:,.0f} instructions a request", flush=True)
        print(f"  idle {idle_rate:,.0f} instructions a second (taken off)", flush=True)
    finally:
        target.stop()
    return per_request


def table(r: dict[str, float]) -> str:
    rows = ["| dialect | instructions / request | x chat |", "|---|---|---|"]
    rows += [f"| {d} | {v:,.0f} | {v / r['chat']:.3f} |" for d, v in r.items()]
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway-dir", default=str(BENCH.parent), help="the checkout whose gateway runs")
    ap.add_argument("--profile", default="minimal", choices=tg.PROFILES, help="the gateway's config (bench/targets.py)")
    ap.add_argument("--requests", type=int, default=30, help="requests counted per dialect")
    ap.add_argument("--tokens", type=int, default=16, help="tokens each stream relays")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--tpot-ms", type=int, default=30, help="the fake engine's pace (as bench/instructions.py)")
    ap.add_argument("--start-timeout", type=float, default=240.0)
    ap.add_argument("--idle-s", type=float, default=5.0, help="the idle count's length (taken off each count)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"bench: {tool} missing (apt-get install valgrind util-linux)")
    out = Path(tempfile.mkdtemp(prefix="agent-instructions-"))
    bodies = agent_request.write(out / "bodies")
    engine_port = ps.free_port()
    engine_cmd = [tg.PROJECT_PY, str(BENCH / "fake_engine.py"), "--port", str(engine_port), "--tpot-ms", str(a.tpot_ms)]
    engine = subprocess.Popen(
        ["taskset", "-c", "1", *engine_cmd],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            if not ps.port_free(engine_port):
                break
            time.sleep(0.1)
        results = measure(a, f"http://127.0.0.1:{engine_port}", out, bodies)
    finally:
        engine.terminate()
        engine.wait(10)
    title = (
        f"**Agent request, user-space instructions (callgrind)**, {a.requests} requests a dialect, "
        f"{a.tokens} tokens each, c{a.concurrency}, {a.profile} config; gateway from {a.gateway_dir}"
    )
    report(title, table(results), results, a.json, out)


if __name__ == "__main__":
    main()
