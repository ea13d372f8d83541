"""The repository's own scenarios against one running target: one measured window (`measure`: the load,
the CPU and wait accounting per CPU, the noise estimate, the RSS peak), a load scenario with its warm-up
and bounded re-measuring while others got in the way (`load_scenario`), and `rss_1k` (RSS while 1,000
streams are held open by the engine). The public boards' scenarios are board.py's.
"""

from __future__ import annotations

import json
import resource
import subprocess
import time
from pathlib import Path

import procstat as ps
import report
import stream_client as sc
import targets as tg
from load_generators import run_stream, run_wrk
from run_context import (
    AGENT,
    BENCH,
    DIALECT,
    GATEWAY_ONLY,
    GATEWAYS,
    LOAD,
    LOAD_CPU,
    PROXY_CPU,
    RSS1K_N,
    RSS1K_TPOT_MS,
    ST_TOKENS,
    Ctx,
)
from run_profiling import finish_profile, start_profile
from smoke_checks import body_smoke, dialect_smoke


def measure(
    ctx: Ctx,
    name: str,
    kind: str,
    url: str,
    conc: int,
    pid: int | None,
    sampler: ps.Sampler | None,
    dialect: str,
    body: Path | None = None,
) -> dict:
    a = ctx.a

    def own() -> float:  # CPU of everything we run on LOAD_CPU: this script, its children, the engine
        ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(r.ru_utime + r.ru_stime for r in ru) + ps.tree_cpu_s(ctx.engine.pid)

    if sampler:
        sampler.window()
    w0 = ps.tree_wait_s(pid) if pid else 0.0
    c0, t0, o0 = ps.cpu_times(), (ps.tree_cpu_s(pid) if pid else 0.0), own()
    prof = (
        start_profile(ctx, name, pid, a.duration)
        if pid and name.startswith("gateway") and a.profile == "py-spy"
        else None
    )
    th0 = ps.thread_cpu(ps.main_pid(pid)) if prof else {}
    if kind == "wrk":
        r = run_wrk(ctx, url, conc, a.duration, body)
    else:
        r = run_stream(ctx, url, conc, a.duration, ST_TOKENS, dialect, body)
    c1, t1, o1 = ps.cpu_times(), (ps.tree_cpu_s(pid) if pid else 0.0), own()
    w1 = ps.tree_wait_s(pid) if pid else 0.0
    if prof:
        th1 = ps.thread_cpu(ps.main_pid(pid))
        cpu_by_thread = {k: round(v - th0.get(k, 0.0), 2) for k, v in th1.items()}
        r["profile"] = finish_profile(*prof, cpu_by_thread)
    cpu_s = t1 - t0
    wall = r["wall_s"]
    r["cpu_pct"] = 100.0 * cpu_s / wall if pid else None
    r["cpu_us_per_req"] = 1e6 * cpu_s / r["requests"] if pid and r["requests"] else None
    if kind == "stream" and r["cpu_us_per_req"] is not None:
        r["cpu_us_per_chunk"] = r["cpu_us_per_req"] / ST_TOKENS  # the engine writes one chunk per token
    if kind == "stream" and pid and r.get("deltas"):
        # per relayed token delta (good streams only: a broken stream adds CPU, never events), comparable
        # across dialects: each frames the same engine tokens its own way, with its own per-stream frames
        r["cpu_us_per_event"] = 1e6 * cpu_s / r["deltas"]
    r["cpu0_other_pct"] = max(0.0, ps.busy_pct(c0, c1, PROXY_CPU) - (r["cpu_pct"] or 0.0))
    r["cpu1_pct"] = ps.busy_pct(c0, c1, LOAD_CPU)
    r["cpu1_other_pct"] = max(0.0, r["cpu1_pct"] - 100.0 * (o1 - o0) / wall)
    r["wait_pct"] = 100.0 * (w1 - w0) / wall if pid else None
    # noise = how much others got in the way: the target waiting for CPU 0 (it is alone there, so any wait
    # is someone else's; min() because a multi-threaded target also waits on its own threads), or others
    # taking CPU 1 from the load generators and the engine; direct wrk saturates CPU 1, so there it is the
    # share others took of CPU 1; direct streaming is paced by the engine's token clock: never re-measured.
    if pid:
        r["noise_pct"] = max(min(r["wait_pct"], r["cpu0_other_pct"]), r["cpu1_other_pct"])
    else:
        r["noise_pct"] = r["cpu1_other_pct"] if kind == "wrk" else 0.0
    r["rss_mb"] = max(sampler.win_peak_kb, ps.tree_rss_kb(pid)) / 1024 if sampler and pid else None
    return r


#: the engine alone at concurrency 1: the floor every proxy's added latency is measured from (report.py,
#: board_report.py subtract its p50 and p99), so a tail of its own (a host interrupt in 5 s of 30,000 req/s)
#: would be taken off every proxy's; it is measured every try allowed and the lowest p99 kept
FLOOR = {("direct", "ns_c1")}


