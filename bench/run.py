#!/usr/bin/env python3
"""llm-gateway performance bench: the gateway against the engine alone, a naive FastAPI + httpx proxy and
LiteLLM, measured in one run against the same fake engine, printed as one markdown table with the
project's targets next to the numbers. See bench/README.md.

Pinning: the target on CPU 0 (`taskset -c 0`); fake engine, load generators and this script on CPU 1.
Everything we start runs at `--nice` in its own session, whose autogroup gets the same nice.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import board
import procstat as ps
import report
import stream_client as sc
import targets as tg

BENCH = tg.BENCH
RESULTS = BENCH / "results"
PROXY_CPU, LOAD_CPU = "0", "1"
TARGETS = ("direct", "gateway", "smg", "aiohttp", "naive", "litellm")
# the public boards' scenarios (board.py) run after the repository's own, on the same target process
ORDER = ("rss_idle", "ns_c1", "ns_c64", "st64_c16", "msg64_c16", "resp64_c16", "rss_1k", *board.SCENARIOS, "streams")
DEFAULT_SCENARIOS = ("rss_idle", "ns_c1", "ns_c64", "st64_c16", "msg64_c16", "resp64_c16", "rss_1k", "streams")
LOAD = {
    "ns_c1": ("wrk", 1),
    "ns_c64": ("wrk", 64),
    "st64_c16": ("stream", 16),
    "msg64_c16": ("stream", 16),
    "resp64_c16": ("stream", 16),
}
# the API each streaming scenario speaks (stream_client.py --dialect); the same engine stream behind each
DIALECT = {"st64_c16": "chat", "msg64_c16": "messages", "resp64_c16": "responses"}
# scenarios only the gateway serves: the engine, the naive proxy and the LiteLLM setup here speak chat only
GATEWAY_ONLY = {"msg64_c16": "Anthropic's /v1/messages", "resp64_c16": "OpenAI's /v1/responses"}
ST_TOKENS = 64  # st64: tokens per stream, one per --tpot-ms (1 ms) from the engine
RSS1K_N, RSS1K_TPOT_MS = 1000, 1000  # rss_1k: 1,000 held streams, one token a second each


class Ctx:
    """Run-wide settings and state."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.nice = a.nice
        self.stamp = time.strftime("%Y%m%d-%H%M%S")
        self.dir = RESULTS / f"run-{self.stamp}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.engine: ps.Proc | None = None
        self.engine_ports: list[int] = []
        self.retries_left = a.max_retries_total
        self.current_scenario = ""
        self.current_target = ""

    def load_cmd(self, argv: list[str]) -> list[str]:
        cmd = ["taskset", "-c", LOAD_CPU, *argv]
        return ["nice", "-n", str(self.nice), *cmd] if self.nice else cmd

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.engine_ports[0]}"


# ---------- load generators (CPU 1) ----------
def run_wrk(ctx: Ctx, url: str, conc: int, dur: float) -> dict:
    argv = ["wrk", "-t1", f"-c{conc}", f"-d{max(1, round(dur))}s", "--timeout=10s", "-s", str(BENCH / "post.lua")]
    argv += [url, "--", str(BENCH / "request.json")]
    out = subprocess.run(
        ctx.load_cmd(argv), capture_output=True, text=True, timeout=dur + 60, env=tg.target_env()
    ).stdout
    line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError("wrk gave no result:\n" + out[-2000:])
    w = json.loads(line[8:])
    wall = w["duration_us"] / 1e6
    ms = (lambda k: w[k] / 1e3) if w["requests"] else (lambda k: None)  # no request completed: no latency
    return {
        "requests": w["requests"],
        "wall_s": wall,
        "errors": sum(w[k] for k in w if k.startswith("err_")),
        "rps": w["requests"] / wall,
        "p50": ms("p50_us"),
        "p90": ms("p90_us"),
        "p99": ms("p99_us"),
    }


