"""What cache-aware routing costs on the request path, per request, for agent-sized bodies (issue 37).

Builds an agent conversation of about `--kb` KB (a system prompt, tool schemas, user turns, assistant turns
with tool calls, tool results), then times, each over many rounds, with the parse the gateway does anyway
for scale:

- `orjson.loads` of the body (done for every request already) and `read_request` (likewise);
- `prompt_blocks`: rendering the conversation and hashing its blocks (prefix_cache.py), once per request;
- `annotate` for two candidates holding the previous turn (two binary searches);
- `placed`: recording the request's blocks on the chosen deployment (an LRU touch per block).

Usage: python bench/prefix_cost.py [--kb 200] [--block 1024] [--rounds 300]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import orjson

from llm_gateway.routing.prefix_cache import PrefixRecord, annotate, placed, prompt_blocks
from llm_gateway.routing.request_info import read_request
from llm_gateway.routing.selection import CandidateView
from llm_gateway.settings import AffinityConfig

WORDS = ["the", "function", "reads", "a", "file", "and", "returns", "its", "lines;", "errors", "go", "to", "caller"]


def text(n: int, seed: int) -> str:
    out, i = [], seed
    size = 0
    while size < n:
        w = WORDS[i % len(WORDS)]
        out.append(w)
        size += len(w) + 1
        i = i * 7 + 3
    return " ".join(out)[:n]


def agent_body(kb: int) -> dict[str, Any]:
    """A coding agent's request of about `kb` KB: system 12 KB, 24 tools, then turns until the size."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": text(600, i),
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string", "description": text(80, i)}},
                },
            },
        }
        for i in range(24)
    ]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": text(12_000, 1)}]
    size, t = len(orjson.dumps(tools)) + 12_000, 0
    while size < kb * 1000:
        msgs.append({"role": "user", "content": text(400, t)})
        call = {"id": f"call_{t}", "type": "function", "function": {"name": "tool_3", "arguments": '{"path": "a.py"}'}}
        msgs.append({"role": "assistant", "content": text(300, t + 1), "tool_calls": [call]})
        msgs.append({"role": "tool", "tool_call_id": f"call_{t}", "content": text(3000, t + 2)})
        size += 3800
        t += 1
    return {"model": "agent", "messages": msgs, "tools": tools, "stream": True}


def per_call(fn: Callable[[], object], rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(5):  # the best of 5 batches: the machine is shared
        t = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, (time.perf_counter() - t) / rounds)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kb", type=int, default=200)
    ap.add_argument("--block", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=300)
    a = ap.parse_args()
    body = agent_body(a.kb)
    raw = orjson.dumps(body)
    cfg = AffinityConfig(block_bytes=a.block)
    info = read_request("chat", orjson.loads(raw))
    pb = prompt_blocks(info.conversation, info.tools_json, a.block)
    prev = dict(body, messages=body["messages"][:-3])  # the turn before: what the engines hold
    prev_info = read_request("chat", prev)
    records = [PrefixRecord(), PrefixRecord()]
    placed(records[0], [], prev_info, None, cfg, 1.0)

    def route() -> None:
        info.blocks = None  # hash again every round: the per-request cost
        views = [CandidateView("a", 0, 2, False, None, 0), CandidateView("b", 0, 2, False, None, 0)]
        annotate(views, records, info, "session-1", cfg, 2.0)

    def record() -> None:
        placed(records[1], [records[0]], info, "session-1", cfg, 2.0)

    print(f"body {len(raw) / 1000:.0f} KB, {len(body['messages'])} messages, rendered {pb.size / 1000:.0f} KB")
    held = pb.share(records[0].matched(pb.keys, 2.0, 3600))
    print(f"blocks of {a.block} B: {len(pb.keys)}; match of the turn before: {held:.3f}")
    print(f"orjson.loads (already paid)        {per_call(lambda: orjson.loads(raw), a.rounds):8.1f} us")
    print(f"read_request (already paid)        {per_call(lambda: read_request('chat', body), a.rounds):8.1f} us")
    hashing = per_call(lambda: prompt_blocks(info.conversation, info.tools_json, a.block), a.rounds)
    print(f"prompt_blocks: render + hash       {hashing:8.1f} us")
    print(f"route: hash + 2 candidates' match  {per_call(route, a.rounds):8.1f} us")
    print(f"placed: record on the chosen one   {per_call(record, a.rounds):8.1f} us")


if __name__ == "__main__":
    main()
