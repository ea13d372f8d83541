"""The usage ledger's buffer, and the recent activity the status page shows.

`UsageLedger.record` is called by `finish_record` once per generation request, on the request path, so it
only appends a tuple to a bounded deque: no I/O, no await, nothing a request could wait on. A background
task (`start`) writes the buffer to the database in batches, one multi-row INSERT each, every
`usage.flush_interval_s` or as soon as `usage.batch_rows` rows are waiting. While the database is down
or slow the rows stay in the buffer and the write is retried (backing off to `MAX_RETRY_S`); a row that
finds the buffer full (`usage.buffer_rows`) is counted in `gateway_usage_rows_dropped_total{reason=
"buffer_full"}`, never lost silently. `aclose` (the lifespan's shutdown, after the requests in flight have
ended) writes what is left, bounded in time; rows it cannot write are counted as `reason="shutdown"`.
Writes are at least once: a commit whose answer is lost is written again.

Rows are of authenticated generation requests (a key's name is known), whatever their outcome: refusals
by limits and budgets included, bad keys (401) not. `Activity` (always on, whether or not the ledger is)
keeps the last errors in a small ring and tokens per key in one-minute buckets for the last hour.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from itertools import islice
from typing import Any, Protocol

from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.record import NONE, RequestRecord
from llm_gateway.settings import UsageConfig

log = logging.getLogger("gateway.usage")

MAX_RETRY_S = 30.0
COLUMNS = (
    "at_ms",
    "request_id",
    "key",
    "key_id",
    "model",
    "backend",
    "endpoint",
    "status",
    "outcome",
    "prompt_tokens",
    "completion_tokens",
    "usage_estimated",
    "ttft_ms",
    "duration_ms",
)
Row = tuple[Any, ...]  # the values of COLUMNS


class RowSink(Protocol):
    """Where batches go: `llm_gateway.state.usage.UsageStore` (one INSERT per call)."""

    async def insert(self, rows: Sequence[Mapping[str, Any]]) -> None: ...


SinkOpener = Callable[[], Awaitable[RowSink]]


class UsageLedger:
    def __init__(self, metrics: Metrics, cfg: UsageConfig, *, wall: Callable[[], float] = time.time) -> None:
        self.enabled = cfg.ledger
        self.capacity = cfg.buffer_rows
        self.batch = cfg.batch_rows
        self.interval_s = cfg.flush_interval_s
        self.activity = Activity()
        self._wall = wall
        self._rows: deque[Row] = deque()
        self._dropped_full = metrics.usage_rows_dropped.labels("buffer_full")
        self._dropped_shutdown = metrics.usage_rows_dropped.labels("shutdown")
        self._written = metrics.usage_rows_written
        self._errors = metrics.usage_flush_errors
        metrics.usage_rows_buffered.set_function(lambda: len(self._rows))
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._opener: SinkOpener | None = None
        self._sink: RowSink | None = None
        self._closing = False
        self._delay = self.interval_s
        self._failing = False

    @property
    def buffered(self) -> int:
        return len(self._rows)

    # -- the request path ----------------------------------------------------------------------------
    def record(self, rec: RequestRecord, duration_s: float) -> None:
        """One finished generation request (never blocks, never raises on a full buffer)."""
        now = self._wall()
        self.activity.record(rec, now)
        if not self.enabled or rec.key == NONE:
            return
        rows = self._rows
        if len(rows) >= self.capacity:
            self._dropped_full.inc()
            return
        rows.append(
            (
                int((now - duration_s) * 1000),
                rec.rid,
                rec.key,
                rec.key_id,
                rec.model,
                rec.backend,
                rec.endpoint,
                rec.status,
                rec.outcome,
                rec.prompt_tokens or 0,
                rec.completion_tokens or 0,
                rec.usage_estimated,
                None if rec.ttft_s is None else round(rec.ttft_s * 1000, 3),
                round(duration_s * 1000, 3),
            )
        )
        if len(rows) >= self.batch and not self._wake.is_set():
            self._wake.set()

    # -- behind it -----------------------------------------------------------------------------------
    def start(self, opener: SinkOpener) -> None:
        """Write the buffer in the background; `opener` gives the sink (it may fail: retried later)."""
        self._opener = opener
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-ledger")

    async def _run(self) -> None:
        while not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._delay)
            self._wake.clear()
            if self._closing:
                return
            await self.flush()

    async def flush(self) -> bool:
        """Write every buffered row, a batch per INSERT; False when the database failed (the rows that were
        not written stay buffered, and the next try waits longer)."""
        rows = self._rows
        while rows:
            n = min(self.batch, len(rows))
            chunk = [dict(zip(COLUMNS, r, strict=True)) for r in islice(rows, n)]
            for d in chunk:
                d["day"] = _day(d["at_ms"])
            try:
                if self._sink is None:
                    assert self._opener is not None, "start() was not called"
                    self._sink = await self._opener()
                await self._sink.insert(chunk)
            except Exception as e:  # the database is down, slow or refuses: keep the rows, try again later
                self._errors.inc()
                self._delay = min(MAX_RETRY_S, max(self._delay * 2, self.interval_s))
                if not self._failing:
                    self._failing = True
                    log.error(
                        "usage ledger: could not write %d rows (%s); they stay buffered (%d now, at most %d)",
                        n,
                        type(e).__name__,
                        len(rows),
                        self.capacity,
                    )
                return False
            for _ in range(n):
                rows.popleft()
            self._written.inc(n)
        if self._failing:
            self._failing = False
            log.warning("usage ledger: writing again")
        self._delay = self.interval_s
        return True

    async def aclose(self, timeout_s: float = 10.0) -> None:
        """Stop the background task and write what is left (for at most `timeout_s`); count the rest."""
        self._closing = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, timeout_s)
            except TimeoutError:
                log.warning("usage ledger: the last background write did not end in %gs", timeout_s)
        if self._rows and self._opener is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.flush(), timeout_s)
        left = len(self._rows)
        if left:
            self._dropped_shutdown.inc(left)
            self._rows.clear()
            log.error("usage ledger: %d rows could not be written before shutdown (counted as dropped)", left)


def _day(at_ms: int) -> str:
    return dt.datetime.fromtimestamp(at_ms / 1000, dt.UTC).strftime("%Y-%m-%d")


class Activity:
    """What the status page shows of recent traffic: the last `errors` failed requests (codes, never
    messages) and, per key, requests and tokens in one-minute buckets for the last `minutes` minutes."""

    def __init__(self, errors: int = 50, minutes: int = 60) -> None:
        self.errors: deque[dict[str, Any]] = deque(maxlen=errors)
        self.minutes = minutes
        self._buckets: dict[int, dict[str, list[int]]] = {}  # minute -> key -> [requests, prompt, completion]

    def record(self, rec: RequestRecord, now_s: float) -> None:
        if rec.status >= 400 or rec.outcome != "success":
            self.errors.append(
                {
                    "at": round(now_s, 3),
                    "request_id": rec.rid,
                    "key": rec.key,
                    "model": rec.model,
                    "backend": rec.backend,
                    "endpoint": rec.endpoint,
                    "status": rec.status,
                    "outcome": rec.outcome,
                    "error": rec.error,
                }
            )
        if rec.key == NONE:
            return
        minute = int(now_s // 60)
        bucket = self._buckets.get(minute)
        if bucket is None:
            for old in [m for m in self._buckets if m <= minute - self.minutes]:
                del self._buckets[old]
            bucket = self._buckets[minute] = {}
        counts = bucket.get(rec.key)
        if counts is None:
            counts = bucket[rec.key] = [0, 0, 0]
        counts[0] += 1
        counts[1] += rec.prompt_tokens or 0
        counts[2] += rec.completion_tokens or 0

    def recent_errors(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(reversed(self.errors))

    def tokens_by_key(self, now_s: float) -> list[dict[str, Any]]:
        """Per key over the last `minutes` minutes: totals and tokens per minute (oldest first), most used first."""
        last = int(now_s // 60)
        first = last - self.minutes + 1
        out: dict[str, dict[str, Any]] = {}
        for minute, bucket in self._buckets.items():
            if not first <= minute <= last:
                continue
            for key, (n, p, c) in bucket.items():
                k = out.get(key)
                if k is None:
                    k = out[key] = {
                        "key": key,
                        "requests": 0,
                        "prompt_tokens": 0,
                        "completion_tokens": 0,
                        "per_minute": [0] * self.minutes,
                    }
                k["requests"] += n
                k["prompt_tokens"] += p
                k["completion_tokens"] += c
                k["per_minute"][minute - first] += p + c
        for k in out.values():
            k["total_tokens"] = k["prompt_tokens"] + k["completion_tokens"]
        return sorted(out.values(), key=lambda k: (-k["total_tokens"], k["key"]))
