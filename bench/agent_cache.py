#!/usr/bin/env python3
"""Agent conversations against real engines: how much prompt the engines recompute, per routing strategy.

An agent workload (issue 37): N sessions of M turns, run concurrently (each session a closed loop: its next
turn goes out when the last one is answered, after `--think-ms`), every turn resending the growing
conversation: a shared system prompt and tool schemas, then the session's history (its first question, and
per turn the engine's answer and a tool result). For each strategy a fresh pair of llama-servers (the
binary and tiny GGUF setup_dev caches under ~/.cache/llm-gateway; tests/support/real_engines.py starts them,
`--parallel` slots each, `--metrics`) and a fresh gateway process in front of them, so no cache carries over.

`oracle` sends session s straight to engine s mod 2 (no gateway): the pinning a perfect router would do.
Every other row goes through the gateway with `strategy:` set to it.

Reported per strategy, from the engines' own counters: prompt tokens sent (the answers' `usage.prompt_tokens`)
and prompt tokens the engines computed (the rise of `llamacpp:prompt_tokens_total` on both engines: tokens
evaluated, the cached ones not counted), their ratio ("recomputed"), the requests each engine served, TTFT
p50/p95 (streamed) and errors. From the gateway: `gateway_prefix_match_ratio` (cache_aware only).

    PYTHONPATH=.:emulators python bench/agent_cache.py --sessions 4 --turns 4          # the small run
    PYTHONPATH=.:emulators python bench/agent_cache.py --sessions 16 --turns 12 \\
        --strategies oracle,round_robin,least_load,prefix_affinity,cache_aware --parallel 2

`smg` (or `smg:<policy>`, default `cache_aware`) puts smg 1.13 (`bench/.venvs/smg`, installed by bench/run.sh)
with that policy in front of the same two engines. smg names no backend in its answers: its row's requests per
engine are estimated from each engine's `llamacpp:tokens_predicted_total` over `--max-tokens` (marked ~), and its
session moves are not known (-).

`--replicas 3` runs three gateway processes in front of the engines and sends turn t of session s to replica
(s + t) mod 3 (a round-robin balancer in front of them, per request); `--redis` gives them a real redis-server
(`limits.store: redis`), through which cache_aware shares its placements (routing/placements.py).

`--engine vllm` runs two vLLM CPU servers (tests/support/real_engines.py's VllmServer: the tiny HF model, the v1
engine's prefix caching, on by default) instead: their computed prompt tokens are `vllm:prompt_tokens_total` less
`vllm:prefix_cache_hits_total` (both in tokens), smg's per-engine requests come from `vllm:generation_tokens_total`.

`--session-header claude-code` sends `x-claude-code-session-id` on every turn, as Claude Code does (then
prefix_affinity and cache_aware also have the session); the default sends none, so routing sees only prompts.
Engine flags go through `--engine-args` (e.g. `"--slot-prompt-similarity 0"`, `"--cache-ram 0"`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "emulators")]

from bench.routing_compare import free_port, start, stop  # noqa: E402
from tests.support.real_engines import LlamaServer, VllmServer  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

WORDS = ["read", "edit", "grep", "file", "line", "error", "test", "build", "module", "function", "value", "path"]
PROMPT_COUNTER = re.compile(rb"^llamacpp:prompt_tokens_total\s+([0-9.e+]+)", re.M)
PREDICTED_COUNTER = re.compile(rb"^llamacpp:tokens_predicted_total\s+([0-9.e+]+)", re.M)
#: vLLM (v1 engine, prefix caching on by default): prompt tokens received, and of them those found in its prefix
#: cache (tokens, not blocks: vllm/v1/metrics/loggers.py), so computed = prompt - hits; generated tokens for smg's row
VLLM_PROMPT = re.compile(rb"^vllm:prompt_tokens_total\{[^}]*\}\s+([0-9.e+]+)", re.M)
VLLM_HITS = re.compile(rb"^vllm:prefix_cache_hits_total\{[^}]*\}\s+([0-9.e+]+)", re.M)
VLLM_GENERATED = re.compile(rb"^vllm:generation_tokens_total\{[^}]*\}\s+([0-9.e+]+)", re.M)
SMG = ROOT / "bench" / ".venvs" / "smg" / "bin" / "smg"


def words(n: int, seed: int) -> str:
    out, i = [], seed
    while len(out) < n:
        i = (i * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(WORDS[i % len(WORDS)])
    return " ".join(out)


SYSTEM = "You are a coding agent working in a repository. " + words(480, 7)  # ~3,000 characters
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": words(30, k),
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
    for k, name in enumerate(("read_file", "edit_file", "run_tests"))
]


async def prompt_tokens_total(
    session: aiohttp.ClientSession, url: str, counter: re.Pattern[bytes] = PROMPT_COUNTER
) -> float:
    async with session.get(url + "/metrics") as r:
        m = counter.search(await r.read())
        return float(m.group(1)) if m else 0.0


async def computed_total(session: aiohttp.ClientSession, url: str, engine: str) -> float:
    """The prompt tokens an engine computed so far: llama-server counts only those it evaluated; vLLM counts
    every prompt token, and apart those its prefix cache held."""
    if engine == "llama-server":
        return await prompt_tokens_total(session, url)
    async with session.get(url + "/metrics") as r:
        text = await r.read()
    prompt, hits = VLLM_PROMPT.search(text), VLLM_HITS.search(text)
    return (float(prompt.group(1)) if prompt else 0.0) - (float(hits.group(1)) if hits else 0.0)


async def one_turn(
    http: aiohttp.ClientSession, url: str, msgs: list[dict[str, Any]], headers: dict[str, str], max_tokens: int
) -> tuple[str, int, float, str]:
    """(answer text, usage prompt tokens, TTFT s, backend) of one streamed turn."""
    body = {
        "model": "agent",
        "messages": msgs,
        "tools": TOOLS,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    t = time.perf_counter()
    ttft = 0.0
    text: list[str] = []
    prompt = 0
    async with http.post(url + "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status != 200:
            raise RuntimeError(f"{r.status}: {(await r.read())[:300]!r}")
        backend = r.headers.get("x-gateway-backend", url)
        async for line in r.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            ev = orjson.loads(line[6:])
            for c in ev.get("choices") or ():
                d = c.get("delta") or {}
                piece = d.get("content") or d.get("reasoning_content")
                if piece:
                    if not ttft:
                        ttft = time.perf_counter() - t
                    text.append(piece)
            if ev.get("usage"):
                prompt = int(ev["usage"].get("prompt_tokens") or 0)
    return "".join(text) or "(no text)", prompt, ttft or (time.perf_counter() - t), backend


async def workload(a: argparse.Namespace, targets: list[str], pin: bool) -> dict[str, Any]:
    """Run every session to its last turn; `pin`: session s goes to targets[s % 2] (the oracle)."""
    ttfts: list[float] = []
    sent = 0
    errors = 0
    by_backend: dict[str, int] = {}
    paths: dict[int, list[str]] = {s: [] for s in range(a.sessions)}
    # llama-server closes a connection after a streamed answer (adapters/llama_server.py): straight to it, none
    # is reused; the gateway keeps its own connections alive
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=pin)) as http:

        async def session(s: int) -> None:
            nonlocal sent, errors
            url = targets[s % len(targets)]
            headers = {"x-claude-code-session-id": f"bench-session-{s}"} if a.session_header == "claude-code" else {}
            msgs: list[dict[str, Any]] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f"Task {s}: " + words(60, 1000 + s)},
            ]
            await asyncio.sleep(s * a.stagger_ms / 1000)
            for t in range(a.turns):
                if not pin:  # the gateway replicas take turns (one replica: always the same)
                    url = targets[(s + t) % len(targets)]
                try:
                    answer, prompt, ttft, backend = await one_turn(http, url, msgs, headers, a.max_tokens)
                except (RuntimeError, aiohttp.ClientError) as e:
                    errors += 1
                    print(f"session {s} turn {t}: {e}", file=sys.stderr)
                    return
                sent += prompt
                ttfts.append(ttft)
                by_backend[backend] = by_backend.get(backend, 0) + 1
                paths[s].append(backend)
                msgs.append({"role": "assistant", "content": answer})
                msgs.append({"role": "user", "content": f"Tool result {t}: " + words(a.tool_words, 50 * s + t)})
                await asyncio.sleep(a.think_ms / 1000)

        await asyncio.gather(*(session(s) for s in range(a.sessions)))
    moves = sum(sum(1 for x, y in itertools.pairwise(p) if x != y) for p in paths.values())
    return {"sent": sent, "ttfts": ttfts, "by": by_backend, "errors": errors, "moves": moves, "paths": paths}


def gateway_config(
    strategy: str, urls: list[str], parallel: int, affinity: str, redis: str | None = None, engine: str = "llama-server"
) -> str:
    fmt = "gguf" if engine == "llama-server" else "safetensors"
    backends = "".join(
        f'  - {{name: e{i}, engine: {engine}, url: "{u}", capacity: {parallel}, probe: {{interval_s: 0.5}}}}\n'
        for i, u in enumerate(urls)
    )
    deps = "".join(
        f"      - {{backend: e{i}, model: agent, format: {fmt}, capabilities: [chat, tools]}}\n"
        for i in range(len(urls))
    )
    return f"""
