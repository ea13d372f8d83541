"""A/B of gateway configs (or checkouts) in one run, interleaved: what a feature costs per request.

Made for the usage ledger (issue 36: on, it cost 2x the CPU per request and a ~55 ms stall per flush), usable
for any config change. Each round starts every variant's gateway in turn on CPU 0 (fresh data_dir), warms it,
then measures `wrk` at each `--conc` for `--duration` s from CPU 1 against the same fake engine, and `direct`
(the engine alone) at c1 for the added latency. Variants alternate within each round, so the shared box's
drift hits them alike; the table gives medians over rounds and each variant's ratio to the first.

    bench/.venv... python bench/ledger_ab.py --variant off=minimal --variant on=ledger --rounds 3
    git worktree add /tmp/base <rev>
    python bench/ledger_ab.py --variant old=ledger@/tmp/base --variant new=ledger --rounds 3
    python bench/ledger_ab.py --variant old=team@/tmp/base --variant new=team --request messages   # agent-sized

`--request chat|messages|responses` sends agent_request.py's 74 KB coding-agent request in that API instead of
request.json (direct's c1 floor, the engine alone, is then measured with the chat one).

A variant is `label=profile[@checkout]`: profile is one of targets.PROFILES (`minimal`: today's bench config;
`ledger`: minimal + `usage: {ledger: true}` on the embedded SQLite, spool on; `team`: as a team runs it),
checkout a directory whose `llm_gateway` is run instead of this one's. Traffic goes to 127.0.0.1 only, every
load is bounded in time; the processes it starts are stopped by process group.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import agent_request
import cpu_idle
import procstat as ps
import targets as tg
from run_context import LOAD_CPU, PROXY_CPU
from smoke_checks import post
from stream_client import PATHS

NICE = -10


def wrk(url: str, conc: int, dur: float, body: Path | None = None) -> dict:
    argv = ["nice", "-n", str(NICE), "taskset", "-c", LOAD_CPU, "wrk", "-t1", f"-c{conc}", f"-d{round(dur)}s"]
    argv += ["--timeout=10s", "-s", str(tg.BENCH / "post.lua"), url, "--", str(body or tg.BENCH / "request.json")]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=dur + 60, env=tg.target_env()).stdout
    line = next((x for x in out.splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError("wrk gave no result:\n" + out[-2000:])
    return json.loads(line[len("WRKJSON ") :])


def start_engine(held: contextlib.ExitStack, work: Path) -> list[str]:
    """CPU latency held at 0 and the fake engine on the load core (two ports), both until `held` closes: the
    engines' URLs."""
    held.enter_context(cpu_idle.held_latency(0))
    ports = [ps.free_port(), ps.free_port()]
    engine = ps.Proc(
        f"{tg.PROJECT_PY} {tg.BENCH}/fake_engine.py --port {ports[0]},{ports[1]} --tokens 64 --tpot-ms 1",
        LOAD_CPU,
        tg.target_env(),
        work / "engine.log",
        NICE,
    )
    held.callback(engine.stop)
    if not ps.wait_until(lambda: not ps.port_free(ports[1]), 15):
        raise RuntimeError("the fake engine did not start")
    return [f"http://127.0.0.1:{p}" for p in ports]


def start_gateway(profile: str, checkout: Path | None, engines: list[str], work: Path) -> tuple[ps.Proc, str]:
    data = Path(tempfile.mkdtemp(prefix="gw-", dir=work))
    config = tg.write_gateway_config(data / "gateway.yaml", engines, profile=profile, data_dir=data)
    port = ps.free_port()
    root = checkout or tg.REPO
    cmd = f"cd {root} && PYTHONPATH={root} {tg.PROJECT_PY} -m llm_gateway serve --config {config} "
    cmd += f"--host 127.0.0.1 --port {port}"
    proc = ps.Proc(cmd, PROXY_CPU, tg.target_env(), data / "gateway.log", NICE)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"gateway exited during start-up; see {data / 'gateway.log'}")
        with contextlib.suppress(Exception):
            if post(base, {"stream": False}, 5)[0] == 200:
                return proc, base
        time.sleep(0.25)
    proc.stop()
    raise RuntimeError(f"gateway not ready; see {data / 'gateway.log'}")


