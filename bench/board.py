"""The public boards' scenarios (GetBusbar/benchmarking, BerriAI/ai-gateway-bench), run by bench/run.py on the
same target process as the repository's own scenarios, with the load from board_client.py on the load core.

- `frontier`: the throughput frontier. Open-loop non-streaming load at fixed rates, stepped up (each step
  --frontier-step-s after 0.5 s unrecorded at the same rate) until a step is not sustained (< 99 % answered
  in time, or > 0.1 % errors) or its p99 passes the largest bound; per bound (1, 5, 10, 50 ms) the highest
  sustained req/s whose p99 stayed under it. CPU µs per request per step.
- `pace20_c16`: 16 streams back to back against the engine paced at 20 ms per token, 64 tokens: TTFT and the
  inter-event gap (p50/p99) a client sees; report.py subtracts direct's ("added").
- `stall20`: the most concurrent paced streams (20 ms per token) with no stall (a gap over 10x the pace) and
  no lost frame, stepped up (--stall-steps) and stopped at the first failing step; each step opens its N
  streams at a paced rate, with enough tokens that all N are open at once for --stall-hold-s. A proxy holds
  2 fds per stream: steps above the target's fd limit are not run, the cap is reported with RSS per stream.
- `rss_plateau`: RSS idle, peak under load (wrk c64 for --duration), and after: sampled every 0.5 s until two
  samples agree within 1 % (at most 10 s), the plateau the process settles on.
- `st_split` (not a board's, the repository's own reading of "CPU per streamed event"): st64_c16's load (16
  streams back to back on keep-alive connections, 1 ms per token) once with 8 tokens and once with 128,
  --duration each after 1 s unrecorded; the target's CPU per stream at the two lengths gives its marginal
  CPU per token (the slope) and its fixed CPU per stream (setup, the first and last events, accounting: the
  intercept). st64_c16's figure is about fixed / 64 + marginal, so this says which of the two a gap to
  another proxy is in.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import resource
import subprocess
import time
from collections.abc import Callable
from typing import Any

import procstat as ps
import targets as tg

SCENARIOS = ("frontier", "pace20_c16", "stall20", "rss_plateau", "st_split")
BOUNDS_MS = (1, 5, 10, 50)
DEFAULT_RATES = "250,500,1000,1500,2000,2500,3000,3500,4000,5000,6000,8000,10000"
PACE_MS, PACE_TOKENS, PACE_C = 20.0, 64, 16
STALL_FACTOR = 10  # a gap over 10x the pace is a stall (the board's rule)
PROXY_FDS_PER_STREAM = 2  # client side + upstream side
SPLIT_TOKENS, SPLIT_C, SPLIT_TPOT_MS = (8, 128), 16, 1.0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--frontier-rates", default=DEFAULT_RATES, help="frontier: req/s steps, ascending")
    ap.add_argument("--frontier-step-s", type=float, default=2.0, help="frontier: measured seconds per step")
    ap.add_argument("--stall-steps", default="100,250,500,1000,3000,10000", help="stall20: concurrent streams steps")
    ap.add_argument("--stall-tpot-ms", type=float, default=PACE_MS, help="stall20: the engine's pace")
    ap.add_argument("--stall-hold-s", type=float, default=3.0, help="stall20: seconds all N streams are open")


def config(a: argparse.Namespace) -> dict[str, Any]:
    return {
        "frontier_rates": [float(x) for x in a.frontier_rates.split(",")],
        "frontier_step_s": a.frontier_step_s,
        "bounds_ms": list(BOUNDS_MS),
        "pace": {"tpot_ms": PACE_MS, "tokens": PACE_TOKENS, "concurrency": PACE_C},
        "stall": {"steps": [int(x) for x in a.stall_steps.split(",")], "tpot_ms": a.stall_tpot_ms},
    }


def _client(ctx: Any, argv: list[str], marker: str, timeout: float) -> dict[str, Any]:
    script = [tg.PROJECT_PY, str(tg.BENCH / "board_client.py")]
    cmd = ctx.load_cmd([*script, *argv, "--body", str(tg.BENCH / "request.json")])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=tg.target_env())
    line = next((x for x in p.stdout.splitlines() if x.startswith(marker + " ")), None)
    if line is None:
        raise RuntimeError("board_client gave no result:\n" + (p.stdout + p.stderr)[-2000:])
    out: dict[str, Any] = json.loads(line[len(marker) + 1 :])
    return out


def _measured(pid: int | None, fn: Callable[[], dict[str, Any]]) -> tuple[dict[str, Any], float | None, float]:
    """Run fn; return its result, the target's CPU seconds meanwhile (None for direct) and CPU 1's busy %."""
    c0, t0 = ps.cpu_times(), (ps.tree_cpu_s(pid) if pid else 0.0)
    r = fn()
    cpu = ps.tree_cpu_s(pid) - t0 if pid else None
    return r, cpu, ps.busy_pct(c0, ps.cpu_times(), "1")


def frontier(ctx: Any, url: str, pid: int | None) -> dict[str, Any]:
    a = ctx.a
    dur = min(a.frontier_step_s, a.duration)
    steps: list[dict[str, Any]] = []
    for rate in (float(x) for x in a.frontier_rates.split(",")):
        argv = ["rate", url, "--rate", f"{rate:g}", "-d", f"{dur:g}", "--warmup", "0.5", "--timeout", "10"]
        r, cpu, cpu1 = _measured(pid, functools.partial(_client, ctx, argv, "RATEJSON", dur + 60))
        wall = r["duration_us"] / 1e6
        s = {
            "rate": rate,
            "rps": r["ok"] / wall if wall > 0 else 0.0,
            "p50": r["p50_us"] / 1e3,
            "p99": r["p99_us"] / 1e3,
            "errors": r["errors"],
            "unfinished": r["unfinished"],
            "conns": r["conns"],
            "cpu_us_per_req": 1e6 * cpu / r["ok_all"] if cpu is not None and r["ok_all"] else None,
            "cpu1_pct": cpu1,
            "lag_p99": r["dispatch_lag_p99_us"] / 1e3,
        }
        s["sustained"] = r["ok"] >= 0.99 * r["offered"] and r["errors"] <= 0.001 * r["offered"]
        steps.append(s)
        print(
            f"     frontier {rate:7,.0f}/s: {s['rps']:7,.0f} ok/s  p50 {s['p50']:6.2f}  p99 {s['p99']:7.2f} ms  "
            f"err {s['errors']}  cpu1 {cpu1:.0f}%"
            + (f"  {s['cpu_us_per_req']:.0f} us/req" if s["cpu_us_per_req"] else "")
            + ("" if s["sustained"] else "  NOT SUSTAINED"),
            flush=True,
        )
        if not s["sustained"] or s["p99"] > BOUNDS_MS[-1]:
            break
    best = {}
    for b in BOUNDS_MS:
        ok = [s for s in steps if s["sustained"] and s["p99"] < b]
        best[str(b)] = max((s["rps"] for s in ok), default=None)
    top = next((s for s in reversed(steps) if s["sustained"]), None)
    return {
        "steps": steps,
        "best_rps": best,
        "cpu_us_per_req": top["cpu_us_per_req"] if top else None,
        "errors": sum(s["errors"] for s in steps),
        "capped_by_rates": bool(steps) and steps[-1]["sustained"] and steps[-1]["p99"] <= BOUNDS_MS[-1],
    }


def pace(ctx: Any, url: str, pid: int | None) -> dict[str, Any]:
    a = ctx.a
    argv = ["streams", url, "-c", str(PACE_C), "-d", f"{a.duration:g}", "--tokens", str(PACE_TOKENS)]
    argv += ["--tpot-ms", f"{PACE_MS:g}", "--deadline", f"{a.duration + 60:g}"]
    r, cpu, cpu1 = _measured(pid, functools.partial(_client, ctx, argv, "STREAMSJSON", a.duration + 120))
    out = {k: r[k] / 1e3 for k in ("ttft_p50_us", "ttft_p99_us", "gap_p50_us", "gap_p99_us", "max_gap_us")}
    out = {k.replace("_us", ""): v for k, v in out.items()}
    events = r["streams"] * PACE_TOKENS
    out |= {"streams": r["streams"], "errors": r["errors"], "error_kinds": r["error_kinds"], "cpu1_pct": cpu1}
    out["cpu_us_per_event"] = 1e6 * cpu / events if cpu is not None and events else None
    print(
        f"    pace20_c16: {r['streams']} streams  TTFT p50 {out['ttft_p50']:.2f} p99 {out['ttft_p99']:.2f} ms  "
        f"gap p50 {out['gap_p50']:.2f} p99 {out['gap_p99']:.2f} ms  err {r['errors']}",
        flush=True,
    )
    return out


def stall(ctx: Any, url: str, pid: int | None, sampler: ps.Sampler | None) -> dict[str, Any]:
    a = ctx.a
    tpot = a.stall_tpot_ms
    if pid:
        main = ps.main_pid(pid)
        hard = ps.fd_limits(main)[1]
        cap = (hard - ps.tree_fds(pid) - 200) // PROXY_FDS_PER_STREAM
    else:  # direct: the client holds one fd per stream, the engine one
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        cap = hard - 200
    steps: list[dict[str, Any]] = []
    capped = None
    for n in (int(x) for x in a.stall_steps.split(",")):
        if n > cap:
            capped = {"requested": n, "fd_hard_limit": hard, "cap": cap}
            print(f"     stall20 {n:,}: not run, the fd limit {hard:,} allows {cap:,} streams", flush=True)
            break
        open_rate = max(500.0, n / 5)
        tokens = math.ceil((n / open_rate + a.stall_hold_s) * 1e3 / tpot)
        argv = ["ramp", url, "--n", str(n), "--open-rate", f"{open_rate:g}", "--tokens", str(tokens)]
        limit = n / open_rate + tokens * tpot / 1e3 + 30
        argv += ["--tpot-ms", f"{tpot:g}", "--stall-ms", f"{STALL_FACTOR * tpot:g}", "--deadline", f"{limit:g}"]
        argv += ["--timeout", f"{limit:g}"]
        rss0 = ps.tree_rss_kb(pid) / 1024 if pid else None
        if sampler:
            sampler.window()
        r, cpu, cpu1 = _measured(pid, functools.partial(_client, ctx, argv, "STREAMSJSON", limit + 60))
        peak = max(sampler.win_peak_kb, ps.tree_rss_kb(pid)) / 1024 if sampler and pid else None
        s = {
            "n": n,
            "tokens": tokens,
            "ok": r["streams"],
            "stalled": r["stalled"],
            "errors": r["errors"],
            "error_kinds": r["error_kinds"],
            "peak_open": r["peak_open"],
            "max_gap": r["max_gap_us"] / 1e3,
            "ttft_p99": r["ttft_p99_us"] / 1e3,
            "cpu1_pct": cpu1,
            "cpu_us_per_event": 1e6 * cpu / (r["streams"] * tokens) if cpu is not None and r["streams"] else None,
            "rss_peak_mb": peak,
            "kb_per_stream": max(0.0, 1024 * (peak - rss0) / n) if peak is not None and rss0 is not None else None,
        }
        s["passed"] = s["ok"] == n and not s["stalled"] and not s["errors"] and s["peak_open"] == n
        steps.append(s)
        print(
            f"     stall20 {n:6,}: {s['ok']:,} ok, {s['stalled']} stalled (max gap {s['max_gap']:.0f} ms), "
            f"{s['errors']} errors {s['error_kinds'] or ''}, {s['peak_open']:,} open at once, cpu1 {cpu1:.0f}%"
            + (f", {s['kb_per_stream']:.0f} KB/stream" if s["kb_per_stream"] is not None else ""),
            flush=True,
        )
        if not s["passed"]:
            break
    return {
        "steps": steps,
        "max_streams": max((s["n"] for s in steps if s["passed"]), default=0),
        "fd_cap": capped,
        "errors": 0,  # failing streams are this scenario's result, not an error of the run
    }


def split_costs(points: dict[int, float]) -> tuple[float, float]:
    """(marginal CPU per token, fixed CPU per stream) through two (tokens per stream -> CPU per stream) points."""
    (lo, c_lo), (hi, c_hi) = sorted(points.items())
    per_token = (c_hi - c_lo) / (hi - lo)
    return per_token, c_lo - lo * per_token


def st_split(ctx: Any, url: str, pid: int | None, stream: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    if not pid:
        return {"skipped": "no target process (direct)"}
    a = ctx.a
    runs: dict[int, dict[str, Any]] = {}
    for n in SPLIT_TOKENS:  # the client and the engine's pace of st64_c16, two lengths
        stream(ctx, url, SPLIT_C, 1, n)  # unrecorded: pools grown, this length's bodies cached by the engine
        r, cpu, cpu1 = _measured(pid, functools.partial(stream, ctx, url, SPLIT_C, a.duration, n))
        if not r["requests"] or r["errors"] or cpu is None:
            raise RuntimeError(f"{n}-token streams: {r['requests']} good, {r['errors']} errors {r['error_kinds']}")
        runs[n] = {"streams": r["requests"], "cpu_us_per_stream": 1e6 * cpu / r["requests"], "cpu1_pct": cpu1}
    per_token, fixed = split_costs({n: x["cpu_us_per_stream"] for n, x in runs.items()})
    print(
        "    st_split: "
        + ", ".join(f"{n} tokens {x['cpu_us_per_stream']:,.0f} us/stream" for n, x in runs.items())
        + f": {per_token:.1f} us per token, {fixed:,.0f} us per stream fixed",
        flush=True,
    )
    return {
        "runs": {str(n): x for n, x in runs.items()},
        "cpu_us_per_token": per_token,
        "cpu_us_per_stream_fixed": fixed,
        "errors": 0,
    }


def rss_plateau(
    ctx: Any, url: str, pid: int | None, sampler: ps.Sampler | None, wrk: Callable[..., dict[str, Any]]
) -> dict[str, Any]:
    if not pid or not sampler:
        return {"skipped": "no target process (direct)"}
    idle = ps.tree_rss_kb(pid) / 1024
    sampler.window()
    w = wrk(ctx, url, 64, ctx.a.duration)
    peak = max(sampler.win_peak_kb, ps.tree_rss_kb(pid)) / 1024
    t_end, prev, after = time.monotonic() + 10, -1.0, 0.0
    while time.monotonic() < t_end:
        time.sleep(0.5)
        after = ps.tree_rss_kb(pid) / 1024
        if prev > 0 and abs(after - prev) <= 0.01 * prev:
            break
        prev = after
    print(f"    rss_plateau: idle {idle:.1f} MB, under load {peak:.1f} MB, after {after:.1f} MB", flush=True)
    return {"idle_mb": idle, "load_mb": peak, "after_mb": after, "load_rps": w["rps"], "errors": w["errors"]}


def run_scenario(
    ctx: Any,
    scn: str,
    base: str,
    pid: int | None,
    sampler: ps.Sampler | None,
    wrk: Callable[..., dict[str, Any]],
    stream: Callable[..., dict[str, Any]],
) -> dict[str, Any]:
    """One board scenario against the running target; `wrk` and `stream` are load_generators' run_wrk and
    run_stream (passed in: load_generators imports the run's tables, which import this module)."""
    url = base + "/v1/chat/completions"
    try:
        if scn == "frontier":
            return frontier(ctx, url, pid)
        if scn == "pace20_c16":
            return pace(ctx, url, pid)
        if scn == "stall20":
            return stall(ctx, url, pid, sampler)
        if scn == "rss_plateau":
            return rss_plateau(ctx, url, pid, sampler, wrk)
        if scn == "st_split":
            return st_split(ctx, url, pid, stream)
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:  # one scenario must not sink the target
        print(f"    {scn}: FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
        return {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    raise ValueError(f"unknown board scenario {scn!r}")
