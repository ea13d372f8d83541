"""bench/opcounts.py, bytecodes per request by function: the file names it groups by, its diff of two runs,
and real runs of the gateway under its trace function (a few seconds each), whose counts must repeat and
must see the gateway's own request path."""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import opcounts  # noqa: E402

STDLIB = sysconfig.get_paths()["stdlib"]


def test_files_are_named_short_and_grouped_by_what_they_belong_to() -> None:
    cases = {
        "/work/x/llm_gateway/access/memory.py": ("llm_gateway/access/memory.py", "llm_gateway/access"),
        "/work/x/llm_gateway/app.py": ("llm_gateway/app.py", "llm_gateway (top-level modules)"),
        "/v/lib/python3.11/site-packages/uvicorn/protocols/http/httptools_impl.py": (
            "uvicorn/protocols/http/httptools_impl.py",
            "uvicorn",
        ),
        f"{STDLIB}/asyncio/locks.py": ("stdlib/asyncio/locks.py", "stdlib/asyncio"),
        f"{STDLIB}/_weakrefset.py": ("stdlib/_weakrefset.py", "stdlib/_weakrefset"),
        "<string>": ("<string>", "<string>"),
    }
    for path, (short, component) in cases.items():
        assert opcounts.short(path) == short, path
        assert opcounts.component(short) == component, path


def _data(n: int, rows: list[tuple[str, str, int, int]]) -> dict[str, Any]:
    return {"config": {"requests": n}, "functions": [list(r) for r in rows]}


def test_counts_are_per_request_keyed_without_line_numbers_and_diffed_by_function() -> None:
    a = _data(10, [("/p/llm_gateway/a.py", "f", 10, 1000), ("/p/llm_gateway/a.py", "g", 20, 500)])
    # f moved down its file, g got cheaper, h is new
    b = _data(
        20,
        [
            ("/p/llm_gateway/a.py", "f", 14, 2000),
            ("/p/llm_gateway/a.py", "g", 24, 600),
            ("/p/llm_gateway/b.py", "h", 1, 40),
        ],
    )
    assert opcounts.per_function(a) == {("llm_gateway/a.py", "f"): 100.0, ("llm_gateway/a.py", "g"): 50.0}
    text = opcounts.diff(a, b)
    first, *moves = text.splitlines()
    assert first == "bytecodes per request: 150 -> 132 (-18, -12.0 %)"
    assert moves == ["     -20.0  g  (llm_gateway/a.py)", "      +2.0  h  (llm_gateway/b.py)"]  # f: no move, not listed


def _run(tmp_path: Path, **kw: Any) -> dict[str, Any]:
    a = argparse.Namespace(
        gateway_dir=str(BENCH.parent),
        requests=30,
        warmup=5,
        tokens=0,
        tpot_ms=1.0,
        new_connections=False,
        dialect="chat",
        agent=False,
        profile="minimal",
    )
    vars(a).update(kw)
    return opcounts.run(a)


def test_an_agent_run_counts_the_74_kb_request_in_its_dialect(tmp_path: Path) -> None:
    counts = _run(tmp_path, requests=3, warmup=1, tokens=8, dialect="messages", agent=True)
    assert counts["config"]["agent"] is True
    agent = opcounts.per_function(counts)
    small = opcounts.per_function(_run(tmp_path, requests=3, warmup=1, tokens=8, dialect="messages"))
    # its dozens of messages compared with the kept history's (dialects/history.py), not request.json's one (too
    # short to keep: never compared); the first (warm-up) request translated them from Anthropic blocks
    each = ("llm_gateway/dialects/history.py", "Histories.reuse")
    assert agent[each] > 10 * small.get(each, 1), (agent[each], small.get(each))


def test_a_profile_run_counts_what_its_features_add_on_the_loop(tmp_path: Path) -> None:
    ledger = _run(tmp_path, requests=3, warmup=1, profile="ledger")
    assert ledger["config"]["profile"] == "ledger"
    row = ("llm_gateway/observability/ledger_rows.py", "finished_row")
    assert opcounts.per_function(ledger)[row] > 0  # the ledger's row, made on the request path
    assert row not in opcounts.per_function(_run(tmp_path, requests=3, warmup=1))  # minimal: no row made


def test_a_dialect_run_counts_its_translated_streams(tmp_path: Path) -> None:
    names = {name for _path, name in opcounts.per_function(_run(tmp_path, requests=5, tokens=8, dialect="messages"))}
    assert {"StreamTranslator.token", "SSERelay.feed", "AnthropicExchange.translation"} <= names


def test_a_real_run_counts_the_gateways_request_path_and_repeats(tmp_path: Path) -> None:
    first, again = _run(tmp_path), _run(tmp_path)
    funcs = opcounts.per_function(first)
    total = sum(funcs.values())
    names = {name for _path, name in funcs}
    # the request path, each function once a request (at least): the limiter, the router, the upstream client
    for name in ("MemoryStore.reserve_now", "Dispatcher.run", "H1Upstream.send", "GatewayApp.http"):
        assert name in names, name
        assert min(v for (_p, n), v in funcs.items() if n == name) >= 1.0, name
    assert 2_000 < total < 50_000
    assert first["llm_gateway"].startswith(str(BENCH.parent / "llm_gateway"))
    # the same commit: the same count but for the periodic tasks (probes, timers) that ran in the window
    assert sum(opcounts.per_function(again).values()) == pytest.approx(total, rel=0.02)  # 1.06% seen on a busy box
    assert "bytecodes per request: 30 whole answers, on one kept-alive connection" in opcounts.report(first)


def _of(funcs: dict[tuple[str, str], float], name: str) -> float:
    return sum(v for (_p, n), v in funcs.items() if n == name)


def test_a_new_connection_per_request_counts_the_connections_set_up_too(tmp_path: Path) -> None:
    kept = opcounts.per_function(_run(tmp_path))
    data = _run(tmp_path, new_connections=True, tokens=4)
    funcs = opcounts.per_function(data)
    # one connection's set-up in 30 requests, against one in each: dozens of fields set each time
    one = _of(funcs, "GatewayProtocol.__init__")
    assert one >= 50
    assert _of(kept, "GatewayProtocol.__init__") * 30 == pytest.approx(one)
    assert sum(funcs.values()) > sum(kept.values())  # a stream on a new connection: more than a whole answer
    assert "streams of 4 tokens, each on a new connection" in opcounts.report(data)


def test_an_agent_request_names_its_token_cap_as_its_dialect_does() -> None:
    # the Responses API answers `max_tokens` with a 400 (Unknown parameter): `--agent --dialect responses` broke on it
    for dialect, field, other in (
        ("chat", "max_tokens", "max_output_tokens"),
        ("messages", "max_tokens", "max_output_tokens"),
        ("responses", "max_output_tokens", "max_tokens"),
    ):
        raw = opcounts._request(8000, 16, dialect, agent=True)
        body = json.loads(raw.partition(b"\r\n\r\n")[2])
        assert body[field] == 16 and other not in body and body["stream"] is True, dialect