def measure(proc: ps.Proc, url: str, concs: list[int], dur: float, body: Path | None = None) -> dict:
    wrk(url, 16, 1, body)  # warm-up, not recorded
    out = {}
    for c in concs:
        cpu0 = ps.tree_cpu_s(proc.pid)
        r = wrk(url, c, dur, body)
        cpu = ps.tree_cpu_s(proc.pid) - cpu0
        errors = sum(v for k, v in r.items() if k.startswith("err_"))
        out[f"c{c}"] = {
            "rps": r["requests"] / (r["duration_us"] / 1e6),
            "us_per_req": cpu * 1e6 / max(1, r["requests"]),
            "p50_ms": r["p50_us"] / 1e3,
            "p99_ms": r["p99_us"] / 1e3,
            "max_ms": r["max_us"] / 1e3,
            "errors": errors,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", action="append", required=True, help="label=profile[@checkout], repeatable")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--conc", default="1,64")
    ap.add_argument("--out", type=Path, default=None, help="JSON of every measurement")
    ap.add_argument(
        "--request",
        choices=("small", *agent_request.DIALECTS),
        default="small",
        help="what wrk sends: request.json (small), or agent_request.py's 74 KB agent request in that API",
    )
    a = ap.parse_args()
    variants = []
    for v in a.variant:
        label, _, spec = v.partition("=")
        profile, _, checkout = spec.partition("@")
        if profile not in tg.PROFILES:
            ap.error(f"unknown profile {profile!r}: one of {', '.join(tg.PROFILES)}")
        variants.append((label, profile, Path(checkout) if checkout else None))
    concs = [int(c) for c in a.conc.split(",")]
    work = Path(tempfile.mkdtemp(prefix="ledger-ab-"))
    agent = {} if a.request == "small" else agent_request.write(work / "agent")
    body = agent.get(a.request)
    path = PATHS.get(a.request, PATHS["chat"])
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in variants}
    direct: list[float] = []
    with contextlib.ExitStack() as held:
        engines = start_engine(held, work)
        for rnd in range(a.rounds):
            d = wrk(engines[0] + "/v1/chat/completions", 1, a.duration, agent.get("chat"))
            direct.append(d["p99_us"] / 1e3)
            for label, profile, checkout in variants if rnd % 2 == 0 else list(reversed(variants)):
                proc, base = start_gateway(profile, checkout, engines, work)
                try:
                    m = measure(proc, base + path, concs, a.duration, body)
                finally:
                    proc.stop()
                runs[label].append(m)
                print(f"round {rnd} {label}: " + json.dumps(m), flush=True)
    if a.out:
        a.out.write_text(json.dumps({"direct_c1_p99_ms": direct, "runs": runs}, indent=1))
    d99 = statistics.median(direct)
    first = variants[0][0]
    print(f"\nmedians of {a.rounds} rounds, {a.duration:g} s each; direct c1 p99 {d99:.3f} ms")
    print(
        "| variant | conc | req/s | CPU µs/req | rounds | x first | p50 ms | p99 ms | added p99 ms | max ms | errors |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for label, _, _ in variants:
        for c in concs:
            k = f"c{c}"

            def med(f: str, lab: str = label, key: str = k) -> float:
                return statistics.median(r[key][f] for r in runs[lab])

            ratio = med("us_per_req") / med("us_per_req", first)
            # each round's CPU a request, in order: on a shared VM c1 can jump by a quarter between rounds whatever
            # the variant (bimodal), which a median of three hides and a ratio of two medians then carries
            each = " ".join(f"{r[k]['us_per_req']:.0f}" for r in runs[label])
            print(
                f"| {label} | {c} | {med('rps'):.0f} | {med('us_per_req'):.1f} | {each} | {ratio:.2f} "
                f"| {med('p50_ms'):.3f} "
                f"| {med('p99_ms'):.3f} | {med('p99_ms') - d99:.3f} | {med('max_ms'):.1f} | "
                f"{sum(r[k]['errors'] for r in runs[label])} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
