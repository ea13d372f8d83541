"""User-space instructions per stream, counted by callgrind: a deterministic A/B for the relay's hot path.

The board's CPU figures (run.py) are what the performance issue's acceptance reads, but on a shared
2-core VM they move 10-20 % between runs, so a 2 % change in the gateway's code cannot be seen there.
callgrind counts the instructions a process executes in user space: the same to about 0.5 % run to
run. Each target runs under `valgrind --tool=callgrind` with instrumentation off until it is warm;
`--streams` streams (at `--concurrency`) of each length in `--tokens` are counted between a zero and a
dump of its counters, less what it does idle for as long (timers, probes: counted alone, `--idle-s`). Two
lengths give the instructions per relayed event (the slope) and per stream, fixed (the intercept), as
`st_split` does for CPU time. The fake engine's pace (`--tpot-ms`, default
30) is slow enough that the target, ~50x slower under valgrind, still reads each event on its own.

What it does not count: the kernel (syscalls and TCP, about 40 % of a proxy's CPU on loopback), and
time itself: an instruction is not a cycle (cache misses, IPC differ between targets). Use it to tell
whether a change to the gateway's code saves work, and the board to tell where the gateway stands.

  bench/instructions.sh                         the gateway on this checkout, 8 and 64 tokens
  bench/instructions.sh --targets gateway,smg   and the Rust gateway, the same way
  bench/instructions.sh --gateway-dir ../other  another checkout's gateway (alternate with this one)

Needs valgrind (`apt-get install valgrind`); prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import procstat as ps
import targets as tg

BENCH = Path(__file__).resolve().parent
_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)


def dump_total(text: bytes) -> int:
    """The instruction count (Ir) of one callgrind dump: its `summary:` (or `totals:`) line."""
    m = _TOTAL.search(text)
    if m is None:
        raise ValueError("not a callgrind dump: no summary or totals line")
    return int(m.group(1))


def split(points: dict[int, float]) -> tuple[float, float]:
    """(per event, per stream fixed) through two (tokens -> instructions per stream) points; a stream of n
    tokens relays n + 3 events (the role chunk, the finish chunk, [DONE]), which the slope does not see."""
    (lo, c_lo), (hi, c_hi) = sorted(points.items())
    per_event = (c_hi - c_lo) / (hi - lo)
    return per_event, c_lo - lo * per_event


class Counted:
    """One target under callgrind: started with instrumentation off, counted between zero and dump."""

    def __init__(self, name: str, cmd: str, out: Path, cwd: Path, env: dict[str, str]) -> None:
        self.name, self.out = name, out
        vg = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}/cg.%p"]
        self.log = open(out / f"{name}.log", "wb")  # noqa: SIM115  # closed in stop()
        self.proc = subprocess.Popen(
            ["taskset", "-c", "0", *vg, *shlex.split(cmd)], cwd=cwd, env=env, stdout=self.log, stderr=self.log
        )

    def control(self, *args: str) -> None:
        """callgrind_control on this target (it exits 0 even when it finds no callgrind run: read what it says)."""
        out = subprocess.run(
            ["callgrind_control", *args, str(self.proc.pid)], capture_output=True, text=True, timeout=120
        )
        if out.returncode != 0 or "Error" in out.stdout + out.stderr:
            raise RuntimeError(f"callgrind_control {' '.join(args)} on {self.name}: {out.stdout}{out.stderr}".strip())

    def count(self, run: Callable[[], object]) -> int:
        """Instructions executed while `run()` runs."""
        self.control("-z")
        run()
        before = set(self.out.glob(f"cg.{self.proc.pid}.*"))
        self.control("-d")
        for _ in range(100):
            new = set(self.out.glob(f"cg.{self.proc.pid}.*")) - before
            if new:
                time.sleep(0.2)  # written by now: callgrind_control returns once the dump is done
                return dump_total(max(new, key=lambda p: int(p.name.rsplit(".", 1)[1])).read_bytes())
            time.sleep(0.1)
        raise RuntimeError(f"{self.name}: callgrind wrote no dump")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def streams(url: str, n: int, conc: int, tokens: int, tpot_ms: int, timeout: float = 600.0) -> int:
    """Run `n` streams of `tokens` tokens against `url` (load on CPU 1); how many came back good."""
    cmd = [tg.PROJECT_PY, str(BENCH / "stream_client.py"), url, "--body", str(BENCH / "request.json")]
    cmd += ["-c", str(conc), "-d", str(timeout), "--max-requests", str(n), "--tokens", str(tokens)]
    cmd += ["--tpot-ms", str(tpot_ms), "--timeout", "300"]
    env = {**os.environ, "BENCH_API_KEY": tg.API_KEY}
    out = subprocess.run(["taskset", "-c", "1", *cmd], capture_output=True, text=True, env=env, timeout=timeout + 60)
    if "STREAMJSON" not in out.stdout:
        raise RuntimeError(f"stream client: {out.stdout[-400:]} {out.stderr[-400:]}")
    r = json.loads(out.stdout.split("STREAMJSON", 1)[1])
    if r["errors"]:
        print(f"    {r['errors']} of {n} {tokens}-token streams failed: {r['error_kinds']}", flush=True)
    return int(r["requests"])  # the good ones (errors are counted apart)


def measure(name: str, cmd: str, cwd: Path, a: argparse.Namespace, engine_url: str, out: Path) -> dict[str, float]:
    port, aux = ps.free_port(), ps.free_port()
    env = {**os.environ, "BENCH_API_KEY": tg.API_KEY, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = cmd.replace("{port}", str(port)).replace("{aux_port}", str(aux)).replace("{upstream}", engine_url)
    target = Counted(name, cmd, out, cwd, env)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        deadline = time.monotonic() + a.start_timeout
        while ps.port_free(port):
            if target.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not start: see {out}/{name}.log")
            time.sleep(0.5)
        streams(url, 20, a.concurrency, 8, a.tpot_ms)  # warm: pools, caches, the engine's bodies
        target.control("-i", "on")
        for tokens in a.tokens:
            streams(url, max(4, a.streams // 4), a.concurrency, tokens, a.tpot_ms)  # warm, now instrumented
        # what the target does with no traffic (timers, probes, a config watcher) runs for as long as a count
        # does: measured alone and taken off, or the longer streams would be charged with more of it
        idle_rate = target.count(lambda: time.sleep(a.idle_s)) / a.idle_s
        per_stream: dict[int, float] = {}
        for tokens in a.tokens:
            good: list[int] = []

            def run(t: int = tokens, into: list[int] = good) -> None:
                into.append(streams(url, a.streams, a.concurrency, t, a.tpot_ms))

            t0 = time.monotonic()
            ir = target.count(run)
            busy = ir - idle_rate * (time.monotonic() - t0)
            if good[0] != a.streams:
                raise RuntimeError(f"{name}: {good[0]} of {a.streams} {tokens}-token streams were good")
            per_stream[tokens] = busy / a.streams
            print(f"  {name}: {tokens} tokens {per_stream[tokens]:,.0f} instructions a stream", flush=True)
    finally:
        target.stop()
    per_event, fixed = split(per_stream)
    print(f"  {name}: idle {idle_rate:,.0f} instructions a second (taken off)", flush=True)
    return {
        **{f"ir_per_stream_{k}": v for k, v in per_stream.items()},
        "ir_per_event": per_event,
        "ir_fixed": fixed,
        "ir_idle_per_s": idle_rate,
    }


def table(results: dict[str, dict[str, float]], tokens: list[int]) -> str:
    base = results.get("smg")
    head = "| target | " + " | ".join(f"instructions / {t}-token stream" for t in tokens)
    head += " | instructions / relayed event | instructions / stream, fixed |"
    rows = [head, "|---" * (len(tokens) + 3) + "|"]
    for name, r in results.items():
        cells = [f"{r[f'ir_per_stream_{t}']:,.0f}" for t in tokens]
        for k in ("ir_per_event", "ir_fixed"):
            ratio = f" ({base[k] / r[k]:.2f}x smg)" if base is not None and name != "smg" and r[k] > 0 else ""
            cells.append(f"{r[k]:,.0f}{ratio}")
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def report(title: str, text: str, results: object, json_path: str | None, out: Path) -> None:
    """Print a run's title and table, write its results as JSON where asked, and remove the callgrind dumps in
    `out` unless BENCH_KEEP_DUMPS is set (this script's, agent_instructions.py's and whole_instructions.py's end)."""
    print()
    print(title)
    print()
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=1))
    if not os.environ.get("BENCH_KEEP_DUMPS"):
        shutil.rmtree(out, ignore_errors=True)
    else:
        print(f"dumps kept in {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="gateway", help="comma list of: gateway, smg")
    ap.add_argument("--gateway-dir", default=str(BENCH.parent), help="the checkout whose gateway runs")
    ap.add_argument("--tokens", default="8,64", help="two stream lengths")
    ap.add_argument("--streams", type=int, default=40, help="streams counted per length")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--tpot-ms", type=int, default=30, help="the fake engine's pace")
    ap.add_argument("--start-timeout", type=float, default=240.0)
    ap.add_argument("--idle-s", type=float, default=10.0, help="the idle count's length (taken off each count)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args()
    a.tokens = [int(t) for t in a.tokens.split(",")]
    if len(a.tokens) != 2:
        ap.error("--tokens takes two lengths")
    for tool in ("valgrind", "callgrind_control", "taskset"):
        if shutil.which(tool) is None:
            sys.exit(f"bench: {tool} missing (apt-get install valgrind util-linux)")
    names = [n for n in a.targets.split(",") if n]
    out = Path(
        tempfile.mkdtemp(prefix="instructions-", dir=BENCH / "results" if (BENCH / "results").is_dir() else None)
    )
    engine_ports = (ps.free_port(), ps.free_port())
    engine = subprocess.Popen(
        [
            "taskset",
            "-c",
            "1",
            tg.PROJECT_PY,
            str(BENCH / "fake_engine.py"),
            "--port",
            f"{engine_ports[0]},{engine_ports[1]}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    results: dict[str, dict[str, float]] = {}
    try:
        for _ in range(100):
            if not ps.port_free(engine_ports[0]):
                break
            time.sleep(0.1)
        urls = [f"http://127.0.0.1:{p}" for p in engine_ports]
        for name in names:
            if name == "gateway":
                config = tg.write_gateway_config(out / "gateway.yaml", urls)
                cmd = tg.DEFAULT_GATEWAY_CMD.replace("{py}", tg.PROJECT_PY).replace("{config}", str(config))
                results[name] = measure(name, cmd, Path(a.gateway_dir), a, urls[0], out)
            elif name == "smg":
                if not tg.smg_available():
                    sys.exit("bench: smg is not installed (bench/run.sh --targets smg installs it)")
                cmd = tg.target_command("smg") or ""
                results[name] = measure(name, cmd, BENCH.parent, a, urls[0], out)
            else:
                sys.exit(f"bench: unknown target {name!r} (gateway, smg)")
    finally:
        engine.terminate()
        engine.wait(10)
    title = (
        f"**User-space instructions (callgrind)**, {a.streams} streams a length at c{a.concurrency}, "
        f"{a.tpot_ms} ms/token; gateway from {a.gateway_dir} on {Path(tg.PROJECT_PY).resolve()}"
    )
    report(title, table(results, a.tokens), results, a.json, out)


if __name__ == "__main__":
    main()
