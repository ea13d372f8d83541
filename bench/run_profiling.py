"""Profiling the gateway during a bench run (`--profile`, see bench/profile.sh): py-spy recording a measured
window (a flamegraph and collapsed stacks, then profile_report.py's top list with the per-thread CPU),
and cProfile's pstats turned into the same top list once the gateway process exits.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import procstat as ps
from run_context import BENCH, Ctx


def start_profile(ctx: Ctx, name: str, pid: int, dur: float) -> tuple | None:
    spy = BENCH / ".venvs" / "tools" / "bin" / "py-spy"
    if not spy.exists():
        print("    (py-spy not installed: run bench/profile.sh, which installs it)", flush=True)
        return None
    # both gateway targets can be profiled in one run: gateway-minimal's files carry its name
    scn = ctx.current_scenario if name == "gateway" else f"{name}-{ctx.current_scenario}"
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
    top.write_text(profile_report.from_collapsed(raw.read_text(), title=f"{scn}, py-spy", threads_note=note))
    return {"svg": str(svg), "collapsed": str(raw), "top": str(top)}


def finish_cprofile(ctx: Ctx, res: dict, scn: str) -> None:
    import profile_report

    pstats = Path(res["pstats"])
    if not pstats.exists():
        res["profile_error"] = "no pstats file (the gateway did not exit cleanly)"
        return
    top = ctx.dir / f"profile-{scn}-top.txt"
    top.write_text(profile_report.from_pstats(pstats, title=f"gateway, {scn}, cProfile"))
    res["scenarios"].setdefault(scn, {})["profile"] = {"pstats": str(pstats), "top": str(top)}
