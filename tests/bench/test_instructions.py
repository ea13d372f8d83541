"""bench/instructions.py, the callgrind count: reading a dump's total, splitting two stream lengths into
per event and fixed, the table's ratios, and one real count of a tiny process under valgrind
(scripts/setup_dev.sh installs it)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import instructions  # noqa: E402


def test_a_dumps_total_is_its_summary_line_or_its_totals_line() -> None:
    head = b"version: 1\ncreator: callgrind-3.19.0\npid: 7\ncmd:  python -m x\npart: 1\n\nevents: Ir\n"
    assert instructions.dump_total(head + b"summary: 126866158\n\nfl=(1) a.c\nfn=(1) f\n3 4\n") == 126866158
    assert instructions.dump_total(head + b"fl=(1) a.c\nfn=(1) f\n3 4\n\ntotals: 42\n") == 42
    with pytest.raises(ValueError):
        instructions.dump_total(head + b"fl=(1) a.c\n")


def test_two_lengths_split_into_per_event_and_fixed() -> None:
    per_event, fixed = instructions.split({64: 2_384_869.0, 8: 1_150_918.0})
    assert per_event == pytest.approx((2_384_869 - 1_150_918) / 56)
    assert fixed == pytest.approx(1_150_918 - 8 * per_event)
    assert instructions.split({8: 1_150_918.0, 64: 2_384_869.0}) == (per_event, fixed)  # order does not matter


def test_the_table_puts_smgs_figure_over_the_gateways() -> None:
    r = {
        "gateway": {"ir_per_stream_8": 1e6, "ir_per_stream_64": 2e6, "ir_per_event": 20_000.0, "ir_fixed": 800_000.0},
        "smg": {"ir_per_stream_8": 2e6, "ir_per_stream_64": 3e6, "ir_per_event": 30_000.0, "ir_fixed": 400_000.0},
    }
    text = instructions.table(r, [8, 64])
    gw = next(line for line in text.splitlines() if line.startswith("| gateway"))
    assert "20,000 (1.50x smg)" in gw and "800,000 (0.50x smg)" in gw
    assert "x smg" not in next(line for line in text.splitlines() if line.startswith("| smg"))


def test_a_real_process_counted_between_zero_and_dump_gives_more_for_more_work(tmp_path: Path) -> None:
    # a Python process that loops when told (a file appears), so the count covers exactly that work
    script = tmp_path / "work.py"
    script.write_text(
        "import os, sys, time\n"
        "go = sys.argv[1]\n"
        "open(go + '.ready', 'w').close()\n"
        "while True:\n"
        "    if os.path.exists(go):\n"
        "        n = int(open(go).read() or 0); os.remove(go); sum(range(n)); open(go + '.done', 'w').close()\n"
        "    time.sleep(0.01)\n"
    )
    go = tmp_path / "go"
    target = instructions.Counted("work", f"{sys.executable} {script} {go}", tmp_path, tmp_path, {})
    try:
        for _ in range(600):  # Python starts slowly under valgrind
            if Path(str(go) + ".ready").exists():
                break
            time.sleep(0.1)
        target.control("-i", "on")

        def work(n: int) -> None:
            done = Path(str(go) + ".done")
            go.write_text(str(n))
            while not done.exists():
                time.sleep(0.05)
            done.unlink()

        small = target.count(lambda: work(10_000))
        big = target.count(lambda: work(1_000_000))
    finally:
        target.stop()
    assert 0 < small < big and big > 20 * small


def test_a_runs_report_prints_its_table_writes_its_json_and_drops_the_dumps(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("BENCH_KEEP_DUMPS", raising=False)
    out = tmp_path / "dumps"
    out.mkdir()
    (out / "cg.out").write_text("x")
    instructions.report("**title**", "| a |", {"gateway": {"x": 1.0}}, str(tmp_path / "r.json"), out)
    assert "**title**" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text()) == {"gateway": {"x": 1.0}}
    assert not out.exists()
    out.mkdir()
    monkeypatch.setenv("BENCH_KEEP_DUMPS", "1")
    instructions.report("t", "", {}, None, out)
    assert out.exists() and f"dumps kept in {out}" in capsys.readouterr().out
