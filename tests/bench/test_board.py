"""The public boards' part of the bench (bench/board*.py): the open-loop client's HTTP framing, its chunked
decoder, one short run of each client mode against the fake engine (about a second), and the report's
ratios and added figures. No proxy process, no real load."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import board_client  # noqa: E402
import board_report  # noqa: E402
import report  # noqa: E402
import sse_conn  # noqa: E402
import targets  # noqa: E402

from tests.bench.test_bench_smoke import engine  # noqa: E402, F401  (the fake engine fixture)


def test_response_end_waits_for_the_whole_body_by_length_or_chunks() -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"
    assert board_client.response_end(bytearray(head + b"abcd")) is None
    assert board_client.response_end(bytearray(head + b"abcdeHTTP/1.1")) == (200, len(head) + 5)
    chunked = b"HTTP/1.1 429 Too Many\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n"
    assert board_client.response_end(bytearray(chunked)) is None
    assert board_client.response_end(bytearray(chunked + b"0\r\n\r\n")) == (429, len(chunked) + 5)


def test_dechunk_reassembles_a_body_split_anywhere() -> None:
    wire = b"5\r\nhello\r\n1;ext=1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"
    for cut in range(1, len(wire)):
        d = sse_conn.Dechunk()
        out = d.feed(wire[:cut]) + d.feed(wire[cut:])
        assert out == b"hello world" and d.done, cut


def _client(*argv: str) -> dict:
    p = subprocess.run(
        [sys.executable, str(BENCH / "board_client.py"), *argv, "--body", str(BENCH / "request.json")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    line = next(x for x in p.stdout.splitlines() if x.startswith(("RATEJSON ", "STREAMSJSON ")))
    return dict(json.loads(line.split(" ", 1)[1]))


def test_rate_mode_answers_every_due_request(engine: str) -> None:  # noqa: F811
    r = _client("rate", engine + "/v1/chat/completions", "--rate", "200", "-d", "0.5", "--warmup", "0.1")
    assert r["offered"] == 100 and r["ok"] == 100 and r["errors"] == 0 and r["ok_all"] == 120
    assert 0 < r["p50_us"] <= r["p99_us"] <= r["max_us"]


def test_ramp_mode_counts_every_token_and_the_gaps_between_reads(engine: str) -> None:  # noqa: F811
    r = _client("ramp", engine + "/v1/chat/completions", "--n", "4", "--tokens", "6", "--tpot-ms", "20")
    assert r["streams"] == 4 and r["errors"] == 0 and r["stalled"] == 0 and r["peak_open"] >= 1
    assert 10_000 <= r["gap_p50_us"] <= 200_000  # one read per 20 ms token; generous bounds for a busy box


def test_a_gap_over_the_stall_bound_is_a_stall(engine: str) -> None:  # noqa: F811
    # 40 ms between tokens against a 5 ms bound: every stream stalls (the gaps can only be longer, never shorter)
    argv = ("--n", "3", "--tokens", "4", "--tpot-ms", "40", "--stall-ms", "5")
    r = _client("ramp", engine + "/v1/chat/completions", *argv)
    assert r["streams"] == 3 and r["stalled"] == 3 and r["max_gap_us"] >= 5_000


class _Transport:
    def __init__(self) -> None:
        self.sent = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.sent += data

    def close(self) -> None:
        self.closed = True


def _sse_stream(deltas: int) -> bytes:
    frames = [{"choices": [{"delta": {"role": "assistant", "content": ""}}]}]
    frames += [{"choices": [{"delta": {"content": f" t{i}"}}]} for i in range(deltas)]
    body = b"".join(b"data: " + json.dumps(f).encode() + b"\n\n" for f in frames) + b"data: [DONE]\n\n"
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return head + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize(("sent", "asked", "error"), [(3, 3, None), (2, 3, "lost_frames"), (4, 3, "lost_frames")])
def test_a_stream_is_good_only_with_exactly_the_tokens_asked_for(sent: int, asked: int, error: str | None) -> None:
    loop = asyncio.new_event_loop()
    try:
        st = sse_conn.StreamStats()
        conn = sse_conn.StreamConn(b"POST / HTTP/1.1\r\n\r\n", st, asked, loop.create_future())
        tr = _Transport()
        conn.connection_made(tr)  # type: ignore[arg-type]
        wire = _sse_stream(sent)
        for i in range(0, len(wire), 40):  # reads cut anywhere, headers included
            conn.data_received(wire[i : i + 40])
        assert conn.done.done() and tr.closed and tr.sent.startswith(b"POST /")
        assert st.errors == ({error: 1} if error else {}) and st.done == (0 if error else 1)
        assert st.open == 0 and st.peak_open == 1
    finally:
        loop.close()


def _run(gw: dict, smg: dict, direct: dict, skipped: dict | None = None) -> dict:
    return {
        "versions": {"cpu": "Test CPU", "ncpu": 2, "kernel": "6.1", "python": "3.11.7"},
        "config": {
            "targets": ["direct", "gateway", "smg", "aiohttp"],
            "scenarios": ["ns_c1", "ns_c64", "frontier"],
            "duration": 1,
        },
        "skipped": skipped or {},
        "results": {"gateway": {"scenarios": gw}, "smg": {"scenarios": smg}, "direct": {"scenarios": direct}},
    }


def test_board_report_puts_the_ratios_first_and_subtracts_direct() -> None:
    gw = {"ns_c64": {"cpu_us_per_req": 250.0, "rps": 4000.0}, "ns_c1": {"p99": 0.9}}
    smg = {"ns_c64": {"cpu_us_per_req": 200.0, "rps": 5000.0}, "ns_c1": {"p99": 0.5}}
    gw["frontier"] = {"best_rps": {"1": None, "5": 3000.0, "10": 3500.0, "50": 3500.0}}
    direct = {"ns_c1": {"p99": 0.3}}
    text = "\n".join(board_report.render(_run(gw, smg, direct, {"aiohttp": "not installed (x)"})))
    assert text.startswith("**Public-board view** (Test CPU, 2 cores, kernel 6.1, Python 3.11.7")
    assert text.index("gateway vs smg") < text.index("| metric | this gateway")
    assert "| CPU µs / request (c64) | 0.80x | n/a |" in text  # smg/gateway = 200/250; aiohttp skipped
    assert "| req/s at c64 | 0.80x | n/a |" in text
    assert "| added p99 at c1, ms | 0.33x | n/a |" in text  # (0.5-0.3)/(0.9-0.3)
    assert "| added p99 at c1, ms | 0.60 | 0.20 | 0.30 |" in text  # gateway, smg added; direct absolute
    assert "| frontier req/s, p99 < 5 ms | 3,000 | - | - |" in text


def test_the_report_names_the_interpreter_and_how_it_was_built() -> None:
    import run  # bench/run.py

    line = run.interpreter(sys.executable)
    path, _, facts = line.partition(" (")
    assert path == os.path.realpath(sys._base_executable)  # the interpreter itself, not the venv's link
    shared = any("libpython" in x for x in Path("/proc/self/maps").read_text().splitlines())
    assert facts.startswith("libpython shared" if shared else "libpython linked in")
    assert run.interpreter("/nonexistent/python") == "?"
    data = _run({}, {}, {})
    data["versions"]["interpreter"] = line
    data["config"]["scenarios"] = ["frontier"]
    assert f"Python 3.11.7 at {line};" in board_report.render(data)[0]


def test_main_report_has_a_column_and_a_ratio_for_smg() -> None:
    gw = {"ns_c1": {"p50": 0.5, "p99": 1.0, "errors": 0, "cpu_us_per_req": 300.0, "rps": 1.0}}
    smg = {"ns_c1": {"p50": 0.3, "p99": 0.6, "errors": 0, "cpu_us_per_req": 150.0, "rps": 1.0}}
    text = report.render(_run(gw, smg, {"ns_c1": {"p50": 0.1, "p99": 0.2}}))
    assert "| ns_c1 CPU per request, µs |  | 300 | - | - | 150 | - | 0.5x |" in text


def test_smg_runs_with_its_api_key_on_one_worker() -> None:
    cmd = targets.target_command("smg")
    assert cmd is not None and "--api-key " + targets.API_KEY in cmd and "--worker-urls {upstream}" in cmd
    assert targets.target_command("aiohttp", None) == f"{targets.PROJECT_PY} {BENCH}/proxies/aiohttp_bare.py"


def test_st_split_is_the_line_through_two_stream_lengths() -> None:
    import board

    assert board.split_costs({128: 2_600.0, 8: 440.0}) == (18.0, 296.0)  # (2600-440)/120; 440 - 8*18
    assert board.split_costs({8: 500.0, 128: 500.0}) == (0.0, 500.0)


_SPLIT_CTX = SimpleNamespace(a=SimpleNamespace(duration=1.0))  # a run's context: its options, as run.py's


def test_st_split_measures_the_targets_cpu_at_each_length() -> None:
    import board

    calls: list[tuple[int, float]] = []

    def stream(ctx: object, url: str, conc: int, dur: float, tokens: int) -> dict:
        calls.append((tokens, dur))
        # this process is the "target": 100 ms of CPU a call + 2 ms per token, for 10 streams (CPU from /proc
        # counts in 10 ms ticks: large enough to read)
        end = time.process_time() + 0.1 + tokens * 0.002
        while time.process_time() < end:
            pass
        return {"requests": 10, "errors": 0, "error_kinds": {}}

    out = board.st_split(_SPLIT_CTX, "http://x", os.getpid(), stream)
    assert calls == [(8, 1), (8, 1.0), (128, 1), (128, 1.0)]  # each length: 1 s unrecorded, then --duration
    assert set(out["runs"]) == {"8", "128"} and out["errors"] == 0
    # 10 streams a call: 200 us of CPU per token, 10 ms per stream fixed (bounds: a tick either way, and a busy box)
    assert 150 <= out["cpu_us_per_token"] <= 260 and 8_000 <= out["cpu_us_per_stream_fixed"] <= 12_500
    assert board.st_split(_SPLIT_CTX, "http://x", None, stream) == {"skipped": "no target process (direct)"}


def test_board_report_shows_the_split_of_stream_cpu() -> None:
    gw = {"st_split": {"cpu_us_per_token": 19.0, "cpu_us_per_stream_fixed": 400.0}}
    smg = {"st_split": {"cpu_us_per_token": 15.2, "cpu_us_per_stream_fixed": 240.0}}
    data = _run(gw, smg, {"st_split": {"skipped": "no target process (direct)"}})
    data["config"]["scenarios"] = ["st_split"]
    text = "\n".join(board_report.render(data))
    assert "| CPU µs / streamed token, marginal (st_split) | 0.80x | - |" in text  # 15.2/19; aiohttp not run
    assert "| CPU µs / stream, fixed (st_split) | 400 | 240 | - | - |" in text  # direct: no process of its own


@pytest.mark.parametrize("scn", ["frontier", "pace20_c16", "stall20", "rss_plateau", "st_split"])
def test_every_board_scenario_is_a_run_scenario(scn: str) -> None:
    import board
    import run

    assert scn in board.SCENARIOS and scn in run.ORDER and scn not in run.DEFAULT_SCENARIOS


def test_the_floor_is_measured_every_try_and_its_lowest_p99_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    # direct's ns_c1 is subtracted from every proxy's latency: one tail of its own would make theirs negative
    import scenario_runs

    p99s = iter([4.59, 0.09, 0.12, 0.5, 0.6])
    taken: list[str] = []

    def fake_measure(ctx, name, kind, url, conc, pid, sampler, dialect, body=None):  # type: ignore[no-untyped-def]
        taken.append(name)
        return {"rps": 1.0, "p50": 0.03, "p99": next(p99s), "errors": 0, "noise_pct": 0.0}

    monkeypatch.setattr(scenario_runs, "measure", fake_measure)
    a = SimpleNamespace(retries=2, max_noise=10.0, warmup=0, profile=None)
    ctx = SimpleNamespace(a=a, retries_left=8)
    floor = scenario_runs.load_scenario(ctx, "direct", "ns_c1", "http://127.0.0.1:1", None, None)  # type: ignore[arg-type]
    assert taken == ["direct"] * 3 and floor["p99"] == 0.09 and floor["tries"] == 3 and ctx.retries_left == 8
    proxy = scenario_runs.load_scenario(ctx, "gateway", "ns_c1", "http://127.0.0.1:1", None, None)  # type: ignore[arg-type]
    assert taken[3:] == ["gateway"] and proxy["p99"] == 0.5 and proxy["tries"] == 1  # quiet: measured once
