#!/usr/bin/env python3
"""llm-gateway performance bench: the gateway against the engine alone, a naive FastAPI + httpx proxy and
LiteLLM, measured in one run against the same fake engine, printed as one markdown table with the
project's targets next to the numbers. See bench/README.md.

Pinning: the target on CPU 0 (`taskset -c 0`); fake engine, load generators and this script on CPU 1.
Everything we start runs at `--nice` in its own session, whose autogroup gets the same nice.
"""

# The run's pieces: run_context.py (targets, scenarios, Ctx), load_generators.py (wrk, stream_client.py),
# scenario_runs.py (measured windows, rss_1k), target_run.py (one target's process and scenarios),
# smoke_checks.py, run_profiling.py, board.py (the public boards' scenarios). This module owns the command
# line, the fake engine, the run's JSON and table, and streams.py's part.

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import board
import cpu_idle
import procstat as ps
import report
import targets as tg
from run_context import (
    BENCH,
    DEFAULT_SCENARIOS,
    DIALECT_RATIOS,
    GATEWAYS,
    LOAD_CPU,
    ORDER,
    RESULTS,
    RSS1K_N,
    RSS1K_TPOT_MS,
    ST_TOKENS,
    TARGETS,
    Ctx,
)
from target_run import bench_target


def run_streams(ctx: Ctx) -> dict:
    a = ctx.a
    out = ctx.dir / "streams.json"
    argv = [tg.PROJECT_PY, str(BENCH / "streams.py"), "--n", str(a.streams_n), "--rounds", str(a.streams_rounds)]
    argv += ["--json", str(out), "--nice", str(ctx.nice)]
    if a.gateway_cmd:
        argv += ["--gateway-cmd", a.gateway_cmd]
    if a.quick:
        argv += ["--hold-s", "2", "--settle-s", "10"]
    budget = 900 * a.streams_rounds + 120
    p = subprocess.run(argv, timeout=budget, capture_output=True, text=True)
    (ctx.dir / "streams.log").write_text(p.stdout + p.stderr)
    for line in p.stdout.splitlines():
        if line.startswith(("  round", "streams.py:")):
            print("    " + line.strip(), flush=True)
    if not out.exists():
        return {"error": "streams.py wrote no result: " + (p.stderr or p.stdout)[-500:]}
    return json.loads(out.read_text())


# ---------- report ----------
def table(data: dict) -> str:
    return report.render(data)


def interpreter(py: str) -> str:
    """Which CPython build runs the Python targets: its real path and how it was built (the build moves
    the gateway's CPU by up to ~10%: a shared libpython without PGO, pyenv's default, is the slow one)."""
    code = (
        "import os, sys, sysconfig\n"
        "args = sysconfig.get_config_var('CONFIG_ARGS') or ''\n"
        "maps = open('/proc/self/maps').read()\n"
        "facts = ['libpython shared' if 'libpython' in maps else 'libpython linked in']\n"
        "facts += [f for f in ('--enable-optimizations', '--with-lto') if f in args]\n"
        "print(os.path.realpath(sys._base_executable), '(' + ', '.join(facts) + ')')"
    )
    try:
        out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return out.strip() or "?"


