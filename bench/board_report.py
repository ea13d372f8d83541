"""The public boards' view of one run (report.py prints it first): the gateway's ratios to each other proxy
first, then one column per proxy with the figures the boards publish (CPU per request and per streamed event,
added p99 at concurrency 1, the throughput frontier, added TTFT and inter-event gap at a 20 ms pace, the most
stall-free streams, RSS idle / under load / after), and the machine it ran on. The values table is the one
README.md's performance section carries. Added = the proxy's figure minus direct's (the engine alone).
"""

from __future__ import annotations

from typing import Any

# rows of the per-proxy table, in the order of the table; direct last (the floor)
PROXIES = (
    ("gateway", "this gateway as a team runs it (budgets, ledger, fair queuing, admin, metrics)"),
    ("gateway-minimal", "this gateway, minimal (keys with limits, least-load, metrics)"),
    ("smg", "SGLang/Shepherd model gateway `smg` (Rust)"),
    ("aiohttp", "aiohttp server + client, bare (no features)"),
    ("naive", "FastAPI + httpx as usually written"),
    ("litellm", "LiteLLM proxy, one worker"),
    ("direct", "direct (the fake engine alone)"),
)
RATIO_TO = ("smg", "aiohttp", "litellm", "naive")


def _v(s: dict[str, Any], scn: str, *keys: str) -> float | None:
    v: object = s.get(scn, {})
    for k in keys:
        v = v.get(k) if isinstance(v, dict) else None
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


# (label, scenario, keys, added (minus direct's), lower is better, decimals)
METRICS: tuple[tuple[str, str, tuple[str, ...], bool, bool, int], ...] = (
    ("CPU µs / request (c64)", "ns_c64", ("cpu_us_per_req",), False, True, 0),
    ("CPU µs / streamed event (st64_c16)", "st64_c16", ("cpu_us_per_chunk",), False, True, 1),
    ("CPU µs / 74 KB agent request (ag_c64)", "ag_c64", ("cpu_us_per_req",), False, True, 0),
    ("CPU µs / 74 KB agent stream (agst_c16)", "agst_c16", ("cpu_us_per_req",), False, True, 0),
    ("CPU µs / streamed token, marginal (st_split)", "st_split", ("cpu_us_per_token",), False, True, 1),
    ("CPU µs / stream, fixed (st_split)", "st_split", ("cpu_us_per_stream_fixed",), False, True, 0),
    ("req/s at c64", "ns_c64", ("rps",), False, False, 0),
    ("added p99 at c1, ms", "ns_c1", ("p99",), True, True, 2),
    ("added p99 at c1, 74 KB agent request, ms", "ag_c1", ("p99",), True, True, 2),
    ("frontier req/s, p99 < 1 ms", "frontier", ("best_rps", "1"), False, False, 0),
    ("frontier req/s, p99 < 5 ms", "frontier", ("best_rps", "5"), False, False, 0),
    ("frontier req/s, p99 < 10 ms", "frontier", ("best_rps", "10"), False, False, 0),
    ("frontier req/s, p99 < 50 ms", "frontier", ("best_rps", "50"), False, False, 0),
    ("added TTFT p50 at 20 ms/token, ms", "pace20_c16", ("ttft_p50",), True, True, 2),
    ("added inter-event gap p99 at 20 ms/token, ms", "pace20_c16", ("gap_p99",), True, True, 2),
    ("stall-free streams at 20 ms/token", "stall20", ("max_streams",), False, False, 0),
    ("RSS idle, MB", "rss_plateau", ("idle_mb",), False, True, 0),
    ("RSS under load (c64), MB", "rss_plateau", ("load_mb",), False, True, 0),
    ("RSS after load, MB", "rss_plateau", ("after_mb",), False, True, 0),
)
Metric = tuple[str, str, tuple[str, ...], bool, bool, int]


def value(m: Metric, s: dict[str, Any], d: dict[str, Any] | None) -> float | None:
    """The metric of one target's scenarios `s`; an added metric minus direct's `d` (None: absolute)."""
    _, scn, keys, added, _, _ = m
    v = _v(s, scn, *keys)
    if not added or d is None or v is None:
        return v
    base = _v(d, scn, *keys)
    return None if base is None else v - base


def _fmt(v: float | None, nd: int) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def _ratio(g: float | None, o: float | None, lower_is_better: bool) -> str:
    if g is None or o is None or g <= 0 or o <= 0:
        return "-"
    x = o / g if lower_is_better else g / o
    return f"{x:.2f}x" if x < 10 else f"{x:,.0f}x"


def cpu_idle(cfg: dict[str, Any]) -> str:
    """How the CPUs idled during the run (bench/cpu_idle.py): "not recorded" for a run from before it was."""
    idle = cfg.get("cpu_idle")
    if not isinstance(idle, dict):
        return "not recorded"
    return f"{idle.get('latency_request', '?')} (cpuidle {idle.get('driver', '?')})"


def machine(data: dict[str, Any]) -> str:
    v = data.get("versions", {})
    smg = v.get("smg_venv", {}).get("smg")
    return (
        f"{v.get('cpu', '?')}, {v.get('ncpu', '?')} cores, kernel {v.get('kernel', '?')}, Python {v.get('python', '?')}"
        + (f" at {v['interpreter']}" if v.get("interpreter") else "")
        + (f", smg {smg}" if smg else "")
        + f"; CPU idle: {cpu_idle(data.get('config', {}))}; git {v.get('git', '?')}, {data.get('date', '?')}"
    )


