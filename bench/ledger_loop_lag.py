"""How late a thread that wakes for work runs while the SQLite writer thread writes usage-ledger batches, by
rows per statement.

The writer thread (state/sqlite_writer.py) gives the GIL up while SQLite steps a statement, but holds it while
the driver binds the statement's values, so the event loop, woken for a request, can wait out one statement's
binding: what c1's added p99 sees (issue 36). This runs the real writer (its thread, its connection, the
ledger's prepared batches, handed over from an event loop) beside a probe thread that sleeps `--tick-ms` and
records how late each wake-up is (it needs the GIL back, as the loop does; time.sleep is not rounded to the
millisecond as an event loop's timers are), alternating the rows per statement given
(`sqlite_writer.MAX_ROWS_PER_STATEMENT`) and a round without writes (the floor: the machine's own noise), in
one process pinned to one CPU (`--cpu`, as bench/ledger_ab.py pins the gateway).

    PYTHONPATH=. .venv/bin/python bench/ledger_loop_lag.py --sizes 256,64 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ledger_writer


def _probe(tick_s: float, lags: list[float], stop: threading.Event) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        time.sleep(tick_s)
        lags.append(time.perf_counter() - t - tick_s)


async def _one(size: int, db: Path, batches: int, rows_per: int, tick_s: float, gap_s: float) -> list[float]:
    from llm_gateway.observability.ledger_rows import finished_row
    from llm_gateway.state import sqlite_writer, usage

    recs = ledger_writer._records(batches * rows_per)
    now = ledger_writer.NOON_MS / 1000
    rows = [finished_row(r, now + i / 1000, 0.25) for i, r in enumerate(recs)]
    writer = sqlite_writer.SqliteWriter(str(db), 5.0)
    sql = ledger_writer.insert_sql(usage._INSERTED)
    await writer.insert(sql, rows[:1], usage._with_days)  # the thread and its connection exist from here on
    lags: list[float] = []
    stop = threading.Event()
    probe = threading.Thread(target=_probe, args=(tick_s, lags, stop))
    probe.start()
    default = sqlite_writer.MAX_ROWS_PER_STATEMENT
    try:
        for b in range(batches):
            await asyncio.sleep(gap_s)
            if size:
                sqlite_writer.MAX_ROWS_PER_STATEMENT = size
                await writer.insert(sql, rows[b * rows_per : (b + 1) * rows_per], usage._with_days)
    finally:
        sqlite_writer.MAX_ROWS_PER_STATEMENT = default
        stop.set()
        probe.join()
        await writer.aclose()
    return lags


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256,64", help="rows per statement to compare (0: no writes, added)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--batches", type=int, default=20, help="batches per round and size")
    ap.add_argument("--batch", type=int, default=500, help="rows per batch (usage.batch_rows' default)")
    ap.add_argument("--tick-ms", type=float, default=0.2)
    ap.add_argument("--gap-ms", type=float, default=20.0, help="the loop alone between two batches")
    ap.add_argument("--cpu", type=int, default=0, help="the CPU to pin the process to (-1: not pinned)")
    a = ap.parse_args()
    if a.cpu >= 0:
        os.sched_setaffinity(0, {a.cpu})
    sizes = [0, *(int(s) for s in a.sizes.split(","))]
    lags: dict[int, list[float]] = {s: [] for s in sizes}
    with tempfile.TemporaryDirectory(prefix="ledger-lag-") as tmp:
        template = ledger_writer._migrated(Path(tmp))
        for rnd in range(a.rounds):
            for size in sizes if rnd % 2 == 0 else sizes[::-1]:
                db = Path(tmp) / f"r{rnd}-{size}.db"
                db.write_bytes(template.read_bytes())
                args = (size, db, a.batches, a.batch, a.tick_ms / 1000, a.gap_ms / 1000)
                lags[size] += asyncio.run(_one(*args))
    print(f"lateness past a {a.tick_ms:g} ms sleep, {a.rounds} rounds x {a.batches} batches of {a.batch} rows")
    print("| rows per statement | wake-ups | p50 ms | p99 ms | p99.9 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for size, got in lags.items():
        q = statistics.quantiles(got, n=1000, method="inclusive")
        name = "no writes" if size == 0 else str(size)
        print(f"| {name} | {len(got)} | {q[499] * 1e3:.3f} | {q[989] * 1e3:.3f} | {q[998] * 1e3:.3f} | "
              f"{max(got) * 1e3:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()
