"""The usage ledger's buffer, its crash spool, and the recent activity the status page shows.

`UsageLedger.record` is called by `finish_record` once per request, on the request path, so it only appends
a tuple to a bounded list (and `begin`, at arrival, puts the record in a dict of the requests in flight): no
I/O, no await, nothing a request could wait on. A background task (`start`) writes the buffer to the
database in batches, one transaction each, every `usage.flush_interval_s` or as soon as `usage.batch_rows`
rows are waiting. The tuples go to the sink as they are: the loop does one hand-off per batch and no work
per row (state/database.py's `insert_rows`: SQLite in a writer thread of its own, asyncpg's executemany),
so the ledger costs the request path what a counter costs. While the database is down or slow the rows stay
in the buffer and the write is retried (backing off to `MAX_RETRY_S`); a row that finds the buffer full
(`usage.buffer_rows`) is counted in `gateway_usage_rows_dropped_total{reason="buffer_full"}`, never lost
silently. `aclose` (the lifespan's shutdown, after the requests in flight have ended) writes what is left,
bounded in time.

A crash (`kill -9`, the OOM killer) cannot run `aclose`. So each flush first checkpoints, in a worker
thread, to this process's spool on local disk (observability/spool.py): the finished rows the spool lacks,
and the requests in flight as the rows they would leave (`outcome: interrupted`, status 500, the tokens a
stream has relayed so far). The next start writes a dead process's spool to the database, skipping rows
the database already holds. What a crash loses is then bounded by one flush interval: the requests that
ended, or began, since the last checkpoint; `gateway_usage_rows_at_risk` says how many that is at any
moment. Rows the spool holds are not lost at shutdown either (the database down): the next start writes
them; without a spool (`usage.spool: false`, or a disk that refuses) they are counted as `reason="shutdown"`.
Writes are at least once: a commit whose answer is lost is written again.

Rows are of authenticated generation requests (a key's name is known), whatever their outcome: refusals
by limits and budgets included, bad keys (401) not. `Activity` (always on, whether or not the ledger is)
keeps the last errors in a small ring and tokens per key in one-minute buckets for the last hour.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from llm_gateway.errors import DatabaseUnavailable
from llm_gateway.observability.activity import Activity
from llm_gateway.observability.ledger_rows import COLUMNS, Row, day_of, finished_row, in_flight, interrupted_row
from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.record import NONE, RequestRecord
from llm_gateway.observability.spool import Recovered, Spool, recover
from llm_gateway.settings import UsageConfig

log = logging.getLogger("gateway.usage")

MAX_RETRY_S = 30.0


class RowSink(Protocol):
    """Where batches go: `llm_gateway.state.usage.UsageStore` (one transaction per call)."""

    async def insert_rows(self, rows: Sequence[Row]) -> None:
        """Rows as the ledger keeps them: the values of COLUMNS, in order (the sink adds the day)."""
        ...

    async def insert_missing(self, rows: Sequence[Mapping[str, Any]]) -> int:
        """Rows replayed from a crashed process's spool: those the database does not hold yet (their count)."""
        ...


SinkOpener = Callable[[], Awaitable[RowSink]]


