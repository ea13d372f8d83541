"""User-space instructions per usage-ledger row on the writer path, counted by callgrind: a deterministic A/B.

The ledger's cost (issue 36: on, it must cost what a counter costs) is spread over the request path, a worker
thread and the SQLite writer thread, and on a shared VM its CPU figures (ledger_ab.py) move more than a
change to one of those steps saves. This counts the instructions of the writer path alone, run synchronously
in one process, as the gateway runs each step per flush:

  - build the rows: `ledger_rows.finished_row` per finished request (on the request path, at its end);
  - checkpoint: `UsageLedger._write_checkpoint`, i.e. the crash spool's JSON lines of the new rows and the
    snapshot of `--in-flight` requests in flight (each built as the row it would leave);
  - insert: the SQLite writer thread's transaction (`SqliteWriter._insert` with `UsageStore`'s preparation:
    the UTC day, the multi-row statements) into a database migrated as the gateway migrates it;
  - then the spool is emptied, as a flush that wrote everything does.

Each measurement runs two processes under `valgrind --tool=callgrind` that do the same set-up (imports, the
database, the same records) and differ only in how many flushes of `--batch` rows they run (`--flushes` and
twice that); the difference of their totals over the difference of their rows is the cost per row, set-up
cancelled. The runs are deterministic (PYTHONHASHSEED=0, fixed times): the same to within ~0.1% run to run.

    PYTHONPATH=. .venv/bin/python bench/ledger_writer.py            # instructions per row, printed
    PYTHONPATH=. .venv/bin/python bench/ledger_writer.py --batch 64 --flushes 8 --in-flight 0
    PYTHONPATH=. .venv/bin/python bench/ledger_writer.py --keep /tmp/cg   # then callgrind_annotate each file

Needs valgrind (`apt-get install valgrind`). Not counted: the kernel (the spool's write(2), SQLite's file I/O),
the event loop's hand-offs (one per batch), and time itself. So the same two processes also run natively, and
their minor page faults per row (the same slope of their rusage) are printed beside the count (their CPU
time is not: the set-up's noise on a shared machine is larger than the rows' cost):
an allocation pattern can save instructions and cost a page fault a row, which valgrind's own memory
management hides (see observability/spool.py's `_rows`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)
#: 2025-12-01T12:00:00Z: every row of a run on one UTC day, as nearly all of a real ledger's batches are
NOON_MS = 1_764_590_400_000


def _records(n: int) -> list[Any]:
    from llm_gateway.observability.record import RequestRecord

    recs = []
    for i in range(n):
        rec = RequestRecord(rid=f"req-{i:08d}", t0=1000.0 + i, method="POST", path="/v1/chat/completions")
        rec.endpoint, rec.key, rec.key_id = "chat", f"team-{i % 7}", f"kc_{i % 7:04d}"
        rec.model, rec.backend, rec.status = f"model-{i % 3}", "pool-a", 200 if i % 11 else 503
        rec.outcome = "success" if i % 11 else "unavailable"
        rec.prompt_tokens, rec.completion_tokens = 900 + i % 500, (None if i % 13 == 0 else 20 + i % 300)
        rec.usage_estimated = i % 4 == 0
        rec.ttft_s = None if i % 5 == 0 else 0.05 + (i % 97) / 1000
        if i % 2:
            rec.live = lambda: (1000, 37)
        recs.append(rec)
    return recs


def insert_sql(columns: tuple[str, ...]) -> str:
    """The single-row INSERT that `Database.insert_rows` hands the SQLite writer for the ledger's table."""
    return f"INSERT INTO usage_ledger ({', '.join(columns)}) VALUES ({', '.join(['?'] * len(columns))})"