server: {{access_log: false}}
auth: {{mode: none}}
{f'limits: {{store: redis, redis_url: "{redis}"}}' if redis else ""}
backends:
{backends}models:
  - name: agent
    strategy: {strategy}
    affinity: {affinity}
    deployments:
{deps}"""


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] * 1000 if xs else 0.0


async def metric_lines(url: str, prefix: str) -> list[str]:
    async with aiohttp.ClientSession() as http, http.get(url + "/metrics") as r:
        return [ln for ln in (await r.text()).splitlines() if ln.startswith(prefix)]


def run_one(a: argparse.Namespace, strategy: str) -> dict[str, Any]:
    extra = shlex.split(a.engine_args)
    engines: list[Any] = []
    for _ in range(2):
        if a.engine == "vllm":  # tools need a parser (vLLM refuses `tools` without one); prefix caching is its default
            tools = ("--enable-auto-tool-choice", "--tool-call-parser", "pythonic")
            eng: Any = VllmServer(
                served_model_name="agent", max_model_len=a.ctx, max_num_seqs=a.parallel, extra_args=(*tools, *extra)
            )
        else:
            eng = LlamaServer(alias="agent", parallel=a.parallel, ctx_size=a.ctx, threads=1, extra_args=extra)
        engines.append(eng)
        eng.start()
    gws: list[Any] = []
    cfg_path = None
    redis = None
    try:
        urls = [e.url for e in engines]

        async def counters() -> list[float]:
            async with aiohttp.ClientSession() as http:
                return [await computed_total(http, u, a.engine) for u in urls]

        generated = PREDICTED_COUNTER if a.engine == "llama-server" else VLLM_GENERATED

        async def predicted() -> list[float]:
            async with aiohttp.ClientSession() as http:
                return [await prompt_tokens_total(http, u, generated) for u in urls]

        before = asyncio.run(counters())
        predicted_before = asyncio.run(predicted())
        if strategy == "oracle":
            targets, pin = urls, True
        elif strategy.startswith("smg"):
            port = free_port()
            policy = strategy.partition(":")[2] or "cache_aware"
            cmd = [str(SMG), "launch", "--worker-urls", *urls, "--policy", policy, "--host", "127.0.0.1"]
            cmd += ["--port", str(port), "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
            gws.append(start([*cmd, "--log-level", "warn"], ready_url=f"http://127.0.0.1:{port}/health"))
            time.sleep(2.0)  # its workers' health checks
            targets, pin = [f"http://127.0.0.1:{port}"], False
        else:
            if a.redis:
                redis = RedisServer(Path(tempfile.mkdtemp(prefix="agent-cache-redis-"))).start()
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                f.write(gateway_config(strategy, urls, a.parallel, a.affinity, redis.url if redis else None, a.engine))
            cfg_path = f.name
            targets, pin = [], False
            for _ in range(a.replicas):
                port = free_port()
                cmd = [sys.executable, "-m", "llm_gateway", "serve", "--config", cfg_path, "--port", str(port)]
                gws.append(start(cmd, ready_url=f"http://127.0.0.1:{port}/readyz"))
                targets.append(f"http://127.0.0.1:{port}")
            time.sleep(1.0)  # the first probes
        t0 = time.perf_counter()
        out = asyncio.run(workload(a, targets, pin))
        out["wall_s"] = time.perf_counter() - t0
        after = asyncio.run(counters())
        out["computed"] = sum(after) - sum(before)
        out["per_engine_computed"] = [x - y for x, y in zip(after, before, strict=True)]
        if strategy.startswith("smg"):  # no backend named in its answers: estimated from the engines' counters
            pred = [x - y for x, y in zip(asyncio.run(predicted()), predicted_before, strict=True)]
            out["by"] = {f"e{i}": f"~{round(p / a.max_tokens)}" for i, p in enumerate(pred)}
            out["moves"] = "-"
        if gws and strategy == "cache_aware":
            out["match"] = [ln for t in targets for ln in asyncio.run(metric_lines(t, "gateway_prefix_match_ratio_"))]
        if pin:  # name the engines as the gateway does
            out["by"] = {f"e{urls.index(u)}": n for u, n in out["by"].items()}
        return out
    finally:
        for gw in gws:
            stop(gw)
        if redis is not None:
            redis.stop()
        if cfg_path:
            os.unlink(cfg_path)
        for e in engines:
            e.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--strategies", default="oracle,round_robin,least_load,prefix_affinity,cache_aware")
    ap.add_argument("--engine", choices=["llama-server", "vllm"], default="llama-server")
    ap.add_argument("--parallel", type=int, default=2, help="slots per llama-server (vLLM: --max-num-seqs)")
    ap.add_argument(
        "--ctx", type=int, default=16384, help="llama-server -c (split over its slots); vLLM: max model len"
    )
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--tool-words", type=int, default=80, help="words of tool output added per turn")
    ap.add_argument("--think-ms", type=float, default=0)
    ap.add_argument("--stagger-ms", type=float, default=50, help="sessions start this far apart")
    ap.add_argument("--replicas", type=int, default=1, help="gateway processes, taking turns per request")
    ap.add_argument("--redis", action="store_true", help="the replicas share a real redis-server (limits.store)")
    ap.add_argument("--session-header", choices=["none", "claude-code"], default="none")
    ap.add_argument("--affinity", default="{}", help='the model\'s affinity knobs, e.g. "{load_weight: 0.25}"')
    ap.add_argument("--engine-args", default="", help='extra llama-server flags, e.g. "--slot-prompt-similarity 0"')
    a = ap.parse_args()
    rows = []
    for strategy in a.strategies.split(","):
        r = run_one(a, strategy)
        rows.append((strategy, r))
        paths = " ".join("".join(b[-1] for b in p) for p in r["paths"].values())
        print(f"{strategy}: {r['by']} sent {r['sent']} computed {r['computed']:.0f} paths {paths}", file=sys.stderr)
    print(
        f"\n{a.sessions} sessions x {a.turns} turns, 2 {a.engine}s x {a.parallel} slots (-c {a.ctx}), "
        f"max_tokens {a.max_tokens}, session header: {a.session_header}, engine args: {a.engine_args or '-'}, "
        f"affinity: {a.affinity}, gateway replicas: {a.replicas}{' sharing Redis' if a.redis else ''}\n"
    )
    print("| strategy | requests e0/e1 | session moves | prompt tokens sent | computed by engines | recomputed "
          "| TTFT p50 ms | TTFT p95 ms | wall s | errors |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in rows:
        share = r["computed"] / r["sent"] if r["sent"] else 0.0
        split = f"{r['by'].get('e0', 0)}/{r['by'].get('e1', 0)}"
        print(
            f"| {name} | {split} | {r['moves']} | {r['sent']} | {r['computed']:.0f} | {100 * share:.1f}% "
            f"| {pct(r['ttfts'], 50):.0f} | {pct(r['ttfts'], 95):.0f} | {r['wall_s']:.1f} | {r['errors']} |"
        )
    for name, r in rows:
        if "match" in r:
            print(f"\n{name}: " + "; ".join(ln for ln in r["match"] if "_sum" in ln or "_count" in ln))
    if rows:
        print("\nmean TTFT ms: " + ", ".join(f"{n} {1000 * statistics.mean(r['ttfts'] or [0]):.0f}" for n, r in rows))


if __name__ == "__main__":
    main()