def load_scenario(ctx: Ctx, name: str, scn: str, base: str, pid: int | None, sampler: ps.Sampler | None) -> dict:
    a = ctx.a
    floor = (name, scn) in FLOOR
    kind, conc = LOAD[scn]
    dialect = DIALECT.get(scn, "chat")
    url = base + sc.PATHS[dialect]
    body = ctx.agent_bodies[dialect] if scn in AGENT else None
    if scn in GATEWAY_ONLY and name not in GATEWAYS:
        why = f"gateway only: {name} is not set up to serve {GATEWAY_ONLY[scn]} in this bench"
        print(f"    {scn:>9}: skipped, {why}", flush=True)
        return {"skipped": why}
    why = dialect_smoke(url, dialect) if dialect != "chat" else None
    if body is not None and not why:
        why = body_smoke(url, body)
    if why:  # e.g. the endpoint is not there (yet): say so instead of timing a stream of 404s
        print(f"    {scn:>9}: unavailable, {why}", flush=True)
        return {"unavailable": why}
    if a.warmup > 0:  # the same load, unrecorded: lazy imports, pools grown to this concurrency
        if kind == "wrk":
            run_wrk(ctx, url, conc, a.warmup, body)
        else:
            run_stream(ctx, url, conc, a.warmup, ST_TOKENS, dialect, body)
    best: dict | None = None
    for tries in range(1, a.retries + 2):  # re-measure (bounded) while other processes got in the way
        r = measure(ctx, name, kind, url, conc, pid, sampler, dialect, body)
        r["tries"] = tries
        if best is None or (r["p99"] < best["p99"] if floor else r["noise_pct"] < best["noise_pct"]):
            best = r
        extra = f"  ttft p50 {report.fmt(r['ttft_p50'], 2)} ms" if "ttft_p50" in r else ""
        cpu = f"  {r['cpu_us_per_req']:,.0f} us/req" if r.get("cpu_us_per_req") else ""
        if r.get("cpu_us_per_event"):
            cpu += f" {r['cpu_us_per_event']:.1f} us/event"
        print(
            f"    {scn:>9}: {r['rps']:9,.0f} req/s  p50 {report.fmt(r['p50'], 2):>7}  "
            f"p99 {report.fmt(r['p99'], 2):>7} ms{extra}{cpu}  err {r['errors']}  noise {r['noise_pct']:.0f}%",
            flush=True,
        )
        if floor:
            continue  # every try, out of no one's retry budget: a few seconds of the engine alone
        if r["noise_pct"] <= a.max_noise or ctx.retries_left <= 0 or a.profile:
            break
        ctx.retries_left -= 1
    assert best is not None
    best["tries"] = tries
    return best


def rss_1k(ctx: Ctx, base: str, pid: int, sampler: ps.Sampler) -> dict:
    """RSS while 1,000 streams are open at once, each sending one token a second (held by the engine)."""
    a = ctx.a
    ramp_limit = 30.0 if a.quick else 60.0
    argv = [tg.PROJECT_PY, str(BENCH / "stream_client.py"), base + "/v1/chat/completions", "--hold", str(RSS1K_N)]
    hold = f"rss1k-{ctx.current_target}-{ctx.stamp}"
    argv += ["--engine-hold", hold, "--tokens", "2", "--tpot-ms", str(RSS1K_TPOT_MS), "--open-rate", "500"]
    argv += ["--timeout", str(ramp_limit + 120), "--deadline", str(ramp_limit + 130), "--local-addr", "127.0.0.2"]
    sampler.window()
    cpu0 = ps.tree_cpu_s(pid)
    t0 = time.monotonic()
    log = (ctx.dir / "rss_1k-client.log").open("wb")
    p = subprocess.Popen(ctx.load_cmd(argv), stdout=subprocess.PIPE, stderr=log, env=tg.target_env(), text=True)
    assert p.stdout is not None
    lines: list[str] = []
    all_open = None
    best, t_best = -1, time.monotonic()
    while time.monotonic() - t0 < ramp_limit:  # the client prints a line a second, then ALLOPEN
        line = p.stdout.readline() if p.poll() is None else ""
        if not line:
            break
        lines.append(line.strip())
        if line.startswith("ALLOPEN"):
            all_open = time.monotonic() - t0
            break
        if line.startswith("OPEN "):
            now_open = int(line.split()[1])
            if now_open > best:
                best, t_best = now_open, time.monotonic()
            elif time.monotonic() - t_best > 10:  # no more streams got open in 10 s: the target is stuck
                break
    at_open_mb = ps.tree_rss_kb(pid) / 1024
    time.sleep(2.0 if a.quick else 4.0)  # all open, all streaming
    rss_mb = max(sampler.win_peak_kb, ps.tree_rss_kb(pid)) / 1024
    released = json.loads(ps.http(ctx.upstream + f"/fake/release?hold={hold}", b"", timeout=10)[1])["held"]
    try:
        out = p.communicate(timeout=ramp_limit + 140)[0]
    except subprocess.TimeoutExpired:
        p.kill()  # our own child
        out = p.communicate(timeout=30)[0]
    log.close()
    lines += out.splitlines()
    line = next((x for x in lines if x.startswith("HOLDJSON ")), None)
    h = json.loads(line[9:]) if line else {"requests": 0, "errors": 1, "error_kinds": {"no_output": 1}}
    return {
        "n": RSS1K_N,
        "open_at_once": h.get("peak_open", 0),
        "all_open_s": round(all_open, 1) if all_open is not None else None,
        "rss_mb": rss_mb,
        "rss_at_all_open_mb": at_open_mb,
        "released": released,
        "requests": h["requests"],
        "errors": h["errors"],
        "error_kinds": h.get("error_kinds", {}),
        "ttft_p50": h.get("ttft_p50_us", 0) / 1e3,
        "ttft_p99": h.get("ttft_p99_us", 0) / 1e3,
        "cpu_s": ps.tree_cpu_s(pid) - cpu0,
    }
