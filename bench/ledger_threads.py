"""Where a gateway profile's CPU goes, thread by thread: per request, each thread's run time (schedstat, ns),
its user and system split, and its context switches, under `wrk` at each `--conc`.

Made for the usage ledger (issue 36: its extra CPU per request at c1 was ~3x what it is at c64): the loop's
thread, the SQLite writer thread (`db-writer_0`) and the default executor's threads (`asyncio_N`, the spool's
checkpoints) are told apart, so that a cost is found where it is paid, and kernel time (which callgrind does
not see) shows as `sys`. Same harness as ledger_ab.py (gateway on CPU 0, load and engine on CPU 1, fresh
data_dir per variant, variants alternated per round); a variant is `label=profile[@checkout]`.

    cd bench && ../.venv/bin/python ledger_threads.py --variant off=minimal --variant on=ledger --rounds 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

import ledger_ab as ab
import procstat as ps

_NUM = re.compile(r"_?\d+$")
_SWITCHES = re.compile(r"^(?:non)?voluntary_ctxt_switches:\s+(\d+)", re.M)  # voluntary, then involuntary


def threads(pid: int) -> dict[str, list[float]]:
    """{thread kind: [run ns, utime ticks, stime ticks, voluntary cs, involuntary cs]} summed over the
    process's threads of that kind (names without their number: `asyncio`, `db-writer`; the main thread
    is `loop`)."""
    out: dict[str, list[float]] = {}
    tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    for rank, t in enumerate(tids):
        base = f"/proc/{pid}/task/{t}"
        with contextlib.suppress(OSError, IndexError, ValueError):
            head, _, rest = Path(base + "/stat").read_text().rpartition(")")
            name = "loop" if int(t) == pid else f"{_NUM.sub('', head.split('(', 1)[1])}#{rank}"
            f = rest.split()
            run = int(Path(base + "/schedstat").read_text().split()[0])
            status = Path(base + "/status").read_text()
            vol, inv = (int(m) for m in _SWITCHES.findall(status))
            acc = out.setdefault(name, [0.0] * 5)
            for i, v in enumerate((run, int(f[11]), int(f[12]), vol, inv)):
                acc[i] += v
    return out


def measure(pid: int, url: str, conc: int, dur: float) -> dict[str, object]:
    ab.wrk(url, 16, 1)  # warm-up
    a = threads(pid)
    r = ab.wrk(url, conc, dur)
    b = threads(pid)
    n = max(1, r["requests"])
    per: dict[str, dict[str, float]] = {}
    for k, v in b.items():
        u = a.get(k, [0.0] * 5)
        d = [x - y for x, y in zip(v, u, strict=True)]
        per[k] = {
            "us": d[0] / 1e3 / n,
            "usr_us": d[1] / ps.TICK * 1e6 / n,
            "sys_us": d[2] / ps.TICK * 1e6 / n,
            "vcs": d[3] / n,
            "ics": d[4] / n,
        }
    return {"rps": r["requests"] / (r["duration_us"] / 1e6), "threads": per}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="label=profile[@checkout], repeatable")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--conc", default="1,64")
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        label, _, spec = v.partition("=")
        profile, _, checkout = spec.partition("@")
        variants.append((label, profile, Path(checkout) if checkout else None))
    concs = [int(c) for c in a.conc.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ledger-threads-"))
    runs: dict[tuple[str, int], list[dict]] = {}
    with contextlib.ExitStack() as held:
        engines = ab.start_engine(held, work)
        for rnd in range(a.rounds):
            for label, profile, checkout in variants if rnd % 2 == 0 else list(reversed(variants)):
                proc, base = ab.start_gateway(profile, checkout, engines, work)
                try:
                    pid = ps.main_pid(proc.pid)
                    for c in concs:
                        runs.setdefault((label, c), []).append(
                            measure(pid, base + "/v1/chat/completions", c, a.duration)
                        )
                finally:
                    proc.stop()
    print(f"medians of {a.rounds} rounds, {a.duration:g} s each; per request: run µs (schedstat), usr/sys (ticks)")
    print("| variant | conc | req/s | thread | run µs | usr µs | sys µs | vol cs | invol cs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, _, _ in variants:
        for c in concs:
            rs = runs[(label, c)]
            rps = statistics.median(r["rps"] for r in rs)
            names = sorted({k for r in rs for k in r["threads"]})
            total = {
                f: statistics.median(sum(t[f] for t in r["threads"].values()) for r in rs)
                for f in ("us", "usr_us", "sys_us", "vcs", "ics")
            }
            rows = [("ALL", total)]
            for k in names:
                med = {
                    f: statistics.median(r["threads"].get(k, {}).get(f, 0.0) for r in rs)
                    for f in ("us", "usr_us", "sys_us", "vcs", "ics")
                }
                if med["us"] >= 0.05:
                    rows.append((k, med))
            for k, m in rows:
                print(
                    f"| {label} | {c} | {rps:.0f} | {k} | {m['us']:.1f} | {m['usr_us']:.1f} | {m['sys_us']:.1f} "
                    f"| {m['vcs']:.3f} | {m['ics']:.3f} |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