def versions(ctx: Ctx) -> dict:
    def pipv(py: str, pkgs: list[str]) -> dict:
        code = "import importlib.metadata as m\nfor p in PKGS:\n  try: print(p, m.version(p))\n  except Exception: pass"
        code = code.replace("PKGS", repr(pkgs))
        try:
            out = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60).stdout
            return dict(line.split() for line in out.splitlines())
        except (OSError, subprocess.TimeoutExpired):
            return {}

    wrk = subprocess.run(["wrk", "-v"], capture_output=True, text=True).stdout.split("[")[0].strip()
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), "?")
    git = subprocess.run(["git", "-C", str(tg.REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return {
        "python": platform.python_version(),
        "interpreter": interpreter(tg.PROJECT_PY),
        "kernel": platform.release(),
        "cpu": cpu,
        "ncpu": os.cpu_count(),
        "wrk": wrk,
        "git": git.stdout.strip(),
        "gateway_venv": pipv(tg.PROJECT_PY, ["llm-gateway", "uvicorn", "uvloop", "httptools", "aiohttp", "orjson"]),
        "naive_venv": pipv(str(tg.NAIVE_VENV / "bin/python"), ["fastapi", "starlette", "uvicorn", "httpx", "anyio"])
        if tg.naive_available()
        else {},
        "smg_venv": pipv(str(tg.SMG_VENV / "bin/python"), ["smg"]) if tg.smg_available() else {},
        "litellm_venv": pipv(str(tg.LITELLM_VENV / "bin/python"), ["litellm", "openai", "fastapi", "httpx"])
        if tg.litellm_available()
        else {},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default=",".join(TARGETS), help="comma list of: " + ", ".join(TARGETS))
    ap.add_argument("--scenarios", default=",".join(DEFAULT_SCENARIOS), help="comma list of: " + ", ".join(ORDER))
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per measured scenario")
    ap.add_argument("--warmup", type=float, default=1.0, help="unrecorded seconds of the same load before each")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 s scenarios, no re-measuring, small streams.py")
    ap.add_argument("--gateway-cmd", help="how to start the gateway; placeholders {py} {config} {port} {bench} {repo}")
    ap.add_argument("--streams-n", type=int, default=10000, help="streams.py: concurrent streams wanted")
    ap.add_argument("--streams-rounds", type=int, default=5, help="streams.py: rounds")
    ap.add_argument("--nice", type=int, default=-10, help="nice (and autogroup nice) of everything we start")
    ap.add_argument(
        "--cpu-latency-us",
        type=int,
        default=0,
        help="CPU latency request held while measuring (cpu_idle.py; 0: idle CPUs poll); -1: the machine's idle states",
    )
    ap.add_argument("--max-noise", type=float, default=10.0, help="re-measure when the target waited > this %% for CPU")
    ap.add_argument("--retries", type=int, default=2, help="re-measurements per scenario (least noisy kept)")
    ap.add_argument("--max-retries-total", type=int, default=8)
    ap.add_argument("--start-timeout", type=float, default=120.0)
    ap.add_argument("--profile", choices=("py-spy", "cprofile"), help="profile the gateway (see bench/profile.sh)")
    ap.add_argument("--table", metavar="JSON", help="only re-print the table of a saved run")
    board.add_arguments(ap)
    a = ap.parse_args()
    if a.table:
        print(table(json.loads(Path(a.table).read_text())))
        return 0
    if a.quick:
        a.duration, a.warmup, a.retries = 2.0, 0.5, 0
        a.streams_n, a.streams_rounds = min(a.streams_n, 1000), min(a.streams_rounds, 2)
    scenarios = [s for s in a.scenarios.split(",") if s]
    names = [t for t in a.targets.split(",") if t]
    for x in scenarios:
        if x not in ORDER:
            ap.error(f"unknown scenario {x!r}")
    for x in names:
        if x not in TARGETS:
            ap.error(f"unknown target {x!r}")
    if any(s in DIALECT_RATIOS for s in scenarios) and "st64_c16" not in scenarios:
        scenarios.append("st64_c16")  # their ratio to chat completions needs chat measured in the same run
        print("bench: st64_c16 added: the dialect ratios compare against chat from the same run", flush=True)
    scenarios = [s for s in ORDER if s in scenarios]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by everything we start
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    ctx = Ctx(a)
    own_nice = ps.set_autogroup_nice("self", a.nice) if a.nice else None
    skipped = {}
    if "litellm" in names and not tg.litellm_available():
        skipped["litellm"] = f"not installed ({tg.LITELLM_VENV}/bin/litellm missing; set LITELLM_VENV)"
    if "naive" in names and not tg.naive_available():
        skipped["naive"] = f"no venv at {tg.NAIVE_VENV} (bench/run.sh creates it)"
    if "smg" in names and not tg.smg_available():
        skipped["smg"] = f"not installed ({tg.SMG_VENV}/bin/smg missing; bench/run.sh installs it from PyPI)"
    data: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": " ".join(sys.argv),
        "versions": versions(ctx),
        "config": {
            "duration": a.duration,
            "warmup": a.warmup,
            "quick": a.quick,
            "scenarios": scenarios,
            "targets": names,
            "nice": a.nice,
            "max_noise": a.max_noise,
            "st_tokens": ST_TOKENS,
            "tpot_ms": 1.0,
            "rss1k": {"n": RSS1K_N, "tpot_ms": RSS1K_TPOT_MS},
            "profile": a.profile,
            "board": board.config(a),
        },
        "skipped": skipped,
        "results": {},
    }
    out = RESULTS / f"run-{ctx.stamp}.json"
    t_start = time.time()
    held = contextlib.ExitStack()
    try:
        idle = held.enter_context(cpu_idle.held_latency(a.cpu_latency_us))
        data["config"]["cpu_idle"] = {"latency_request": idle, "driver": cpu_idle.idle_driver()}
        print(f"bench: CPU idle: {idle} (cpuidle {data['config']['cpu_idle']['driver']})", flush=True)
        ctx.engine_ports = [ps.free_port(), ps.free_port()]
        cmd = (
            f"{tg.PROJECT_PY} {BENCH}/fake_engine.py --port {ctx.engine_ports[0]},{ctx.engine_ports[1]} "
            f"--tokens {ST_TOKENS} --tpot-ms 1"
        )
        ctx.engine = ps.Proc(cmd, LOAD_CPU, dict(os.environ), ctx.dir / "engine.log", ctx.nice)
        if not ps.wait_until(lambda: not ps.port_free(ctx.engine_ports[1]), 15):
            raise RuntimeError("the fake engine did not start; see " + str(ctx.dir / "engine.log"))
        per_target = [s for s in scenarios if s != "streams"]
        for name in names:
            if name in skipped:
                print(f"[{time.time() - t_start:4.0f}s] {name}: skipped, {skipped[name]}", flush=True)
                continue
            print(f"[{time.time() - t_start:4.0f}s] {name}", flush=True)
            # one gateway process (one pstats file) per scenario; gateway-minimal runs unprofiled
            if a.profile == "cprofile" and name == "gateway":
                merged: dict = {"target": name, "scenarios": {}}
                for scn in per_target:
                    r = bench_target(ctx, name, [scn])
                    merged["scenarios"].update(r["scenarios"])
                    merged.setdefault("error", r.get("error"))
                data["results"][name] = merged
            else:
                data["results"][name] = bench_target(ctx, name, per_target)
            out.write_text(json.dumps(data, indent=1))
        if "streams" in scenarios and any(g in names for g in GATEWAYS):
            print(f"[{time.time() - t_start:4.0f}s] streams.py (gateway)", flush=True)
            data["streams"] = run_streams(ctx)
    finally:
        held.close()
        if ctx.engine:
            ctx.engine.stop()
        if own_nice is not None:
            ps.set_autogroup_nice("self", own_nice)
    data["total_s"] = round(time.time() - t_start)
    out.write_text(json.dumps(data, indent=1))
    print(table(data))
    print(f"\nresults: {out} (logs, configs{', profiles' if a.profile else ''}: {ctx.dir}/)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