def run_stream(ctx: Ctx, url: str, conc: int, dur: float, tokens: int, dialect: str = "chat") -> dict:
    argv = [tg.PROJECT_PY, str(BENCH / "stream_client.py"), url, "--body", str(BENCH / "request.json")]
    argv += ["-c", str(conc), "-d", str(dur), "--tokens", str(tokens), "--dialect", dialect]
    argv += ["--expect-deltas", str(tokens)]  # the engine sends exactly `tokens` tokens: fewer deltas = broken
    p = subprocess.run(ctx.load_cmd(argv), capture_output=True, text=True, timeout=dur + 120, env=tg.target_env())
    line = next((x for x in p.stdout.splitlines() if x.startswith("STREAMJSON ")), None)
    if line is None:
        raise RuntimeError("stream client gave no result:\n" + (p.stdout + p.stderr)[-2000:])
    s = json.loads(line[11:])
    wall = s["duration_us"] / 1e6
    ms = (lambda k: s[k] / 1e3) if s["requests"] else (lambda k: None)  # no stream completed: no latency
    return {
        "requests": s["requests"],
        "wall_s": wall,
        "errors": s["errors"],
        "error_kinds": s["error_kinds"],
        "deltas": s["deltas_total"],  # token deltas relayed, good streams only
        "deltas_per_stream": s["deltas_median"],
        "frames_per_stream": s["frames_median"],
        "rps": s["requests"] / wall,
        "p50": ms("p50_us"),
        "p90": ms("p90_us"),
        "p99": ms("p99_us"),
        "ttft_p50": ms("ttft_p50_us"),
        "ttft_p90": ms("ttft_p90_us"),
        "ttft_p99": ms("ttft_p99_us"),
    }


# ---------- one measured window ----------
def measure(
    ctx: Ctx, name: str, kind: str, url: str, conc: int, pid: int | None, sampler: ps.Sampler | None, dialect: str
) -> dict:
    a = ctx.a

    def own() -> float:  # CPU of everything we run on LOAD_CPU: this script, its children, the engine
        ru = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
        return sum(r.ru_utime + r.ru_stime for r in ru) + ps.tree_cpu_s(ctx.engine.pid)

    if sampler:
        sampler.window()
    w0 = ps.tree_wait_s(pid) if pid else 0.0
    c0, t0, o0 = ps.cpu_times(), (ps.tree_cpu_s(pid) if pid else 0.0), own()
    prof = start_profile(ctx, name, pid, a.duration) if pid and name == "gateway" and a.profile == "py-spy" else None
    th0 = ps.thread_cpu(ps.main_pid(pid)) if prof else {}
    if kind == "wrk":
        r = run_wrk(ctx, url, conc, a.duration)
    else:
        r = run_stream(ctx, url, conc, a.duration, ST_TOKENS, dialect)
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


def load_scenario(ctx: Ctx, name: str, scn: str, base: str, pid: int | None, sampler: ps.Sampler | None) -> dict:
    a = ctx.a
    kind, conc = LOAD[scn]
    dialect = DIALECT.get(scn, "chat")
    url = base + sc.PATHS[dialect]
    if scn in GATEWAY_ONLY and name != "gateway":
        why = f"gateway only: {name} is not set up to serve {GATEWAY_ONLY[scn]} in this bench"
        print(f"    {scn:>9}: skipped, {why}", flush=True)
        return {"skipped": why}
    if dialect != "chat":
        why = dialect_smoke(url, dialect)
        if why:  # e.g. the endpoint is not there (yet): say so instead of timing a stream of 404s
            print(f"    {scn:>9}: unavailable, {why}", flush=True)
            return {"unavailable": why}
    if a.warmup > 0:  # the same load, unrecorded: lazy imports, pools grown to this concurrency
        if kind == "wrk":
            run_wrk(ctx, url, conc, a.warmup)
        else:
            run_stream(ctx, url, conc, a.warmup, ST_TOKENS, dialect)
    best: dict | None = None
    for tries in range(1, a.retries + 2):  # re-measure (bounded) while other processes got in the way
        r = measure(ctx, name, kind, url, conc, pid, sampler, dialect)
        r["tries"] = tries
        if best is None or r["noise_pct"] < best["noise_pct"]:
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


