"""The load generators a measured window runs on the load CPU: wrk for non-streaming requests (post.lua
prints one WRKJSON line) and stream_client.py for streams in one of its dialects (one STREAMJSON line),
each turned into the run's result dict (requests, req/s, latency percentiles, errors, TTFT).
"""

from __future__ import annotations

import json
import subprocess

import targets as tg
from run_context import BENCH, Ctx


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
