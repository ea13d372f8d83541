#!/usr/bin/env python3
"""Hold N concurrent open streams through the gateway, R rounds, and show that nothing leaks.

Starts its own fake engine (CPU 1, two ports, idle keep-alive 5 s like vLLM's uvicorn) and the gateway
(CPU 0, the bench config with every feature on). Each round, client processes (CPU 1, aiohttp) open N
streams at --open-rate per second; the engine keeps every stream going (one token per --tpot-ms) until
all N are open at once and --hold-s has passed, then ends them all (`/fake/release`). Every stream
must end with `data: [DONE]` and no error, and none may stall (a gap between two of its reads after the
first over STALL_FACTOR x the pace: the boards' rule, which bench/board.py's stall20 steps up at 20 ms a
token). Before, with all open, and after each round it prints the gateway's open fds (by kind) and RSS;
"after" waits until idle upstream connections are closed (engine keep-alive) so the fds must come back to
the baseline.

fd budget: a proxied stream costs the gateway 2 fds (client side + upstream side). N is capped at what
the gateway's fd limit allows ((limit - fds at idle - headroom) / 2), and the cap is printed, never
silent. Client load is split over enough processes to stay inside each one's fd limit, each from its
own source address (127.0.0.2, .3, ...) so the 4-tuples (and ephemeral ports) never run out, and a new
one each round: the client ports of the round before sit in TIME_WAIT for 60 s, and binding new ones among
them cost every round after the first about a second of TTFT (round 2 of 9,891 streams: p50 909 / p99
1,932 ms from the round's first address, against 1.5 / 82 in round 1 and 1.2 / 61 from a fresh address).
The gateway's memory per open stream is (RSS with all open - RSS before) / N: round 1's is what a stream
costs; the rounds after it reuse what round 1 left to the allocator.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import procstat as ps
import targets as tg
from board import STALL_FACTOR

PROXY_CPU, LOAD_CPU = "0", "1"


def start_engine(run_dir: Path, nice: int, keepalive_s: float) -> tuple[ps.Proc, list[int]]:
    ports = [ps.free_port(), ps.free_port()]
    cmd = (
        f"{tg.PROJECT_PY} {tg.BENCH}/fake_engine.py --port {ports[0]},{ports[1]} --tokens 64 --tpot-ms 1 "
        f"--keepalive-s {keepalive_s}"
    )
    eng = ps.Proc(cmd, LOAD_CPU, dict(os.environ), run_dir / "streams-engine.log", nice)
    if not ps.wait_until(lambda: not ps.port_free(ports[0]) and not ps.port_free(ports[1]), 15):
        raise RuntimeError("fake engine did not start: see " + str(run_dir / "streams-engine.log"))
    return eng, ports


def smoke_stream(url: str) -> None:
    body = json.dumps(
        {"model": "fake-model", "stream": True, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    hdrs = {"Content-Type": "application/json", "Authorization": "Bearer " + tg.API_KEY}
    status, raw = ps.http(url, body, hdrs, timeout=10)
    if status != 200 or b"data: [DONE]" not in raw:
        raise RuntimeError(f"smoke stream failed: {status} {raw[-200:]!r}")


def wait_ready(url: str, proc: ps.Proc, timeout: float) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not proc.alive():
            raise RuntimeError(f"the gateway exited during start-up (code {proc.p.returncode})")
        try:
            smoke_stream(url)
            return time.monotonic() - t0
        except Exception:  # not up yet
            time.sleep(0.25)
    raise RuntimeError(f"the gateway was not ready after {timeout:.0f} s")


def port_range() -> tuple[int, int]:
    lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(lo), int(hi)


def plan(a: argparse.Namespace, gw_pid: int, eng_pid: int) -> dict:
    """How many streams fit, over how many client processes; every cap is said out loud."""
    soft, hard = ps.fd_limits(gw_pid)
    base = ps.tree_fds(gw_pid)
    fit = (soft - base - a.headroom) // 2
    n = min(a.n, fit)
    notes = []
    if n < a.n:
        why = f"the gateway's hard fd limit is {hard}"
        if soft < hard:
            why = f"the gateway's fd limit is {soft} (soft; hard {hard})"
        notes.append(
            f"requested {a.n}, ran {n} because {why}: a proxied stream costs 2 fds (client side + upstream side), "
            f"{base} fds are in use at idle and {a.headroom} are kept as headroom"
        )
    e_soft, _ = ps.fd_limits(eng_pid)
    e_fit = e_soft - ps.tree_fds(eng_pid) - a.headroom
    if e_fit < n:
        notes.append(f"capped at {e_fit} streams by the fake engine's fd limit {e_soft}")
        n = e_fit
    per_proc = max(1, ps.fd_limits(os.getpid())[1] - 200)  # client processes raise their soft limit to this
    lo, hi = port_range()
    per_proc = min(per_proc, int((hi - lo + 1) * 0.9))  # one source address per client process
    procs = max(a.client_procs, math.ceil(n / per_proc))
    if procs > 1:
        notes.append(f"client load split over {procs} processes (each may hold {per_proc} streams)")
    up_ports = 2
    if n / up_ports > (hi - lo + 1) * 0.9:
        notes.append(f"warning: {n} upstream connections over {up_ports} engine ports may exhaust ports {lo}-{hi}")
    ramp_limit = n / a.open_rate * 4 + 60  # the gateway may open streams slower than they are offered
    tpot = a.tpot_ms or max(200, n // 2)
    return {
        "requested": a.n,
        "n": n,
        "gateway_fd_limit": {"soft": soft, "hard": hard},
        "gateway_fds_idle": base,
        "headroom": a.headroom,
        "client_procs": procs,
        "tpot_ms": tpot,
        "tokens_per_s": round(n * 1000 / tpot),
        "hold_s": a.hold_s,
        "ramp_limit_s": ramp_limit,
        "open_rate": a.open_rate,
        "port_range": [lo, hi],
        "backends": up_ports,
        "notes": notes,
    }


class Client:
    """One stream_client.py process in hold mode; a thread collects its stdout lines."""

    def __init__(self, cmd: list[str], log: Path) -> None:
        self.log = log.open("wb")
        env = {**os.environ, "BENCH_API_KEY": tg.API_KEY}
        self.p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, env=env)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for raw in self.p.stdout:
            self.lines.append(raw.decode(errors="replace").strip())

    def all_open(self) -> bool:
        return any(x.startswith("ALLOPEN") for x in self.lines)

    def result(self) -> dict:
        if self.p.poll() is None:
            self.p.kill()  # our own child, past every deadline
        self.p.wait(30)
        self.reader.join(10)
        self.log.close()
        line = next((x for x in self.lines if x.startswith("HOLDJSON ")), None)
        return json.loads(line[9:]) if line else {"requests": 0, "errors": 1, "error_kinds": {"no_output": 1}}


def client_address(round_no: int, proc: int, procs: int) -> str:
    """The source address of client process `proc` of `procs` in round `round_no` (from 1): one of its own, and
    none of the round before's, whose ports are still in TIME_WAIT (the module's doc)."""
    return f"127.0.0.{2 + ((round_no - 1) * procs + proc) % 250}"


def release(engine_port: int, hold: str) -> int:
    """End the held streams of this round (also any that reach the engine later); returns how many were held."""
    return int(
        json.loads(ps.http(f"http://127.0.0.1:{engine_port}/fake/release?hold={hold}", b"", timeout=10)[1])["held"]
    )


def run_round(a: argparse.Namespace, url: str, p: dict, gw_pid: int, ports: list[int], run_dir: Path, r: int) -> dict:
    """Open N held streams; once all are open, keep them streaming --hold-s, release them, let them end."""
    n, k = p["n"], p["client_procs"]
    shares = [n // k + (1 if i < n % k else 0) for i in range(k)]
    gw_port, engine_ports = int(url.split(":")[2].split("/")[0]), set(ports)
    hold = f"streams-{os.getpid()}-r{r}"

    def snapshot() -> dict:
        fds = ps.fd_breakdown(gw_pid, gw_port, engine_ports)
        return {"fds": fds["total"], "rss_mb": ps.tree_rss_kb(gw_pid) / 1024, "fd_kinds": fds}

    before = snapshot()
    cpu0 = ps.tree_cpu_s(gw_pid)
    ramp_limit = p["ramp_limit_s"]
    life = ramp_limit + a.hold_s + a.drain_s
    clients = []
    for i, share in enumerate(shares):
        cmd = [
            "nice", "-n", str(a.nice), "taskset", "-c", LOAD_CPU, tg.PROJECT_PY, str(tg.BENCH / "stream_client.py"),
            url, "--hold", str(share), "--engine-hold", hold, "--open-rate", str(a.open_rate / k),
            "--open-inflight", str(max(16, a.open_inflight // k)), "--tokens", "2", "--tpot-ms", str(p["tpot_ms"]),
            "--stall-ms", str(STALL_FACTOR * p["tpot_ms"]), "--timeout", str(life), "--deadline", str(life + 10),
            "--local-addr", client_address(r, i, k),
        ]  # fmt: skip
        clients.append(Client(cmd, run_dir / f"streams-client-r{r}-{i}.log"))
    peak = {"fds": 0, "rss_mb": 0.0}

    def sample() -> None:
        fds, rss = ps.tree_fds(gw_pid), ps.tree_rss_kb(gw_pid) / 1024
        peak["fds"] = max(peak["fds"], fds)
        peak["rss_mb"] = max(peak["rss_mb"], rss)

    t0 = time.monotonic()
    while time.monotonic() - t0 < ramp_limit:  # ramp: until every client has all its streams open at once
        sample()
        if all(c.all_open() for c in clients) or any(c.p.poll() is not None for c in clients):
            break
        time.sleep(0.25)
    all_open_s = round(time.monotonic() - t0, 1) if all(c.all_open() for c in clients) else None
    at_open = snapshot()
    t_hold = time.monotonic()
    while time.monotonic() - t_hold < a.hold_s:  # all open, all streaming
        sample()
        time.sleep(0.25)
    released = release(ports[0], hold)
    t_rel = time.monotonic()
    while any(c.p.poll() is None for c in clients) and time.monotonic() - t_rel < a.drain_s:
        sample()
        time.sleep(0.25)
    wall = time.monotonic() - t0
    results = [c.result() for c in clients]
    cpu_s = ps.tree_cpu_s(gw_pid) - cpu0
    # after: wait (bounded) until the engine's keep-alive has closed the idle upstream connections
    ps.wait_until(lambda: ps.tree_fds(gw_pid) <= before["fds"], a.settle_s, every=0.5)
    after = snapshot()
    kinds: dict[str, int] = {}
    for x in results:
        for kind, v in x.get("error_kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + v
    return {
        "round": r,
        "n": n,
        "ok": sum(x["requests"] for x in results),
        "errors": sum(x.get("errors", 0) for x in results),
        "error_kinds": kinds,
        "all_open_s": all_open_s,
        "open_at_once": sum(x.get("peak_open", 0) for x in results),
        "released_by_engine": released,
        "ttft_p50_ms": max((x.get("ttft_p50_us", 0) for x in results), default=0) / 1e3,
        "ttft_p99_ms": max((x.get("ttft_p99_us", 0) for x in results), default=0) / 1e3,
        "stalled": sum(x.get("stalled") or 0 for x in results),
        "max_gap_ms": max((x.get("max_gap_us", 0) for x in results), default=0) / 1e3,
        "kb_per_stream": round((at_open["rss_mb"] - before["rss_mb"]) * 1024 / n, 1) + 0.0,  # never "-0.0"
        "wall_s": round(wall, 1),
        "gateway_cpu_s": round(cpu_s, 1),
        "before": before,
        "at_open": at_open,
        "peak": peak,
        "after": after,
    }


def verdict(rounds: list[dict], p: dict) -> dict:
    """No leak = after every round: no client connection left, no more fds than before round 1 plus the
    idle upstream connections the probes keep alive (up to 4 per backend), no more non-socket fds than
    before round 1, and RSS after the last round within max(8 MB, 5 %) of RSS after round 1 (memory the
    allocator keeps after the first round is reuse, not a leak)."""
    all_ok = all(r["ok"] == r["n"] and r["errors"] == 0 for r in rounds)
    all_open = all(r["all_open_s"] is not None and r["open_at_once"] >= r["n"] for r in rounds)
    no_stall = all(r.get("stalled", 0) == 0 for r in rounds)
    b0 = rounds[0]["before"]["fd_kinds"]
    fds_back = all(
        r["after"]["fd_kinds"]["client"] == 0
        and r["after"]["fds"] <= b0["total"] + 4 * p["backends"]
        and r["after"]["fd_kinds"]["not_sockets"] <= b0["not_sockets"]
        for r in rounds
    )
    rss_after = [r["after"]["rss_mb"] for r in rounds]
    growth = (rss_after[-1] - rss_after[0]) if len(rss_after) > 1 else 0.0
    rss_stable = growth <= max(8.0, 0.05 * rss_after[0])
    return {
        "all_completed": all_ok,
        "all_open_at_once": all_open,
        "no_stall": no_stall,
        "fds_back_to_baseline": fds_back,
        "rss_after_growth_mb": round(growth, 1),
        "rss_stable": rss_stable,
        "no_leak": fds_back and rss_stable,
        "ok": all_ok and all_open and no_stall and fds_back and rss_stable,
    }


def report(res: dict) -> str:
    p, rounds = res["plan"], res["rounds"]
    v = verdict(rounds, p)  # the current rule, also when re-printing a saved run
    lines = [
        f"**streams.py**: {p['n']} concurrent streams x {len(rounds)} rounds through the gateway, each streaming "
        f"one token every {p['tpot_ms']} ms ({p['tokens_per_s']:,} tokens/s in all); opened at "
        f"{p['open_rate']:.0f}/s by {p['client_procs']} client "
        f"process(es), kept open together {p['hold_s']:g} s, then ended by the engine ([DONE]); gateway fd limit "
        f"{p['gateway_fd_limit']['soft']} (hard {p['gateway_fd_limit']['hard']})",
        "",
    ]
    lines += [f"> {note}" for note in p["notes"]]
    lines += [
        "",
        "| round | ok / n | errors | open at once | all open after s | TTFT p50 / p99 ms | max gap ms (stalled) "
        "| gw fds before / all open / after | after: client / upstream conns | gw RSS MB before / peak / after "
        "| gw KB / open stream | gw CPU s | wall s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        err = f"{r['errors']} {r['error_kinds']}" if r["errors"] else "0"
        lines.append(
            f"| {r['round']} | {r['ok']} / {r['n']} | {err} | {r['open_at_once']} | {r['all_open_s'] or 'never'} | "
            f"{r['ttft_p50_ms']:.1f} / {r['ttft_p99_ms']:.0f} | "
            f"{r.get('max_gap_ms', 0):,.0f} ({r.get('stalled', '-')}) | "
            f"{r['before']['fds']} / {r['at_open']['fds']} / {r['after']['fds']} | "
            f"{r['after']['fd_kinds']['client']} / {r['after']['fd_kinds']['upstream']} | "
            f"{r['before']['rss_mb']:.0f} / {r['peak']['rss_mb']:.0f} / {r['after']['rss_mb']:.0f} | "
            f"{r.get('kb_per_stream', '-')} | {r['gateway_cpu_s']} | {r['wall_s']} |"
        )
    lines.append(
        f"\nVerdict: {'OK' if v['ok'] else 'NOT OK'}: every stream completed with [DONE] and no error: "
        f"{v['all_completed']}; all open at once: {v['all_open_at_once']}; no stall (a gap over {STALL_FACTOR}x the "
        f"{p['tpot_ms']} ms pace): {v.get('no_stall', '-')}; no connection or fd left after each round: "
        f"{v['fds_back_to_baseline']}; RSS after round {len(rounds)} vs after round 1: "
        f"{v['rss_after_growth_mb']:+.1f} MB "
        f"({'stable' if v['rss_stable'] else 'GROWING'})"
    )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=10000, help="concurrent streams wanted (capped by the fd limit)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--tpot-ms",
        type=int,
        default=0,
        help="delay between tokens of each stream; 0 (default) = max(200, N/2) ms, i.e. at most 2,000 tokens/s "
        "in all (every held stream keeps streaming; the relay cost per chunk is st64_c16's business, not this test's)",
    )
    ap.add_argument("--hold-s", type=float, default=5.0, help="how long all N streams stay open together")
    ap.add_argument("--drain-s", type=float, default=120.0, help="max wait for the streams to end after release")
    ap.add_argument("--open-rate", type=float, default=250.0, help="new streams per second")
    ap.add_argument("--open-inflight", type=int, default=256, help="streams waiting for their first byte, at most")
    ap.add_argument("--headroom", type=int, default=200, help="gateway fds left free")
    ap.add_argument("--client-procs", type=int, default=1, help="at least this many client processes")
    ap.add_argument("--settle-s", type=float, default=20.0, help="max wait after a round for fds to come back")
    ap.add_argument("--engine-keepalive-s", type=float, default=5.0)
    ap.add_argument("--gateway-cmd", help=f"how to start the gateway (default: {tg.DEFAULT_GATEWAY_CMD})")
    ap.add_argument("--nice", type=int, default=-10)
    ap.add_argument("--json", help="write the result here (default bench/results/streams-<time>.json)")
    a = ap.parse_args()
    if a.rounds < 1 or a.n < 1:
        ap.error("--n and --rounds must be >= 1")
    soft, hard = ps.fd_limits(os.getpid())
    if soft < hard:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # inherited by everything we start
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    own_nice = ps.set_autogroup_nice("self", a.nice)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = tg.BENCH / "results" / f"streams-{stamp}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out = Path(a.json) if a.json else tg.BENCH / "results" / f"streams-{stamp}.json"
    eng = gw = None
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": vars(a), "rounds": []}
    try:
        eng, ports = start_engine(run_dir, a.nice, a.engine_keepalive_s)
        config = tg.write_gateway_config(run_dir / "gateway.yaml", [f"http://127.0.0.1:{p}" for p in ports])
        port = ps.free_port()
        cmd = (a.gateway_cmd or tg.DEFAULT_GATEWAY_CMD).format(
            py=tg.PROJECT_PY, config=config, port=port, bench=tg.BENCH, repo=tg.REPO
        )
        env = {**tg.target_env(), "PORT": str(port), "GATEWAY_CONFIG": str(config)}
        gw = ps.Proc(cmd, PROXY_CPU, env, run_dir / "streams-gateway.log", a.nice)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        res["startup_s"] = round(wait_ready(url, gw, 60), 1)
        gw_pid = ps.main_pid(gw.pid)
        for _ in range(20):
            smoke_stream(url)
        time.sleep(1.0)
        p = res["plan"] = plan(a, gw_pid, ps.main_pid(eng.pid))
        for note in p["notes"]:
            print(f"streams.py: {note}", flush=True)
        for r in range(1, a.rounds + 1):
            rr = run_round(a, url, p, gw_pid, ports, run_dir, r)
            res["rounds"].append(rr)
            print(
                f"  round {r}: {rr['ok']}/{rr['n']} ok, {rr['errors']} errors {rr['error_kinds'] or ''}, "
                f"open at once {rr['open_at_once']} (after {rr['all_open_s']} s), "
                f"max gap {rr['max_gap_ms']:,.0f} ms ({rr['stalled']} stalled), "
                f"fds {rr['before']['fds']}/{rr['at_open']['fds']}/"
                f"{rr['after']['fds']}, RSS {rr['before']['rss_mb']:.0f}/{rr['peak']['rss_mb']:.0f}/"
                f"{rr['after']['rss_mb']:.0f} MB, {rr['wall_s']} s",
                flush=True,
            )
            out.write_text(json.dumps(res, indent=1))
            if not gw.alive():
                raise RuntimeError("the gateway died during the round")
        res["verdict"] = verdict(res["rounds"], p)
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
        print(f"streams.py: FAILED: {res['error']}", file=sys.stderr, flush=True)
    finally:
        if gw is not None:
            gw.stop()
        if eng is not None:
            eng.stop()
        if own_nice is not None:
            ps.set_autogroup_nice("self", own_nice)
    out.write_text(json.dumps(res, indent=1))
    if "verdict" in res:
        print(report(res))
    print(f"\nresults: {out}")
    return 0 if res.get("verdict", {}).get("ok") else 1


if __name__ == "__main__":
    raise SystemExit(main())
