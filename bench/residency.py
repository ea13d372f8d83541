#!/usr/bin/env python3
"""Residency-aware selection against least load alone: time to first token when models must load.

Two Ollama backends with one resident model each (OLLAMA_MAX_LOADED_MODELS=1), both serving models X
and Y, behind the gateway as a real process (least_load, probes every 0.5 s). Before each run X is
loaded on backend 1 and Y on backend 2 and the gateway's probes have seen it; then one client sends N
streamed chat requests alternating X, Y, X, ... (one at a time, so each request's cold load is known
exactly: the backend that answered it, from `x-gateway-backend`, did not have its model loaded in
`/api/ps` just before). The run is done with `routing.prefer_resident` true (the default: a cold load
counts as a slot of load) and false (least load alone: equal loads take turns), each with a fresh
gateway. Prints TTFT p50/p95 (first content delta, at the client), the ratio least-load / residency,
and how many requests paid a cold load.

Backends: two Ollama emulators (`python -m llm_gateway_emulators ollama`) with a cold load of
`--load-s` (2 s by default: a 7-8B GGUF from the page cache on one GPU), and with `--real` two real
Ollama processes (tests/support/real_engines.py OllamaServer; X and Y two builds of the tiny GGUF,
whose load is the runner's start: well under a second) when Ollama is installed.

    .venv/bin/python bench/residency.py [--requests 40] [--load-s 2.0] [--real]

Not part of the test verdicts; traffic on 127.0.0.1 only; stops only what it started.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.gateway_process import GatewayProcess  # noqa: E402
from tests.support.real_engines import (  # noqa: E402
    EngineNotInstalled,
    OllamaServer,
    free_port,
    tiny_gguf,
)

X, Y = "res-x", "res-y"
SERVERS = ("s1", "s2")
MODES = (("residency", True), ("least_load", False))

CONFIG = """
server: {{access_log: false{client}}}
auth: {{mode: none}}
routing: {{retries: 0, prefer_resident: {prefer}}}
backends:
  - {{name: s1, engine: ollama, url: "{s1}", probe: {{interval_s: 0.5}}}}
  - {{name: s2, engine: ollama, url: "{s2}", probe: {{interval_s: 0.5}}}}