class UsageLedger:
    def __init__(self, metrics: Metrics, cfg: UsageConfig, *, wall: Callable[[], float] = time.time) -> None:
        self.enabled = cfg.ledger
        self.capacity = cfg.buffer_rows
        self.batch = cfg.batch_rows
        self.interval_s = cfg.flush_interval_s
        self.activity = Activity()
        self._wall = wall
        self._rows: list[Row] = []  # a list: a written batch leaves by one `del` of a slice, not a pop per row
        self._dropped_full = metrics.usage_rows_dropped.labels("buffer_full")
        self._dropped_shutdown = metrics.usage_rows_dropped.labels("shutdown")
        self._written = metrics.usage_rows_written
        self._errors = metrics.usage_flush_errors
        self._recovered_finished = metrics.usage_rows_recovered.labels("finished")
        self._recovered_interrupted = metrics.usage_rows_recovered.labels("interrupted")
        self._spool_errors = metrics.usage_spool_errors
        metrics.usage_rows_buffered.set_function(lambda: len(self._rows))
        metrics.usage_requests_open.set_function(lambda: len(in_flight(self._open.values())))
        metrics.usage_rows_at_risk.set_function(self.at_risk)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._opener: SinkOpener | None = None
        self._sink: RowSink | None = None
        self._closing = False
        self._delay = self.interval_s
        self._failing = False
        self._lock = asyncio.Lock()  # one flush at a time (the background writer's, a test's, shutdown's)
        #: every request in flight (by the record's id), so that a checkpoint can say which were running
        self._open: dict[int, RequestRecord] = {}
        self._spool: Spool | None = None
        self._spooled = 0  # the rows at the buffer's head that the spool holds
        self._checkpointed: set[tuple[str, float]] = set()  # (rid, t0) of the last checkpoint's requests in flight
        self._recovered: Recovered | None = None
        self._spool_failing = False

    @property
    def buffered(self) -> int:
        return len(self._rows)

    def at_risk(self) -> int:
        """What a crash now would lose: finished rows on no disk yet, and requests in flight since the last
        checkpoint (all of them buffered or in flight without a spool)."""
        running = in_flight(self._open.values())
        if self._spool is None:
            return len(self._rows) + len(running)
        ckpt = self._checkpointed
        return len(self._rows) - self._spooled + sum(1 for r in running if (r.rid, r.t0) not in ckpt)

    # -- the request path ----------------------------------------------------------------------------
    def begin(self, rec: RequestRecord) -> None:
        """A request arrived (one dict insert: its row, if it never ends, is what a crash loses)."""
        if self.enabled:
            self._open[id(rec)] = rec

    def record(self, rec: RequestRecord, duration_s: float) -> None:
        """One finished request (never blocks, never raises on a full buffer); "other" endpoints only end
        their tracking."""
        if self.enabled:
            self._open.pop(id(rec), None)
        if rec.endpoint == "other":
            return
        now = self._wall()
        self.activity.record(rec, now)
        if not self.enabled or rec.key == NONE:
            return
        rows = self._rows
        if len(rows) >= self.capacity:
            self._dropped_full.inc()
            return
        rows.append(finished_row(rec, now, duration_s))
        if len(rows) >= self.batch and not self._wake.is_set():
            self._wake.set()

    # -- behind it -----------------------------------------------------------------------------------
    def start(self, opener: SinkOpener, spool_dir: Path | None = None) -> None:
        """Write the buffer in the background; `opener` gives the sink (it may fail: retried later). With
        `spool_dir`: first take the spools of crashed processes there (written with the first flush), then
        keep this process's own."""
        self._opener = opener
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(spool_dir), name="usage-ledger")

    async def _run(self, spool_dir: Path | None) -> None:
        if spool_dir is not None:
            await self._open_spool(spool_dir)
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._delay)
            self._wake.clear()
            if self._closing:
                return
            await self.flush()
            if len(self._rows) < self.batch:  # a full batch woke it while that flush wrote its own rows: not now
                self._wake.clear()

    async def _open_spool(self, spool_dir: Path) -> None:
        try:
            self._spool = await asyncio.to_thread(Spool, spool_dir, COLUMNS)
            found = await asyncio.to_thread(recover, spool_dir)
        except OSError as e:  # a read-only or full disk: the ledger works on, without the spool's guarantee
            self._spool_errors.inc()
            log.error("usage ledger: no crash spool in %s (%s): a crash loses the rows not yet written", spool_dir, e)
            return
        ended = {(r.get("request_id"), r.get("key")) for r in found.finished}  # ended between two checkpoints
        found.interrupted = [r for r in found.interrupted if (r.get("request_id"), r.get("key")) not in ended]
        if found.finished or found.interrupted:
            log.warning(
                "usage ledger: a previous process did not shut down cleanly; writing its %d unwritten rows and "
                "%d requests it had in flight (outcome interrupted) from %s",
                len(found.finished),
                len(found.interrupted),
                spool_dir,
            )
            self._recovered = found
            self._wake.set()
        elif found.files:
            found.remove()
        else:
            found.release()

    async def flush(self) -> bool:
        """Spool what is new (off the loop), then write the rows buffered when it began, a batch per INSERT (rows
        that end meanwhile wait for the next flush; fewer than half a batch past the last full one go with it);
        False when the database failed (the rows not written stay buffered, and the next try waits longer)."""
        async with self._lock:
            rows = self._rows
            # only the rows buffered now (those the checkpoint spools): those that end while it spools and writes wait
            # for the next flush (a full batch or the interval). Draining them too made a chain of transactions of
            # a few rows each, every one paying a transaction's fixed cost (a thread hand-off, BEGIN/COMMIT, WAL
            # frames and locks): at c1, 117 of 132 inserts held a median of 3 rows (issue 36)
            left = len(rows)
            if self._spool is not None:
                await self._checkpoint(self._spool)
            if self._recovered is not None and not await self._write_recovered(self._recovered):
                return False
            while left:
                n = min(self.batch, left)
                if left - n < self.batch // 2:  # those that ended since a full batch woke it: with it, not alone
                    n = left
                chunk = rows[:n]  # the tuples themselves: no work per row on the loop
                if not await self._insert(chunk, len(rows)):
                    return False
                del rows[:n]
                left -= n
                self._spooled = max(0, self._spooled - n)
                self._written.inc(n)
            spool = self._spool
            if spool is not None and spool.holds_rows and self._spooled == 0:  # the database has them all
                try:
                    await asyncio.to_thread(spool.clear)
                except OSError as e:
                    self._spool_failed(e)
            if self._failing:
                self._failing = False
                log.warning("usage ledger: writing again")
            self._delay = self.interval_s
            return True

    async def _insert(self, chunk: list[Row], waiting: int) -> bool:
        try:
            if self._sink is None:
                assert self._opener is not None, "start() was not called"
                self._sink = await self._opener()
            await self._sink.insert_rows(chunk)
        except Exception as e:  # the database is down, slow or refuses: keep the rows, try again later
            self._errors.inc()
            self._delay = min(MAX_RETRY_S, max(self._delay * 2, self.interval_s))
            if not self._failing:
                self._failing = True
                log.error(
                    "usage ledger: could not write %d rows (%s); they stay buffered (%d now, at most %d)",
                    len(chunk),
                    type(e).__name__,
                    waiting,
                    self.capacity,
                )
            return False
        return True

    async def _write_recovered(self, found: Recovered) -> bool:
        """A crashed process's rows, those the database does not hold yet (it may have written some just before
        it died); its spool files are deleted once they are all in. Rows the database refuses for another
        reason than being unavailable (a spool of another version) are left in their files, and logged."""
        for kind, rows, counter in (
            ("finished", found.finished, self._recovered_finished),
            ("interrupted", found.interrupted, self._recovered_interrupted),
        ):
            while rows:
                chunk = [{c: r.get(c) for c in COLUMNS} for r in rows[: self.batch]]
                try:
                    for d in chunk:
                        d["day"] = day_of(int(d["at_ms"] or 0))  # a row without a time: refused below
                    if self._sink is None:
                        assert self._opener is not None, "start() was not called"
                        self._sink = await self._opener()
                    written = await self._sink.insert_missing(chunk)
                except DatabaseUnavailable as e:
                    self._errors.inc()
                    self._delay = min(MAX_RETRY_S, max(self._delay * 2, self.interval_s))
                    log.error("usage ledger: the crashed process's rows wait for the database (%s)", e)
                    return False
                except Exception as e:  # not retried: the files stay for a person to look at
                    log.error(
                        "usage ledger: the database refused the crashed process's rows (%s); they stay in %s",
                        type(e).__name__,
                        ", ".join(p.name for p in found.files),
                    )
                    found.release()
                    self._recovered = None
                    return True
                del rows[: len(chunk)]
                counter.inc(written)
                log.warning("usage ledger: %d %s rows of the crashed process written", written, kind)
        try:
            await asyncio.to_thread(found.remove)
        except OSError as e:
            self._spool_failed(e)
        self._recovered = None
        return True

    async def _checkpoint(self, spool: Spool) -> None:
        """Append the rows the spool lacks and replace the snapshot of the requests in flight. On the loop only
        two list copies; the snapshot's rows are built and written in a worker thread."""
        new = self._rows[self._spooled :]
        recs = list(self._open.values())
        if not new and not self._checkpointed and not any(r.key != NONE and r.endpoint != "other" for r in recs):
            return  # nothing new, and no snapshot on disk
        try:
            done = await asyncio.to_thread(self._write_checkpoint, spool, new, recs, self._wall(), time.perf_counter())
        except OSError as e:
            self._spool_failed(e)
            return
        self._spooled += len(new)
        self._checkpointed = done
        if self._spool_failing:
            self._spool_failing = False
            log.warning("usage ledger: the crash spool is written again")

    def _write_checkpoint(
        self, spool: Spool, new: list[Row], recs: list[RequestRecord], now: float, perf: float
    ) -> set[tuple[str, float]]:
        running = in_flight(recs)
        spool.write(new, [interrupted_row(rec, now, perf) for rec in running])
        return {(r.rid, r.t0) for r in running}

    def _spool_failed(self, e: OSError) -> None:
        self._spool_errors.inc()
        if not self._spool_failing:
            self._spool_failing = True
            log.error("usage ledger: could not write the crash spool (%s); rows not yet written are at risk", e)

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Stop the background task and write what is left (for at most `timeout_s`); the rest stays in the
        spool for the next start, or without a spool is counted as dropped."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, timeout_s)
            except TimeoutError:
                log.warning("usage ledger: the last background write did not end in %gs", timeout_s)
        if (self._rows or self._recovered is not None or self._spool is not None) and self._opener is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush(), timeout_s)
        left = len(self._rows)
        spool, self._spool = self._spool, None
        kept = 0
        if spool is not None:
            kept = self._spooled
            try:
                await asyncio.to_thread(spool.close, keep_rows=spool.holds_rows)
            except OSError as e:
                self._spool_failed(e)
        if self._recovered is not None:
            self._recovered.release()  # not written: its files stay for the next start
        if kept:
            log.error("usage ledger: %d rows could not be written before shutdown; the next start writes them", kept)
        if left > kept:
            self._dropped_shutdown.inc(left - kept)
            log.error("usage ledger: %d rows could not be written before shutdown (counted as dropped)", left - kept)
        self._rows.clear()
        self._spooled = 0
