"""User-space instructions per request of the whole gateway process, every thread counted (the OTLP export thread
too), by callgrind: what tracing at 100 % sampling costs per request, deterministic enough to A/B a 2 % change.

bench/instructions.py counts a stream's relay; this counts whole non-streamed requests (request.json, as
bench/ledger_ab.py sends them) of each `--profiles` entry (targets.PROFILES: `minimal` is tracing off, `traced`
the same with tracing on, every request sampled, exported over OTLP/HTTP to bench/otlp_sink.py on a free port).
Each gateway runs under `valgrind --tool=callgrind --separate-threads=yes` (instrumentation off until warm), with
PYTHONHASHSEED=0; a count zeroes the counters, sends `--requests` requests at `--conc` from this process (pinned
to CPU 1), waits until the sink has every span of them (so the export thread's encoding and sending of them is
in the count: it exports at OTEL_BSP_SCHEDULE_DELAY or a full batch), then dumps. What the process does idle for
as long (probes, timers, the export thread's empty wakes) is counted alone first (`--idle-s`) and taken off.

    PYTHONPATH=. .venv/bin/python bench/whole_instructions.py --requests 400 --idle-s 20
    ... --conc 64 --requests 640
    ... --gateway-dir ../other-checkout        # that checkout's llm_gateway, the same way (an A/B: run both)
    ... --body agent --profiles minimal,team,aiohttp --requests 200     # the 74 KB agent request, and the floor

`--body agent` sends agent_request.py's 74 KB coding-agent chat request (20 tools, 46 messages) instead of
request.json; `agent-messages` and `agent-responses` the same conversation to `/v1/messages` and `/v1/responses`
(whole answers: what the translations cost, read against `agent`'s count; gateway profiles only).
`aiohttp` in `--profiles` is not a gateway config: it counts bench/proxies/aiohttp_bare.py (the bare aiohttp server
+ client the issue's "2x bare aiohttp" reads against) the same way, in front of the same engine, so
that the ratio can be read in instructions as well as in CPU time.

Prints per profile the instructions per request (all threads, and per thread: thread 1 is the event loop), and
each profile's ratio to the first. BENCH_KEEP_DUMPS=1 keeps the dumps (for callgrind_annotate). What it does not
count: the kernel, and time (an instruction is not a cycle); see instructions.py.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instructions as ins
import procstat as ps
import targets as tg

BENCH = Path(__file__).resolve().parent
_THREAD = re.compile(r"-(\d+)$")


def post_many(port: int, n: int, conc: int, body: tuple[str, bytes]) -> int:
    """`n` POSTs of `body` (its path and bytes) over `conc` kept connections; how many answered 200."""
    path, data = body
    left = [n]
    good = [0]
    lock = threading.Lock()
    headers = {"content-type": "application/json", "authorization": f"Bearer {tg.API_KEY}"}

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        try:
            while True:
                with lock:
                    if left[0] <= 0:
                        return
                    left[0] -= 1
                conn.request("POST", path, data, headers)
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    with lock:
                        good[0] += 1
        finally:
            conn.close()

    threads = [threading.Thread(target=worker) for _ in range(min(conc, n))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return good[0]


def _metrics(port: int) -> str:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.request("GET", "/metrics", headers={"authorization": f"Bearer {tg.API_KEY}"})
        return conn.getresponse().read().decode()
    except OSError as e:
        return f"(no /metrics: {e})"


def sink_spans(path: Path) -> int:
    try:
        return int(json.loads(path.read_text())["spans"])
    except (OSError, ValueError, KeyError):
        return 0


class Target(ins.Counted):
    """A gateway under callgrind, one dump file per thread (`--separate-threads=yes`)."""

    def __init__(self, name: str, cmd: list[str], out: Path, cwd: Path, env: dict[str, str]) -> None:
        self.name, self.out = name, out
        vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes"]
        vg.append(f"--callgrind-out-file={out}/cg.%p")
        self.log = open(out / f"{name}.log", "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", *vg, *cmd], cwd=cwd, env=env, stdout=self.log, stderr=self.log
        )

    def count_threads(self, run: Callable[[], object]) -> dict[int, int]:
        """Instructions per thread (1: the main thread) executed while `run()` runs."""
        self.control("-z")
        run()
        before = set(self.out.glob(f"cg.{self.proc.pid}.*"))
        self.control("-d")
        time.sleep(1.0)  # callgrind_control returns once every thread's dump is written
        new = set(self.out.glob(f"cg.{self.proc.pid}.*")) - before
        if not new:
            raise RuntimeError(f"{self.name}: callgrind wrote no dump")
        return per_thread(new)


def per_thread(dumps: Iterable[Path]) -> dict[int, int]:
    """One dump's instructions per thread, from its files (`cg.PID.N-TT`: thread TT; no suffix: one thread, 1)."""
    out: dict[int, int] = {}
    for p in dumps:
        m = _THREAD.search(p.name)
        out[int(m.group(1)) if m else 1] = ins.dump_total(p.read_bytes())
    return out


