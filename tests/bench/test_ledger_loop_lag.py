"""bench/ledger_loop_lag.py, how late a thread wakes beside the ledger's SQLite writer: a round of it must drive
the real writer thread (every row lands) while its probe records wake-ups."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import ledger_loop_lag  # noqa: E402
import ledger_writer  # noqa: E402


def test_a_round_writes_every_batch_through_the_writer_thread_while_the_probe_wakes(tmp_path: Path) -> None:
    from llm_gateway.state import sqlite_writer

    db = ledger_writer._migrated(tmp_path)
    default = sqlite_writer.MAX_ROWS_PER_STATEMENT
    lags = asyncio.run(ledger_loop_lag._one(64, db, batches=3, rows_per=70, tick_s=0.0002, gap_s=0.002))
    assert lags and all(lag > -0.001 for lag in lags)
    assert default == sqlite_writer.MAX_ROWS_PER_STATEMENT  # set back for what runs next in the process
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM usage_ledger").fetchone() == (1 + 3 * 70,)
    conn.close()
