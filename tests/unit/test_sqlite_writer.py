"""The SQLite writer thread (state/sqlite_writer.py): a batch of ledger rows is a few multi-row statements, not
one step per row (each step gave the GIL up and waited to take it back behind the event loop: issue 36), and
every row lands exactly as it was handed over, whatever the batch's size."""

from __future__ import annotations

import itertools
import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llm_gateway.state import sqlite_writer
from llm_gateway.state.database import Database
from llm_gateway.state.sqlite_writer import MAX_ROWS_PER_STATEMENT, _statements
from llm_gateway.state.usage import _INSERTED, ROW_COLUMNS, UsageStore, _with_days
from llm_gateway.types import USAGE_COLUMNS

DAY1_MS = 1_764_547_200_000  # 2025-12-01T00:00:00Z


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    opened = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}", statement_timeout_s=2)
    yield opened
    await opened.aclose()


def row(i: int) -> tuple[object, ...]:
    """A row of ROW_COLUMNS whose every value says which row it is (the last one crosses midnight)."""
    at = DAY1_MS + 86_399_000 + i * 10  # the rows from i = 100 on are on 2025-12-02
    return (at, f"req-{i}", f"key-{i % 3}", f"kc_{i % 3}", f"m{i % 2}", "b", "chat", 200 + i % 2, "success",
            i, 2 * i, i % 2 == 1, None if i % 5 == 0 else i / 8, i / 4)  # fmt: skip


async def stored(db: Database) -> list[tuple[object, ...]]:
    cols = ", ".join(ROW_COLUMNS)
    async with db.begin() as conn:
        raw = await conn.exec_driver_sql(f"SELECT {cols}, day FROM usage_ledger ORDER BY at_ms")
        return [tuple(r) for r in raw.all()]


async def test_a_batch_is_a_few_multi_row_statements_not_a_step_per_row(db: Database):
    store = UsageStore(db)
    await store.insert_rows([row(0)])  # the writer thread and its connection exist from here on
    writer = db._writer
    assert writer is not None
    seen: list[str] = []
    writer._connection().set_trace_callback(seen.append)
    await store.insert_rows([row(i) for i in range(1, 501)])
    inserts = [s for s in seen if s.lstrip().upper().startswith("INSERT")]
    # 500 = 7 x 64 + 32 + 16 + 4: ten statements; executemany traced one per row
    assert len(inserts) <= 12, f"{len(inserts)} INSERT statements for one batch of 500 rows"
    assert max(s.count("(?") for s in inserts) <= MAX_ROWS_PER_STATEMENT
    assert len(await stored(db)) == 501


async def test_the_writer_hands_the_core_over_after_every_statement(db: Database, monkeypatch: pytest.MonkeyPatch):
    """Where the loop shares a core with the writer, a request arriving mid-batch waits for one statement, not
    the batch: the thread yields between statements (background.yield_cpu), never binds two in a row."""
    store = UsageStore(db)
    await store.insert_rows([row(0)])
    writer = db._writer
    assert writer is not None
    seen: list[str] = []
    writer._connection().set_trace_callback(seen.append)
    monkeypatch.setattr(sqlite_writer, "yield_cpu", lambda: seen.append("YIELD"))
    await store.insert_rows([row(i) for i in range(1, 501)])
    steps = [s for s in seen if s == "YIELD" or s.lstrip().upper().startswith("INSERT")]
    assert len(steps) >= 2 * 8, steps
    assert steps[0] != "YIELD"
    assert all(a != b for a, b in itertools.pairwise(steps)), "two statements with no yield between them"
    assert steps[-1] == "YIELD"
    assert len(await stored(db)) == 501


@pytest.mark.parametrize("n", [1, 2, 37, 255, 256, 257, 500, 1000])
async def test_every_row_lands_exactly_as_handed_over_whatever_the_batch_size(db: Database, n: int):
    rows = [row(i) for i in range(n)]
    await UsageStore(db).insert_rows(rows)
    got = await stored(db)
    days = ["2025-12-01" if i < 100 else "2025-12-02" for i in range(n)]
    want = [(*r[:11], int(r[11]), *r[12:], d) for r, d in zip(rows, days, strict=True)]  # SQLite keeps bools as 0/1
    assert got == want


