"""The load generators a measured window runs on the load CPU: wrk for non-streaming requests (post.lua
prints one WRKJSON line) and stream_client.py for streams in one of its dialects (one STREAMJSON line),
each turned into the run's result dict (requests, req/s, latency percentiles, errors, TTFT).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import targets as tg
from run_context import BENCH, Ctx


def _result_line(stdout: str, tag: str, what: str, shown: str | None = None) -> dict:
    """The JSON of the one `tag` line a load generator printed (`shown`, its output, in the error if none)."""
    line = next((x for x in stdout.splitlines() if x.startswith(tag + " ")), None)
    if line is None:
        raise RuntimeError(f"{what} gave no result:\n" + (stdout if shown is None else shown)[-2000:])
    return json.loads(line[len(tag) + 1 :])


def _result(r: dict, errors: int, extra: dict, latencies: tuple[str, ...]) -> dict:
    """The run's result dict from a generator's JSON: its counts, `extra`, and each `<name>_us` latency in ms
    (None where no request completed)."""
    wall = r["duration_us"] / 1e6
    ms = (lambda k: r[k] / 1e3) if r["requests"] else (lambda k: None)
    return {
        "requests": r["requests"],
        "wall_s": wall,
        "errors": errors,
        **extra,
        "rps": r["requests"] / wall,
        **{name: ms(name + "_us") for name in latencies},
    }


def run_wrk(ctx: Ctx, url: str, conc: int, dur: float, body: Path | None = None) -> dict:
    """wrk POSTing `body` (a JSON file sent as it is; request.json when None) with the bench key as Bearer."""
    argv = ["wrk", "-t1", f"-c{conc}", f"-d{max(1, round(dur))}s", "--timeout=10s", "-s", str(BENCH / "post.lua")]
    argv += [url, "--", str(body or BENCH / "request.json")]
    out = subprocess.run(
        ctx.load_cmd(argv), capture_output=True, text=True, timeout=dur + 60, env=tg.target_env()
    ).stdout
    w = _result_line(out, "WRKJSON", "wrk")
    return _result(w, sum(w[k] for k in w if k.startswith("err_")), {}, ("p50", "p90", "p99"))


def run_stream(
    ctx: Ctx, url: str, conc: int, dur: float, tokens: int, dialect: str = "chat", body: Path | None = None
) -> dict:
    """stream_client.py: request.json translated to `dialect`, or `body`, a request already in `dialect`."""
    argv = [tg.PROJECT_PY, str(BENCH / "stream_client.py"), url, "--body", str(body or BENCH / "request.json")]
    argv += ["-c", str(conc), "-d", str(dur), "--tokens", str(tokens), "--dialect", dialect]
    if body is not None:
        argv.append("--native-body")
    argv += ["--expect-deltas", str(tokens)]  # the engine sends exactly `tokens` tokens: fewer deltas = broken
    p = subprocess.run(ctx.load_cmd(argv), capture_output=True, text=True, timeout=dur + 120, env=tg.target_env())
    s = _result_line(p.stdout, "STREAMJSON", "stream client", p.stdout + p.stderr)
    extra = {
        "error_kinds": s["error_kinds"],
        "deltas": s["deltas_total"],  # token deltas relayed, good streams only
        "deltas_per_stream": s["deltas_median"],
        "frames_per_stream": s["frames_median"],
    }
    return _result(s, s["errors"], extra, ("p50", "p90", "p99", "ttft_p50", "ttft_p90", "ttft_p99"))