def child(db_path: str, spool_dir: str, batch: int, flushes: int, capacity: int, in_flight: int) -> None:
    """The measured process: the same set-up whatever `flushes`, then `flushes` flushes of `batch` rows."""
    from llm_gateway.observability.ledger import COLUMNS, UsageLedger
    from llm_gateway.observability.ledger_rows import finished_row
    from llm_gateway.observability.metrics import Metrics
    from llm_gateway.observability.spool import Spool
    from llm_gateway.settings import UsageConfig
    from llm_gateway.state import usage
    from llm_gateway.state.sqlite_writer import SqliteWriter

    ledger = UsageLedger(Metrics(), UsageConfig(ledger=True, batch_rows=batch))
    spool = Spool(Path(spool_dir), COLUMNS)
    writer = SqliteWriter(db_path, 5.0)
    recs = _records(capacity)  # as many records whatever `flushes`: only the flushes differ between the runs
    open_recs = _records(in_flight)
    sql = insert_sql(usage._INSERTED)
    now = NOON_MS / 1000
    for f in range(flushes):
        done = recs[f * batch : (f + 1) * batch]
        rows = [finished_row(rec, now + i / 1000, 0.25 + i / 10_000) for i, rec in enumerate(done)]
        ledger._write_checkpoint(spool, rows, open_recs, now, 2000.0)
        writer._insert(sql, rows, usage._with_days)
        spool.clear()
    writer._close()
    spool.close(keep_rows=False)


def _migrated(directory: Path) -> Path:
    """A database file with the gateway's schema (alembic's migrations), made once, natively."""
    from llm_gateway.state.database import Database

    path = directory / "template.db"

    async def make() -> None:
        db = await Database.open(f"sqlite+aiosqlite:///{path}")
        await db.aclose()

    asyncio.run(make())
    return path


def _start(
    args: argparse.Namespace, template: Path, work: Path, flushes: int, counted: bool
) -> tuple[subprocess.Popen[bytes], Path]:
    """One measured process: under callgrind (`counted`) or natively (for the kernel's side: page faults)."""
    run = work / f"{'cg' if counted else 'native'}-f{flushes}"
    run.mkdir()
    db = run / "ledger.db"
    shutil.copy(template, db)
    out = run / "cg.out"
    cmd = [
        sys.executable, __file__, "--child", str(db), str(run / "spool"),
        str(args.batch), str(flushes), str(args.batch * args.flushes * 2), str(args.in_flight),
    ]  # fmt: skip
    if counted:
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-line=no", *cmd]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE), out


def _wait(proc: subprocess.Popen[bytes]) -> Any:
    """The process's own rusage, once it ended well."""
    assert proc.stderr is not None
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        sys.exit(f"ledger_writer: a measured run failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    return usage


def _total(out: Path) -> int:
    m = _TOTAL.search(out.read_bytes())
    if m is None:
        raise RuntimeError(f"{out}: not a callgrind dump")
    return int(m.group(1))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        db, spool, batch, flushes, capacity, in_flight = sys.argv[2:8]
        child(db, spool, int(batch), int(flushes), int(capacity), int(in_flight))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=500, help="rows per flush (usage.batch_rows' default: 500)")
    ap.add_argument("--flushes", type=int, default=4, help="flushes of the shorter run (the longer runs twice)")
    ap.add_argument("--in-flight", type=int, default=16, help="requests in flight at each checkpoint")
    ap.add_argument("--keep", type=Path, help="copy both runs' callgrind files here (for callgrind_annotate)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("ledger_writer: valgrind missing (apt-get install valgrind)")
    with tempfile.TemporaryDirectory(prefix="ledger-writer-") as tmp:
        work = Path(tmp)
        template = _migrated(work)
        native = []
        for n in (args.flushes, 2 * args.flushes):  # one at a time: their CPU times are read too
            native.append(_wait(_start(args, template, work, n, counted=False)[0]))
        runs = [_start(args, template, work, n, counted=True) for n in (args.flushes, 2 * args.flushes)]
        totals = []
        for proc, out in runs:
            _wait(proc)
            totals.append(_total(out))
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(out, args.keep / f"callgrind.{out.parent.name}")
    rows = args.batch * args.flushes
    per_row = (totals[1] - totals[0]) / rows
    faults = (native[1].ru_minflt - native[0].ru_minflt) / rows
    print(
        f"ledger writer path: {per_row:,.0f} instructions/row (batch {args.batch}, {args.in_flight} in flight; "
        f"{totals[0]:,} and {totals[1]:,} instructions for {rows} and {2 * rows} rows)\n"
        f"natively: {faults:.2f} minor page faults/row (the kernel's work, which the count does not see)"
    )


if __name__ == "__main__":
    main()