#: `--profiles` entries that are not gateway configs: the bare aiohttp proxy (one upstream: the first engine)
FLOORS = ("aiohttp",)
#: `--body` choices: the bench's 420-byte request, or agent_request.py's 74 KB coding-agent request as chat
#: completions, or the same conversation as `/v1/messages` or `/v1/responses` (gateway profiles only)
BODIES = ("request", "agent", "agent-messages", "agent-responses")
_PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}


def request_body(kind: str) -> tuple[str, bytes]:
    """The path and bytes each request POSTs: request.json, or the agent request (as wrk sends it)."""
    if kind.startswith("agent"):
        import agent_request

        dialect = kind.partition("-")[2] or "chat"
        return _PATHS[dialect], agent_request.encode(agent_request.bodies()[dialect])
    return _PATHS["chat"], (BENCH / "request.json").read_bytes()


def measure(
    profile: str, a: argparse.Namespace, engines: list[str], out: Path, body: tuple[str, bytes]
) -> dict[str, float]:
    port = ps.free_port()
    gw = Path(a.gateway_dir).resolve()
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(gw)}
    sink = None
    sink_out = out / f"{profile}-sink.json"
    if profile in FLOORS:  # the bare proxy: one upstream (the first engine), no config
        env["UPSTREAM_URL"], env["PORT"] = engines[0], str(port)
        target = Target(profile, [tg.PROJECT_PY, str(BENCH / "proxies" / "aiohttp_bare.py")], out, BENCH.parent, env)
    else:
        cfg = tg.gateway_config(engines, profile=profile, data_dir=out / f"{profile}-data")
        if "tracing" in cfg:
            sink_port = ps.free_port()
            cfg["tracing"]["endpoint"] = f"http://127.0.0.1:{sink_port}"
            sink_cmd = [tg.PROJECT_PY, str(BENCH / "otlp_sink.py"), "--port", str(sink_port), "--out", str(sink_out)]
            sink = subprocess.Popen(
                ["taskset", "-c", "1", *sink_cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
        config = out / f"{profile}.yaml"
        config.write_text(yaml.safe_dump(cfg, sort_keys=False))
        # an export's time limit is wall-clock: under callgrind (~50x slower) on a shared box, 10 s can pass while
        # the sink answers, and the batch would be dropped (export_failed)
        env["OTEL_EXPORTER_OTLP_TRACES_TIMEOUT"] = "300"
        cmd = [tg.PROJECT_PY, "-m", "llm_gateway", "serve", "--config", str(config), "--host", "127.0.0.1"]
        target = Target(profile, [*cmd, "--port", str(port)], out, gw, env)
    spans_per_request = 2 if sink is not None else 0  # the request's SERVER span and its attempt's CLIENT span

    def settled(expected: int) -> None:
        """Until the sink has `expected` spans (the export thread sent what these requests made)."""
        deadline = time.monotonic() + 120
        while sink_spans(sink_out) < expected:
            if time.monotonic() > deadline:
                dropped = [x for x in _metrics(port).splitlines() if x.startswith("gateway_trace_spans_dropped")]
                raise RuntimeError(f"{profile}: the sink has {sink_spans(sink_out)} of {expected} spans; {dropped}")
            time.sleep(0.05)

    try:
        deadline = time.monotonic() + a.start_timeout
        while ps.port_free(port):
            if target.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{profile} did not start: see {out}/{profile}.log")
            time.sleep(0.5)
        sent = post_many(port, 40, a.conc, body)  # warm: pools, caches, the engine's bodies
        target.control("-i", "on")
        sent += post_many(port, max(40, a.requests // 4), a.conc, body)  # warm, now instrumented
        settled(sent * spans_per_request)
        idle = target.count_threads(lambda: time.sleep(a.idle_s))
        idle_rate = {t: ir / a.idle_s for t, ir in idle.items()}
        good = [0]

        def run() -> None:
            good[0] = post_many(port, a.requests, a.conc, body)
            settled((sent + a.requests) * spans_per_request)

        t0 = time.monotonic()
        busy = target.count_threads(run)
        took = time.monotonic() - t0
        if good[0] != a.requests:
            raise RuntimeError(f"{profile}: {good[0]} of {a.requests} requests answered 200")
    finally:
        target.stop()
        if sink is not None:
            sink.terminate()
            sink.wait(10)
    per_thread = {t: (ir - idle_rate.get(t, 0.0) * took) / a.requests for t, ir in sorted(busy.items())}
    total = sum(per_thread.values())
    print(f"  {profile}: {total:,.0f} instructions a request ({took:.0f} s counted)", flush=True)
    return {
        "ir_per_request": total,
        **{f"thread_{t}": v for t, v in per_thread.items()},
        "ir_idle_per_s": sum(idle_rate.values()),
    }


def table(results: dict[str, dict[str, float]]) -> str:
    """Instructions per request per profile, its ratio to the first profile's, and per thread."""
    first = next(iter(results))
    base = results[first]["ir_per_request"]
    threads = sorted({k for r in results.values() for k in r if k.startswith("thread_")}, key=lambda k: int(k[7:]))
    rows = [f"| profile | instructions / request | x {first} | " + " | ".join(threads) + " |"]
    rows.append("|---" * (3 + len(threads)) + "|")
    for p, r in results.items():
        cells = [f"{r[t]:,.0f}" if t in r else "-" for t in threads]
        rows.append(
            f"| {p} | {r['ir_per_request']:,.0f} | {r['ir_per_request'] / base:.3f} | " + " | ".join(cells) + " |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", default="minimal,traced", help=f"comma list of: {', '.join(tg.PROFILES + FLOORS)}")
    ap.add_argument("--body", default="request", choices=BODIES, help="request.json, or the 74 KB agent chat request")
    ap.add_argument("--gateway-dir", default=str(BENCH.parent), help="the checkout whose llm_gateway runs")
    ap.add_argument("--requests", type=int, default=400, help="requests counted per profile")
    ap.add_argument("--conc", type=int, default=1, help="requests in flight at once")
    ap.add_argument("--idle-s", type=float, default=20.0, help="the idle count's length (taken off the count)")
    ap.add_argument("--start-timeout", type=float, default=300.0)
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    for tool in ("valgrind", "callgrind_control", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"bench: {tool} missing (apt-get install valgrind util-linux)")
    profiles = [p for p in a.profiles.split(",") if p]
    for p in profiles:
        if p not in tg.PROFILES + FLOORS:
            ap.error(f"unknown profile {p!r}: one of {', '.join(tg.PROFILES + FLOORS)}")
    os.sched_setaffinity(0, {1 if (os.cpu_count() or 1) > 1 else 0})  # the load, beside the gateway's CPU 0
    body = request_body(a.body)
    out = Path(tempfile.mkdtemp(prefix="whole-instructions-"))
    engine_ports = (ps.free_port(), ps.free_port())
    engine_cmd = [tg.PROJECT_PY, str(BENCH / "fake_engine.py"), "--port", f"{engine_ports[0]},{engine_ports[1]}"]
    engine = subprocess.Popen(["taskset", "-c", "1", *engine_cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results: dict[str, dict[str, float]] = {}
    try:
        if not ps.wait_until(lambda: not ps.port_free(engine_ports[1]), 30):
            raise RuntimeError("the fake engine did not start")
        engines = [f"http://127.0.0.1:{p}" for p in engine_ports]
        for p in profiles:
            results[p] = measure(p, a, engines, out, body)
    finally:
        engine.terminate()
        engine.wait(10)
    title = (
        f"**Whole-process user-space instructions (callgrind)**, {a.requests} requests at c{a.conc} "
        f"({'request.json' if a.body == 'request' else f'the 74 KB agent request, {body[0]}'}, not streamed), "
        f"idle {a.idle_s:g} s taken off; gateway from {a.gateway_dir}"
    )
    ins.report(title, table(results), results, a.json, out)


if __name__ == "__main__":
    main()
