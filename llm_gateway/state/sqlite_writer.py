"""The SQLite writer thread of append-only batches (the usage ledger's rows): one thread and one stdlib
`sqlite3` connection of its own, so that the event loop only hands a batch over (state/database.py's
`Database.insert_rows`; the thread prepares it as a `Batch`, whose values shared by every row are bound once
per statement), the pragmas every SQLite connection of the gateway runs, and the `sqlite3` adapters of bool
and None (see `_ADAPTED`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import operator
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

from llm_gateway.background import yield_cpu

Rows = Sequence[Sequence[Any]]


class Batch(NamedTuple):
    """Rows made ready to insert (what `Database.insert_rows`' `prepare` gives): `shared` holds the values of the
    INSERT's first columns when every row has the same ones (bound once per statement, as `?1`, `?2`...: the
    ledger's day), and `rows` each row's values of the columns after those."""

    shared: tuple[Any, ...]
    rows: Rows

    def whole(self) -> Rows:
        """Each row with the shared values in front (for a driver that binds row by row)."""
        return [(*self.shared, *r) for r in self.rows] if self.shared else self.rows


Prepare = Callable[[Rows], Batch]

#: the most rows one INSERT statement carries (its sizes are the powers of two up to this, so the driver's
#: statement cache holds at most 7 texts per table): a batch of 500 rows is 10 statements, not 500 steps, and
#: the writer hands the core to the loop after each (`yield_cpu`), so a request waits for at most one: ~0.2 ms
MAX_ROWS_PER_STATEMENT = 64
#: SQLite's smallest default limit on bound variables (SQLITE_MAX_VARIABLE_NUMBER before 3.32)
_MIN_VARIABLES = 999


_NOTHING: dict[None, None] = {}
#: Values the stdlib `sqlite3` binds only after asking its adapter registry, then the value itself, for an
#: adapter (a bool, None: every ledger row has one or two). Without one registered each lookup fails with an
#: AttributeError whose message it formats: ~2,000 instructions a value, a tenth of the writer's work on a
#: row (bench/ledger_writer.py). Registered, each is a dict lookup and a call in C that gives what SQLite
#: stores anyway (a bool as the integer 1 or 0, None as NULL), in every `sqlite3` connection of the process;
#: `operator.index` rather than `int`, whose call goes through the type's constructor (~300 more a bool).
_ADAPTED: tuple[tuple[type[Any], Callable[[Any], Any]], ...] = ((bool, operator.index), (type(None), _NOTHING.get))
for _type, _adapter in _ADAPTED:
    sqlite3.register_adapter(_type, _adapter)


def sqlite_pragmas(busy_timeout_s: float) -> tuple[str, ...]:
    """Every connection to the SQLite file, the engine's and the ledger's writer's, runs these."""
    busy_ms = max(1, round(busy_timeout_s * 1000))
    return ("journal_mode=WAL", f"busy_timeout={busy_ms}", "synchronous=NORMAL", "foreign_keys=ON")


#: how much nicer than the process the writer thread runs: on a busy core the scheduler favours the event loop's
#: thread, waking for a request (c1 added p99 with the ledger on: 1.6 -> 1.1 ms, bench/ledger_ab.py; not at once:
#: the writer may finish its slice, hence `yield_cpu` between statements), while under saturation it still gets
#: ~10x less than the loop, far more than the ~4 us a row it needs
WRITER_NICE = 10


def _yield_to_the_loop() -> None:
    """The writer thread's start: lower its own scheduling priority (Linux: a thread's nice is its own)."""
    tid = threading.get_native_id()
    with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed: it runs as the others do
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE))


class SqliteWriter:
    """One thread and one stdlib `sqlite3` connection of their own, for append-only batches: the event loop
    only hands a batch over and awaits its future. `sqlite3` releases the GIL while SQLite runs each statement, so
    the loop keeps running during the write; the connection has the engine's pragmas (WAL, busy timeout,
    synchronous NORMAL) and takes the write lock at BEGIN (IMMEDIATE), so a busy database fails the batch
    within the busy timeout instead of deadlocking a reader's upgrade. The thread runs `WRITER_NICE` nicer
    than the process: where it shares a core with the loop, a request is not kept waiting behind a batch."""

    def __init__(self, path: str, busy_timeout_s: float) -> None:
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="db-writer", initializer=_yield_to_the_loop)
        self._conn: sqlite3.Connection | None = None

    async def insert(self, sql: str, rows: Rows, prepare: Prepare | None) -> None:
        """`sql` is the single-row INSERT (`INSERT INTO t (cols) VALUES (?, ...)`); the thread runs it as few
        multi-row statements (see `_statements`)."""
        await asyncio.get_running_loop().run_in_executor(self._pool, self._insert, sql, rows, prepare)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
            try:
                for pragma in sqlite_pragmas(self._busy_timeout_s):
                    conn.execute(f"PRAGMA {pragma}")
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _insert(self, sql: str, rows: Rows, prepare: Prepare | None) -> None:
        conn = self._connection()
        batch = Batch((), rows) if prepare is None else prepare(rows)
        conn.execute("BEGIN IMMEDIATE")
        try:
            for text, params in _statements(conn, sql, batch):
                conn.execute(text, params)
                yield_cpu()
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._close)
        finally:
            self._pool.shutdown(wait=False)


def _statements(conn: sqlite3.Connection, sql: str, batch: Batch) -> list[tuple[str, list[Any]]]:
    """The batch as multi-row INSERTs of power-of-two sizes (at most `MAX_ROWS_PER_STATEMENT` rows, and within
    the connection's limit on bound variables), each with its values flattened in C; the batch's shared values
    come first, bound once (`?1`...) and named in every row. Why not executemany: it steps (and resets, and
    gives the GIL up around) the statement once per row; here the thread binds a statement once and SQLite
    inserts its rows in one step. Measured with the real writer beside a busy event loop on one core:
    3.7-4.0 -> 2.7-3.0 us of the writer's CPU per row (issue 36)."""
    shared, rows = batch
    if not rows:
        return []
    own = len(rows[0])  # the values each row binds
    limit = _MIN_VARIABLES
    with contextlib.suppress(AttributeError, sqlite3.Error):  # getlimit: Python 3.11+
        limit = conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    size = MAX_ROWS_PER_STATEMENT
    while size > 1 and len(shared) + size * own > limit:
        size //= 2
    head = sql.rpartition("VALUES")[0]
    out = []
    i, n = 0, len(rows)
    while i < n:
        while size > n - i:
            size //= 2
        values = list(itertools.chain(shared, itertools.chain.from_iterable(rows[i : i + size])))
        out.append((_text(head, len(shared), own, size), values))
        i += size
    return out


@functools.lru_cache(maxsize=64)
def _text(head: str, shared: int, own: int, size: int) -> str:
    """`head` followed by `size` rows of placeholders, each the `shared` numbered ones (`?1`...) then `own`
    plain ones (SQLite numbers a `?` one past the largest number so far): built once per shape."""
    one = "(" + ", ".join([*(f"?{j}" for j in range(1, shared + 1)), *itertools.repeat("?", own)]) + ")"
    return head + "VALUES " + ", ".join(itertools.repeat(one, size))