#: a process of its own, that imports nothing of the gateway (so no adapter it registers): the rows, each with
#: its day, stored by the stdlib's plain `executemany`, the way every value was bound before any of this
REFERENCE = """
import json, sqlite3, sys
path, cols, rows = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.stdin.read())
conn = sqlite3.connect(path, isolation_level=None)
conn.executemany(
    f"INSERT INTO usage_ledger ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)})", rows
)
conn.close()
"""


def as_stored(path: Path) -> list[tuple[object, ...]]:
    """Every stored value as SQLite has it: its type and its SQL literal (1 and 1.0 and '1' differ)."""
    cols = [*USAGE_COLUMNS, "day"]
    shown = ", ".join(f"typeof({c}), quote({c})" for c in cols)
    with sqlite3.connect(path) as conn:
        got = conn.execute(f"SELECT {shown} FROM usage_ledger ORDER BY request_id").fetchall()
    conn.close()
    return got


#: batches as row numbers: on one day (the day bound once), across midnight in order, and out of order with
#: its first and last rows on the same day and the middle one on the next
BATCHES = {"one row": [0], "one day": list(range(60)), "two days": list(range(300)), "mixed": [50, 150, 60]}


@pytest.mark.parametrize("batch", BATCHES)
async def test_stored_values_are_those_a_plain_executemany_stores_bools_nones_and_days_included(
    tmp_path: Path, batch: str
):
    """The writer's multi-row statements, the day bound once for a batch on one day, and the adapters the writer
    registers store every value as the stdlib did without them: a bool as the integer 0 or 1, None as NULL,
    floats as reals, each row's own UTC day as text."""
    path, reference = tmp_path / "ledger.db", tmp_path / "reference.db"
    await (await Database.open(f"sqlite+aiosqlite:///{reference}")).aclose()  # the same schema, empty
    db = await Database.open(f"sqlite+aiosqlite:///{path}", statement_timeout_s=2)
    numbers = BATCHES[batch]
    rows = [row(i) for i in numbers]
    n = len(rows)
    try:
        await UsageStore(db).insert_rows(rows)
    finally:
        await db.aclose()
    days = ["2025-12-01" if i < 100 else "2025-12-02" for i in numbers]
    cols = json.dumps([*USAGE_COLUMNS, "day"])
    with_days = json.dumps([[*r, d] for r, d in zip(rows, days, strict=True)])
    subprocess.run([sys.executable, "-c", REFERENCE, str(reference), cols], input=with_days, text=True, check=True)
    got, want = as_stored(path), as_stored(reference)
    assert len(want) == n
    assert got == want
    if n > 3:
        assert {v[22:24] for v in want} == {("integer", "1"), ("integer", "0")}  # usage_estimated, a bool
        assert ("null", "NULL") in {v[24:26] for v in want}  # a null ttft_ms


def test_a_batch_on_one_day_binds_its_day_once_per_statement_and_one_across_midnight_per_row():
    """The day is the INSERT's first column: on one day it is `?1` in every row, bound once (a batch of 500 binds
    500 x 14 + 1 values per statement set, not 500 x 15); across midnight each row binds its own."""
    conn = sqlite3.connect(":memory:")
    sql = f"INSERT INTO usage_ledger ({', '.join(_INSERTED)}) VALUES ({', '.join('?' for _ in _INSERTED)})"
    one_day = [row(i) for i in range(100)]
    statements = _statements(conn, sql, _with_days(one_day))
    assert [len(p) for _, p in statements] == [1 + 64 * 14, 1 + 32 * 14, 1 + 4 * 14]
    for text, params in statements:
        assert text.count("(?1, ?, ") == text.count("(") - 1 == (len(params) - 1) // 14  # one `(` for the columns
        assert params[0] == "2025-12-01"
        assert "2025-12-01" not in params[1:]
    across = [row(i) for i in range(95, 105)]
    statements = _statements(conn, sql, _with_days(across))
    assert sum(len(p) for _, p in statements) == 10 * 15
    assert all("?1" not in text for text, _ in statements)
    assert [p[0::15] for _, p in statements] == [["2025-12-01"] * 5 + ["2025-12-02"] * 3, ["2025-12-02"] * 2]
    conn.close()
