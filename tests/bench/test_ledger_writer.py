"""bench/ledger_writer.py, instructions per ledger row: its measured process (run here without valgrind) must
drive the ledger's real writer path, and land every row it builds in the database, so that it keeps
measuring what the gateway runs when that path changes."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ledger_writer  # noqa: E402


def test_the_measured_process_writes_every_row_and_empties_the_spool(tmp_path: Path) -> None:
    db = ledger_writer._migrated(tmp_path)
    ledger_writer.child(str(db), str(tmp_path / "spool"), batch=7, flushes=3, capacity=42, in_flight=2)
    with sqlite3.connect(db) as conn:
        got = conn.execute("SELECT request_id, day FROM usage_ledger ORDER BY request_id").fetchall()
    conn.close()
    assert got == [(f"req-{i:08d}", "2025-12-01") for i in range(21)]
    assert not list((tmp_path / "spool").iterdir())  # closed clean: nothing left for a next start