models:
{models}
"""


def gateway_config(urls: dict[str, str], prefer_resident: bool, upstream_client: str | None = None) -> str:
    caps = "format: gguf, capabilities: [chat, completions]"
    models = "\n".join(
        f"  - {{name: {m}, strategy: least_load, "  # named: the strategy it measures (two deployments default to
        f"deployments: [{{backend: s1, model: {m}, {caps}}}, {{backend: s2, model: {m}, {caps}}}]}}"  # cache_aware)
        for m in (X, Y)
    )
    client = f", upstream_client: {upstream_client}" if upstream_client else ""
    prefer = "true" if prefer_resident else "false"
    return CONFIG.format(prefer=prefer, client=client, models=models, **urls)


# -- backends ---------------------------------------------------------------------------------------------------------


@contextmanager
def emulated(load_s: float, ttft_ms: float, tpot_ms: float) -> Iterator[dict[str, str]]:
    procs: list[subprocess.Popen[bytes]] = []
    urls: dict[str, str] = {}
    try:
        for name in SERVERS:
            port = free_port()
            cmd = [sys.executable, "-m", "llm_gateway_emulators", "ollama", "--port", str(port), "--model", X]
            cmd += ["--load-delay-s", str(load_s), "--ttft-ms", str(ttft_ms), "--tpot-ms", str(tpot_ms)]
            cmd += ["--set", f"extra_models={json.dumps([Y])}", "--set", "max_loaded_models=1"]
            p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            procs.append(p)
            assert p.stdout is not None
            line = p.stdout.readline()
            if b"listening on" not in line:
                raise RuntimeError(f"emulator did not start: {line!r}")
            urls[name] = f"http://127.0.0.1:{port}"
        yield urls
    finally:
        for p in procs:  # each by its own PID
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


@contextmanager
def real(workdir: Path) -> Iterator[dict[str, str]]:
    servers: list[OllamaServer] = []
    try:
        y_gguf = tiny_gguf("--seed", "4321")
        for name in SERVERS:
            eng = OllamaServer(
                model_name=X,
                num_parallel=1,
                workdir=workdir / name,
                env={"OLLAMA_MAX_LOADED_MODELS": "1"},
            )
            servers.append(eng)
            eng.start()
            eng.create_model(Y, y_gguf, eng.workdir / "Modelfile-y")
        yield {name: eng.url for name, eng in zip(SERVERS, servers, strict=True)}
    finally:
        for eng in servers:
            eng.stop()


def load(url: str, model: str) -> None:
    r = httpx.post(url + "/api/generate", json={"model": model}, timeout=120)
    r.raise_for_status()


def loaded(url: str) -> set[str]:
    r = httpx.get(url + "/api/ps", timeout=10)
    r.raise_for_status()
    return {str(m["name"]).removesuffix(":latest") for m in r.json()["models"]}


# -- one run ----------------------------------------------------------------------------------------------------------


@dataclass
class Run:
    backend: str
    mode: str
    ttft_s: list[float]
    cold: int
    errors: int

    def pct(self, p: float) -> float:
        xs = sorted(self.ttft_s)
        return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else float("nan")


def wait(cond: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def seen(gw: GatewayProcess, where: dict[str, str]) -> bool:
    text = httpx.get(gw.url + "/metrics", timeout=5).text
    return all(
        f'gateway_deployment_resident{{backend="{s}",model="{m}",upstream_model="{m}"}} {1.0 if where[s] == m else 0.0}'
        in text
        for s in SERVERS
        for m in (X, Y)
    )


def ttft(client: httpx.Client, model: str, tokens: int) -> tuple[float | None, str]:
    """Time to the first content delta of a streamed chat, and the backend that answered."""
    body = {"model": model, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": tokens, "stream": True}
    t0 = time.perf_counter()
    first: float | None = None
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        backend = r.headers.get("x-gateway-backend", "?")
        if r.status_code != 200:
            r.read()
            return None, backend
        for line in r.iter_lines():
            if first is None and line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                first = time.perf_counter() - t0
    return first, backend


@dataclass(frozen=True)
class Workload:
    requests: int
    tokens: int
    upstream_client: str | None
    workdir: Path


def run(urls: dict[str, str], kind: str, mode: str, prefer: bool, w: Workload) -> Run:
    place = {"s1": X, "s2": Y}
    for s, m in place.items():
        load(urls[s], m)
    cfg = gateway_config(urls, prefer, w.upstream_client)
    with GatewayProcess(cfg, w.workdir, name=f"gateway-{kind}-{mode}") as gw:
        wait(lambda: seen(gw, place), "the probes to see X on s1 and Y on s2")
        out = Run(kind, mode, [], 0, 0)
        with httpx.Client(base_url=gw.url, timeout=300) as client:
            for i in range(w.requests):
                model = X if i % 2 == 0 else Y
                before = {s: loaded(u) for s, u in urls.items()}
                t, backend = ttft(client, model, w.tokens)
                if t is None:
                    out.errors += 1
                    continue
                out.ttft_s.append(t)
                out.cold += model not in before.get(backend, set())
    return out


def report(runs: list[Run]) -> str:
    lines = [
        "| backend | selection | requests | TTFT p50 ms | TTFT p95 ms | cold loads | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        cells = [r.backend, r.mode, len(r.ttft_s), f"{r.pct(50):.1f}", f"{r.pct(95):.1f}", r.cold, r.errors]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    for kind in dict.fromkeys(r.backend for r in runs):
        by = {r.mode: r for r in runs if r.backend == kind}
        res, base = by.get("residency"), by.get("least_load")
        if res and base and res.ttft_s and base.ttft_s:
            p50 = base.pct(50) / max(res.pct(50), 1e-9)
            p95 = base.pct(95) / max(res.pct(95), 1e-9)
            mean = statistics.fmean(base.ttft_s) / max(statistics.fmean(res.ttft_s), 1e-9)
            lines.append(
                f"\n{kind}: least-load / residency TTFT: p50 x{p50:.1f}, p95 x{p95:.1f}, mean x{mean:.1f}; "
                f"cold loads {base.cold} vs {res.cold} of {len(base.ttft_s)}"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40, help="requests per run, alternating X and Y (max 1000)")
    ap.add_argument("--tokens", type=int, default=8, help="max_tokens of each request")
    ap.add_argument("--load-s", type=float, default=2.0, help="the emulators' cold load")
    ap.add_argument("--ttft-ms", type=float, default=30.0, help="the emulators' time to first token when loaded")
    ap.add_argument("--tpot-ms", type=float, default=10.0)
    ap.add_argument("--real", action="store_true", help="also two real Ollama processes, if Ollama is installed")
    ap.add_argument("--upstream-client", choices=("h1", "aiohttp", "httpx"), help="default: the gateway's own default")
    a = ap.parse_args()
    requests = max(2, min(a.requests, 1000))
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="bench-residency-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        w = Workload(requests, a.tokens, a.upstream_client, work)
        kinds = [("emulator", stack.enter_context(emulated(a.load_s, a.ttft_ms, a.tpot_ms)))]
        if a.real:
            try:
                kinds.append(("real-ollama", stack.enter_context(real(work))))
            except EngineNotInstalled as e:
                print(f"--real: Ollama not installed ({e}); emulator only", file=sys.stderr)
        for kind, urls in kinds:
            for mode, prefer in MODES:
                runs.append(run(urls, kind, mode, prefer, w))
                print(f"{kind} {mode}: done", file=sys.stderr, flush=True)
    print(report(runs))


if __name__ == "__main__":
    main()