# ---------- profiling (gateway only) ----------
def start_profile(ctx: Ctx, name: str, pid: int, dur: float) -> tuple | None:
    spy = BENCH / ".venvs" / "tools" / "bin" / "py-spy"
    if not spy.exists():
        print("    (py-spy not installed: run bench/profile.sh, which installs it)", flush=True)
        return None
    scn = ctx.current_scenario
    outs = (ctx.dir / f"profile-{scn}.svg", ctx.dir / f"profile-{scn}.collapsed.txt")
    procs = []
    for fmt, out in zip(("flamegraph", "raw"), outs, strict=True):
        # blocking (py-spy pauses the target per sample, ~1-2 % overhead at 200 Hz): --nonblocking reads a
        # running process and half its stacks came back truncated or with a wrong leaf
        argv = [str(spy), "record", "--pid", str(ps.main_pid(pid)), "--rate", "200"]
        if os.environ.get("PYSPY_NATIVE") == "1":
            argv.append("--native")  # C frames too: GC, libuv, refcounting; slower sampling
        argv += ["--format", fmt, "-o", str(out), "--duration", str(max(1, round(dur)))]
        procs.append(subprocess.Popen(ctx.load_cmd(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    return procs, outs, scn


def finish_profile(procs: list[subprocess.Popen], outs: tuple[Path, Path], scn: str, threads: dict) -> dict:
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()  # our own child
    svg, raw = outs
    if not raw.exists():
        return {"error": "py-spy wrote nothing"}
    import profile_report

    top = raw.with_name(f"profile-{scn}-top.txt")
    note = "CPU seconds per thread in that window, from /proc: " + ", ".join(f"{k} {v}" for k, v in threads.items())
    top.write_text(profile_report.from_collapsed(raw.read_text(), title=f"gateway, {scn}, py-spy", threads_note=note))
    return {"svg": str(svg), "collapsed": str(raw), "top": str(top)}


# ---------- one target ----------
def start_target(ctx: Ctx, name: str, cmd: str, port: int, log: Path) -> tuple[ps.Proc, float]:
    if not ps.port_free(port):
        raise RuntimeError(f"port {port} already in use")
    config = tg.write_gateway_config(ctx.dir / "gateway.yaml", [f"http://127.0.0.1:{p}" for p in ctx.engine_ports])
    litellm_config = tg.write_litellm_config(ctx.dir / "litellm.yaml")
    full = cmd.format(
        py=tg.PROJECT_PY,
        config=config,
        litellm_config=litellm_config,
        port=port,
        upstream=ctx.upstream,
        aux_port=ps.free_port(),
        upstream_v1=ctx.upstream + "/v1",
        bench=BENCH,
        repo=tg.REPO,
    )
    env = {
        **tg.target_env(),
        "PORT": str(port),
        "UPSTREAM_URL": ctx.upstream,
        "UPSTREAM_API_BASE": ctx.upstream + "/v1",
        "GATEWAY_CONFIG": str(config),
    }
    proc = ps.Proc(full, PROXY_CPU, env, log, ctx.nice)
    t0 = time.monotonic()
    base = f"http://127.0.0.1:{port}"
    while time.monotonic() - t0 < ctx.a.start_timeout:
        if not proc.alive():
            raise RuntimeError(f"exited with {proc.p.returncode} during start-up; see {log}")
        try:
            if post(base, {"stream": False}, 5)[0] == 200:
                return proc, time.monotonic() - t0
        except Exception:  # not up yet
            pass
        time.sleep(0.25)
    proc.stop()
    raise RuntimeError(f"not ready after {ctx.a.start_timeout} s; see {log}")


def post(base: str, changes: dict, timeout: float = 30) -> tuple[int, bytes]:
    body = json.loads((BENCH / "request.json").read_bytes())
    body.update(changes)
    hdrs = {"Content-Type": "application/json", "Authorization": "Bearer " + tg.API_KEY}
    return ps.http(base + "/v1/chat/completions", json.dumps(body).encode(), hdrs, timeout)


def dialect_smoke(url: str, dialect: str, tokens: int = 8) -> str | None:
    """One short stream in `dialect`, read whole and checked as the stream client checks one: None if it
    is good, else why not (status and the start of the body: a 404 says the endpoint is not there)."""
    chat = json.loads((BENCH / "request.json").read_bytes())
    body = json.dumps(sc.dialect_body(chat, dialect, tokens)).encode()
    req = urllib.request.Request(url, body, sc.request_headers(dialect, tg.API_KEY))
    path = "/" + url.split("/", 3)[3]
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            msg = json.loads(raw)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            msg = raw[:200].decode(errors="replace")
        return f"POST {path} answered {e.code}: {msg}"
    except OSError as e:
        return f"POST {path} failed: {type(e).__name__}: {e}"
    sse = sc.SSEReader(dialect)
    sse.feed(raw)
    kind = sse.finish()
    if status != 200 or kind or sse.deltas != tokens:
        got = f"{kind or 'ok'}, {sse.deltas} token deltas for {tokens}"
        return f"POST {path} answered {status} ({got}): {raw[-200:].decode(errors='replace')}"
    return None


def smoke(base: str) -> str:
    st, raw = post(base, {"stream": False})
    j = json.loads(raw)
    if st != 200 or not j["choices"][0]["message"]["content"] or not j.get("usage"):
        raise RuntimeError(f"non-streaming smoke request failed: {st} {raw[:300]!r}")
    st, raw = post(base, {"stream": True, "max_tokens": 8})
    if st != 200 or b"data: [DONE]" not in raw:
        raise RuntimeError(f"streaming smoke request failed: {st} {raw[-300:]!r}")
    return f"non-stream ok, stream ok ({raw.count(b'data:')} SSE events for 8 tokens)"


def bench_target(ctx: Ctx, name: str, scenarios: list[str]) -> dict:
    a = ctx.a
    res: dict = {"target": name, "scenarios": {}}
    ctx.current_target = name
    cmd = tg.target_command(name, a.gateway_cmd)
    if a.profile == "cprofile" and name == "gateway":
        pstats = ctx.dir / f"profile-{scenarios[-1]}.pstats"
        serve = "-m llm_gateway serve --config {config} --host 127.0.0.1 --port {port}"
        cmd = f"{{py}} -m cProfile -o {pstats} " + serve
        res["pstats"] = str(pstats)
    res["command"] = cmd
    proc = sampler = None
    pid = None
    try:
        if cmd is None:
            base = ctx.upstream
        else:
            port = ps.free_port()
            base = f"http://127.0.0.1:{port}"
            proc, res["startup_s"] = start_target(ctx, name, cmd, port, ctx.dir / f"{name}.log")
            pid = proc.pid
            sampler = ps.Sampler(pid)
            sampler.start()
        res["smoke"] = smoke(base)
        # warm-up: both kinds of request, a little concurrency (pools, lazy imports, caches)
        run_wrk(ctx, base + "/v1/chat/completions", 8, 1)
        run_stream(ctx, base + "/v1/chat/completions", 4, 1, 16)
        if "rss_idle" in scenarios and pid:
            time.sleep(1.0)
            res["scenarios"]["rss_idle"] = {"rss_mb": ps.tree_rss_kb(pid) / 1024, "fds": ps.tree_fds(pid)}
            print(f"    rss_idle: {res['scenarios']['rss_idle']['rss_mb']:.1f} MB", flush=True)
        for scn in scenarios:
            ctx.current_scenario = scn
            if scn in LOAD:
                res["scenarios"][scn] = load_scenario(ctx, name, scn, base, pid, sampler)
            elif scn in board.SCENARIOS:
                res["scenarios"][scn] = board.run_scenario(ctx, scn, base, pid, sampler, run_wrk)
            elif scn == "rss_1k" and pid and sampler:
                r = res["scenarios"][scn] = rss_1k(ctx, base, pid, sampler)
                print(
                    f"    rss_1k: {r['rss_mb']:.1f} MB with {r['open_at_once']}/{r['n']} open at once "
                    f"(all open after {r['all_open_s']} s); {r['requests']} completed, {r['errors']} errors "
                    f"{r['error_kinds'] or ''}",
                    flush=True,
                )
        if sampler and proc:
            res["peak_rss_mb"] = max(sampler.peak_kb, ps.hwm_kb(ps.main_pid(proc.pid))) / 1024
    except Exception as e:  # one broken target must not sink the run
        res["error"] = f"{type(e).__name__}: {e}"
        print(f"    {name}: FAILED {res['error'][:500]}", flush=True)
    finally:
        if sampler:
            sampler.stop()
        if proc:
            proc.stop()
    if res.get("pstats"):
        finish_cprofile(ctx, res, scenarios[-1])
    return res


def finish_cprofile(ctx: Ctx, res: dict, scn: str) -> None:
    import profile_report

    pstats = Path(res["pstats"])
    if not pstats.exists():
        res["profile_error"] = "no pstats file (the gateway did not exit cleanly)"
        return
    top = ctx.dir / f"profile-{scn}-top.txt"
    top.write_text(profile_report.from_pstats(pstats, title=f"gateway, {scn}, cProfile"))
    res["scenarios"].setdefault(scn, {})["profile"] = {"pstats": str(pstats), "top": str(top)}


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
    if any(s in GATEWAY_ONLY for s in scenarios) and "st64_c16" not in scenarios:
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
    try:
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
            if a.profile == "cprofile" and name == "gateway":  # one gateway process (one pstats file) per scenario
                merged: dict = {"target": name, "scenarios": {}}
                for scn in per_target:
                    r = bench_target(ctx, name, [scn])
                    merged["scenarios"].update(r["scenarios"])
                    merged.setdefault("error", r.get("error"))
                data["results"][name] = merged
            else:
                data["results"][name] = bench_target(ctx, name, per_target)
            out.write_text(json.dumps(data, indent=1))
        if "streams" in scenarios and "gateway" in names:
            print(f"[{time.time() - t_start:4.0f}s] streams.py (gateway)", flush=True)
            data["streams"] = run_streams(ctx)
    finally:
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
