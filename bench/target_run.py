"""One target through a bench run: start its process pinned to the proxy CPU and wait until it answers
(`start_target`), smoke-check and warm it, run every scenario asked for on that one process (the
repository's own from scenario_runs.py, the boards' from board.py), then stop it (`bench_target`).
One broken target is recorded as an error and does not sink the run.
"""

from __future__ import annotations

import time
from pathlib import Path

import board
import procstat as ps
import targets as tg
from load_generators import run_stream, run_wrk
from run_context import BENCH, GATEWAYS, LOAD, PROXY_CPU, Ctx
from run_profiling import finish_cprofile
from scenario_runs import load_scenario, rss_1k
from smoke_checks import post, smoke


def start_target(ctx: Ctx, name: str, cmd: str, port: int, log: Path) -> tuple[ps.Proc, float]:
    if not ps.port_free(port):
        raise RuntimeError(f"port {port} already in use")
    engines = [f"http://127.0.0.1:{p}" for p in ctx.engine_ports]
    profile = GATEWAYS.get(name, "minimal")  # each gateway target its own config and data directory
    config = tg.write_gateway_config(
        ctx.dir / f"{name}.yaml", engines, profile=profile, data_dir=ctx.dir / f"{name}-data"
    )
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
                res["scenarios"][scn] = board.run_scenario(ctx, scn, base, pid, sampler, run_wrk, run_stream)
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