def render(data: dict[str, Any]) -> list[str]:
    """The board tables; nothing for a run with no board scenario and no peer proxy (e.g. the dialects)."""
    cfg = data.get("config", {})
    scns = set(cfg.get("scenarios", ()))
    peers = set(cfg.get("targets", ())) & set(RATIO_TO)
    if not scns & {"frontier", "pace20_c16", "stall20", "rss_plateau", "st_split"} and not (
        peers and scns & {"ns_c1", "ns_c64", "st64_c16", "ag_c1", "ag_c64", "agst_c16"}
    ):
        return []  # neither a board scenario nor a peer to compare the gateway with
    res = data.get("results", {})
    skipped = data.get("skipped", {})
    targets = cfg.get("targets", [])
    d = res.get("direct", {}).get("scenarios", {})
    rows = [(n, label) for n, label in PROXIES if n in targets]  # the columns of the values table
    pace = cfg.get("board", {}).get("stall", {}).get("tpot_ms", 20)
    stall_label = f"stall-free streams at {pace:g} ms/token"
    all_metrics = [(stall_label, *m[1:]) if m[1] == "stall20" else m for m in METRICS]
    scn_of = {n: res.get(n, {}).get("scenarios", {}) for n, _ in rows}
    metrics = [m for m in all_metrics if any(value(m, scn_of[n], d) is not None for n, _ in rows)]
    out = [f"**Public-board view** ({machine(data)}; command `{data.get('command', '?')}`)", ""]
    g = res.get("gateway", {}).get("scenarios", {})
    others = [o for o in RATIO_TO if o in targets]
    if g and others:
        out += [
            "Ratios, the gateway against each (> 1: the gateway is better on that line; CPU first, it barely moves "
            "on a busy box):",
            "",
            "| metric | " + " | ".join(f"gateway vs {o}" for o in others) + " |",
            "|---|" + "---|" * len(others),
        ]
        for m in metrics:
            gv = value(m, g, d)
            cells = []
            for o in others:
                ov = value(m, res.get(o, {}).get("scenarios", {}), d)
                cells.append("n/a" if o in skipped else _ratio(gv, ov, m[4]))
            out.append(f"| {m[0]} | " + " | ".join(cells) + " |")
        out.append("")
    cols = [(n, label) for n, label in rows if n not in skipped]
    out += [
        "| metric | " + " | ".join(label for _, label in cols) + " |",
        "|---|" + "---|" * len(cols),
    ]
    for m in metrics:  # direct: its own absolute values (no proxy process: no CPU or RSS of its own)
        cells = [
            _fmt(value(m, res.get(n, {}).get("scenarios", {}), None if n == "direct" else d), m[5]) for n, _ in cols
        ]
        out.append(f"| {m[0]} | " + " | ".join(cells) + " |")
    out += [f"\n{label}: skipped, {skipped[n]}" for n, label in rows if n in skipped]
    out += ["", *_notes(res, targets), ""]
    return out


def _notes(res: dict[str, Any], targets: list[str]) -> list[str]:
    out = [
        "Pinned: proxy on CPU 0, engine + load on CPU 1, auth on wherever the proxy has it; the direct column shows "
        "the engine's absolute values where the others show added ones. Frontier: open-loop fixed-rate steps, "
        "the highest sustained req/s (≥ 99 % answered, ≤ 0.1 % errors) whose p99 stayed under the bound; a load "
        "core at 100 % (cpu1) means the client, not the proxy, set the limit. Stall-free streams: the highest "
        "step with every stream complete, no gap over 10x the pace and all N open at once."
    ]
    for n in targets:
        s = res.get(n, {}).get("scenarios", {})
        st = s.get("stall20")
        if isinstance(st, dict) and st.get("steps"):
            last = st["steps"][-1]
            kb = [x["kb_per_stream"] for x in st["steps"] if x.get("kb_per_stream") is not None]
            msg = f"- stall20 {n}: {st['max_streams']:,} streams stall-free"
            if not last["passed"]:
                msg += (
                    f"; at {last['n']:,}: {last['ok']:,} ok, {last['stalled']:,} stalled (max gap "
                    f"{last['max_gap']:.0f} ms), {last['errors']} errors, cpu1 {last['cpu1_pct']:.0f}%"
                )
            if st.get("fd_cap"):
                c = st["fd_cap"]
                msg += f"; {c['requested']:,} not run: fd hard limit {c['fd_hard_limit']:,} allows {c['cap']:,}"
            if kb:
                msg += f"; RSS per open stream ~{max(kb[-1], 0):.0f} KB"
            out.append(msg)
        fr = s.get("frontier")
        if isinstance(fr, dict) and fr.get("steps"):
            top = fr["steps"][-1]
            out.append(
                f"- frontier {n}: last step {top['rate']:,.0f}/s: {top['rps']:,.0f} ok/s, p99 {top['p99']:.1f} ms, "
                f"cpu1 {top['cpu1_pct']:.0f}%"
                + (" (the highest rate asked for: the frontier may lie above)" if fr.get("capped_by_rates") else "")
            )
    return out
