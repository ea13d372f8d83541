"""The agent-sized table of one run (report.py prints it after the streamed dialects): bench/agent_request.py's
74 KB coding-agent request through each gateway target (as a team runs it, and minimal) next to smg and bare
aiohttp, whole (c1, c64) and streamed (c16), in chat completions, Anthropic messages and OpenAI responses, with
issue 36's goals: CPU per chat request ≤ smg's and ≤ 2x bare aiohttp's, messages and responses within 1.3x of
chat's.
"""

from __future__ import annotations

from typing import Any

GATEWAYS = ("gateway", "gateway-minimal")
PEERS = ("smg", "aiohttp")
# (scenario, what, the result's key, added (minus direct's), decimals)
ROWS = (
    ("ag_c1", "chat, c1: added p99, ms", "p99", True, 2),
    ("ag_c1", "chat, c1: CPU µs / request", "cpu_us_per_req", False, 0),
    ("ag_c64", "chat, c64: CPU µs / request", "cpu_us_per_req", False, 0),
    ("ag_c64", "chat, c64: req/s", "rps", False, 0),
    ("agmsg_c64", "messages, c64: CPU µs / request", "cpu_us_per_req", False, 0),
    ("agresp_c64", "responses, c64: CPU µs / request", "cpu_us_per_req", False, 0),
    ("agst_c16", "chat streamed, c16: CPU µs / stream", "cpu_us_per_req", False, 0),
    ("agst_c16", "chat streamed, c16: TTFT p50, ms", "ttft_p50", False, 2),
    ("agmsgst_c16", "messages streamed, c16: CPU µs / stream", "cpu_us_per_req", False, 0),
    ("agrespst_c16", "responses streamed, c16: CPU µs / stream", "cpu_us_per_req", False, 0),
)
SCENARIOS = tuple(dict.fromkeys(r[0] for r in ROWS))
SMG_GOAL, AIOHTTP_GOAL, DIALECT_GOAL = 1.0, 2.0, 1.3


def _v(res: dict[str, Any], target: str, scn: str, key: str) -> float | None:
    m = res.get(target, {}).get("scenarios", {}).get(scn, {})
    if not isinstance(m, dict) or m.get("skipped") or m.get("unavailable"):
        return None
    v = m.get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _fmt(v: float | None, nd: int) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _goal(label: str, v: float | None, base: float | None, goal: float) -> str:
    if v is None or base is None or base <= 0:
        return f"| {label} | ≤ {goal:g}x | - | - |"
    x = v / base
    return f"| {label} | ≤ {goal:g}x | {x:.2f}x | {'met' if x <= goal else '**not met**'} |"


def render(data: dict[str, Any]) -> list[str]:
    """The table; nothing for a run without agent-sized scenarios."""
    cfg = data.get("config", {})
    scns = set(cfg.get("scenarios", ()))
    if not scns & set(SCENARIOS):
        return []
    res = data.get("results", {})
    targets = [t for t in (*GATEWAYS, *PEERS, "naive", "litellm", "direct") if t in cfg.get("targets", ())]
    out = [
        "**Agent-sized requests** (bench/agent_request.py: a coding agent's 74 KB request, long system prompt, 20 "
        "tool schemas, 46 messages with tool calls and results; the same conversation in each API; whole answers "
        "from wrk, streams of 64 tokens at 1 ms; gateway = as a team runs it, gateway-minimal = keys, limits, "
        "least-load, metrics; messages and responses: the gateways only)",
        "",
        "| goal (issue 36) | target | value | met? |",
        "|---|---|---|---|",
    ]
    for g in GATEWAYS:
        if g not in targets:
            continue
        chat = _v(res, g, "ag_c64", "cpu_us_per_req")
        for peer, goal in (("smg", SMG_GOAL), ("aiohttp", AIOHTTP_GOAL)):
            if peer in targets:
                theirs = _v(res, peer, "ag_c64", "cpu_us_per_req")
                out.append(_goal(f"{g}: chat CPU / {peer}'s (c64)", chat, theirs, goal))
        for scn, api in (("agmsg_c64", "messages"), ("agresp_c64", "responses")):
            if scn in scns:
                ours = _v(res, g, scn, "cpu_us_per_req")
                out.append(_goal(f"{g}: {api} CPU / chat's (c64)", ours, chat, DIALECT_GOAL))
    out += ["", "| scenario | metric | " + " | ".join(targets) + " |", "|---|---|" + "---|" * len(targets)]
    for scn, what, key, added, nd in ROWS:
        if scn not in scns:
            continue
        base = _v(res, "direct", scn, key) if added else None
        cells = []
        for t in targets:
            v = _v(res, t, scn, key)
            if t == "direct":  # the engine alone: its absolute figure, and no proxy CPU of its own
                cells.append("-" if key.startswith("cpu") or v is None else f"(abs {_fmt(v, nd)})")
            elif added:
                cells.append(_fmt(None if v is None or base is None else v - base, nd))
            else:
                cells.append(_fmt(v, nd))
        out.append(f"| {scn} | {what} | " + " | ".join(cells) + " |")
    return [*out, ""]
