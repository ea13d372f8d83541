"""The Batch API's runner: each replica runs the lines of every running batch through the same request path as
live traffic (`GenerationService.handle`: keys, limits and budgets, routing, retries, failover, metrics, the usage
ledger), and ends batches when they are done, expired or cancelled.

A line is a request made on behalf of the key that created the batch (its `Principal`, looked up by id at the
time the line runs: a key revoked since fails its remaining lines with 401), in the `batches.priority` class
(`batch` by default: the key's own class can only be lowered, as by the priority header), so batch lines wait
behind interactive work in the fair queues (routing/admission.py) and fill the slots it leaves idle. Its answer
is collected by a `BatchExchange` (the service's `ClientExchange`) and recorded with the line
(state/batches.py: claims with a lease, so a line is run by one replica at a time and is done with its result
recorded, or redone). A line refused for a passing reason (429: limits, a full queue; 502-504) is given back
and retried after `batches.retry_after_s`, up to `batches.max_attempts`; past that its refusal is its result.

The loop wakes when a batch is created or cancelled here, when one of its lines ends, and every
`batches.poll_s` otherwise (for batches created or cancelled on another replica). A batch runs at most
`batches.concurrency` lines at once across replicas (counted from the live leases). One whose
`completion_window` passed is ended `expired`: its lines in flight are cancelled, its unrun lines go to the
error file with `batch_expired`. A cancelled batch's lines in flight are cancelled and it ends `cancelled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway.errors import AuthenticationFailed, GatewayError, ServiceUnavailable
from llm_gateway.exchange import JSON, Headers
from llm_gateway.observability.record import RequestRecord, finish_record, outcome_of
from llm_gateway.service.pipeline import GenerationService
from llm_gateway.service.runtime import Gateway
from llm_gateway.types import Endpoint

if TYPE_CHECKING:
    from llm_gateway.state.batches import ActiveBatch, BatchStore, ClaimedLine

log = logging.getLogger("gateway.batches")

#: the routes a batch may name, and the service's endpoint for each
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
}
#: answers that say "not now" rather than "never": the line is tried again later
PASSING = frozenset({429, 502, 503, 504})
REOPEN_AFTER_S = 5.0
#: how often a runner deletes the files that expired (they are 404s from their expires_at on, swept or not)
SWEEP_S = 60.0


class BatchExchange:
    """The service's `ClientExchange` for one batch line: nobody is waiting on a socket; the answer is kept."""

    __slots__ = ("_headers", "body", "rid", "status")

    def __init__(self, rid: str, headers: dict[bytes, bytes]) -> None:
        self.rid = rid
        self.status = 0
        self.body = b""
        self._headers = headers

    def header(self, name: bytes) -> bytes | None:
        return self._headers.get(name)

    async def respond(self, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
        self.status, self.body = status, body

    async def start(self, status: int, headers: Headers, *, hold: bool = False) -> None:
        self.status = status

    async def write(self, data: bytes) -> None:
        self.body += data

    async def end(self, data: bytes = b"") -> None:
        self.body += data

    def watch_disconnect(self, delay_s: float = 0.0) -> None:
        pass  # no client to lose: the runner cancels a line itself (a batch cancelled or expired)

    def stop_watching(self) -> None:
        pass


class Batches:
    """The batch store, opened on first need, and the runner; what the dialects' handlers are given."""

    def __init__(self, open_store: Callable[[], Awaitable[BatchStore]], gw: Gateway, service: GenerationService):
        self._open = open_store
        self._lock = asyncio.Lock()
        self._retry_at = 0.0
        self._store: BatchStore | None = None
        self.runner = BatchRunner(gw, service, self.store)

    async def store(self) -> BatchStore:
        if self._store is not None:
            return self._store
        async with self._lock:
            if self._store is None:
                if time.monotonic() < self._retry_at:
                    raise ServiceUnavailable(
                        "The batch store is unavailable; try again shortly.", code="database_unavailable"
                    )
                try:
                    self._store = await self._open()
                except GatewayError:
                    self._retry_at = time.monotonic() + REOPEN_AFTER_S
                    raise
        return self._store

    def kick(self) -> None:
        """Something changed here (a batch created or cancelled): run the loop now (starting it if needed)."""
        self.runner.wake()


class BatchRunner:
    """This replica's runner of batch lines."""

    def __init__(self, gw: Gateway, service: GenerationService, store: Callable[[], Awaitable[BatchStore]]):
        self.gw, self.service, self._store = gw, service, store
        self.replica = "rep_" + os.urandom(8).hex()  # this process: a lease names it, and lapses when it dies
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._running: dict[str, dict[int, asyncio.Task[None]]] = {}  # batch -> line -> its task
        self._renewed = 0.0
        self._sweep_at = 0.0  # time.time() of the next sweep of expired files

    def start(self) -> None:
        if self._task is None and not self._closing:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="batch-runner")

    def wake(self) -> None:
        self.start()
        self._wake.set()

    @property
    def in_flight(self) -> int:
        return sum(len(lines) for lines in self._running.values())

    async def aclose(self) -> None:
        """Stop: the lines in flight are cancelled and given back, so a restart (or another replica) takes them
        at once rather than after their lease."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        stopped = [(bid, line) for bid, lines in self._running.items() for line in lines]
        for bid in list(self._running):
            await self._stop(bid)
        if stopped:
            with contextlib.suppress(GatewayError):
                store = await self._store()
                for bid, line in stopped:
                    await store.release(bid, line, self.replica, 0)

    async def _loop(self) -> None:
        while not self._closing:
            self._wake.clear()
            try:
                await self._tick()
            except GatewayError as e:  # the database is down: the next tick tries again
                log.warning("batch runner: %s", e.message)
            except Exception:
                log.exception("batch runner: unexpected error")
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that meets its timeout
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.gw.runtime.config.batches.poll_s):
                    await self._wake.wait()

    async def _tick(self) -> None:
        cfg = self.gw.runtime.config.batches
        store = await self._store()
        now = time.time()
        if now >= self._sweep_at:  # expired files (OpenAI's expires_after) go; any replica may, at most once a minute
            self._sweep_at = now + SWEEP_S
            if n := await store.delete_expired(int(now)):
                log.info("deleted %d expired files", n)
        now_ms = int(now * 1000)
        lease_ms = int(cfg.lease_s * 1000)
        active = await store.active()
        for b in active:
            running = self._running.get(b.id, {})
            if b.status == "cancelling" or b.expires_at <= now:
                await self._stop(b.id)
                ended = "cancelled" if b.status == "cancelling" else "expired"
                if await store.finish(b.id, ended, int(now)):
                    log.info("batch %s %s", b.id, ended)
                continue
            held = max(len(running), await store.held(b.id, now_ms))
            claimed: list[ClaimedLine] = []
            if held < cfg.concurrency:
                claimed = await store.claim(b.id, self.replica, cfg.concurrency - held, now_ms, lease_ms)
                for c in claimed:
                    self._spawn(store, b, c)
            if not claimed and held == 0 and await store.finish(b.id, "completed", int(now)):
                log.info("batch %s completed", b.id)
        live = {b.id for b in active}
        for bid in [bid for bid in self._running if bid not in live]:  # ended by another replica
            await self._stop(bid)
        if self._running and time.monotonic() - self._renewed > cfg.lease_s / 3:
            self._renewed = time.monotonic()
            for bid, lines in list(self._running.items()):
                await store.renew(self.replica, bid, sorted(lines), now_ms + lease_ms)

    def _spawn(self, store: BatchStore, b: ActiveBatch, c: ClaimedLine) -> None:
        task = asyncio.get_running_loop().create_task(self._line(store, b, c))
        self._running.setdefault(b.id, {})[c.line] = task

    async def _stop(self, batch_id: str) -> None:
        lines = self._running.pop(batch_id, {})
        for task in lines.values():
            task.cancel()
        if lines:  # not `await task` under suppress(CancelledError): that would swallow this task's own cancel
            await asyncio.wait(lines.values())

    async def _line(self, store: BatchStore, b: ActiveBatch, c: ClaimedLine) -> None:
        try:
            status, rid, body = await self._execute(b, c)
            cfg = self.gw.runtime.config.batches
            if status in PASSING and c.attempts < cfg.max_attempts:
                retry_at = int((time.time() + cfg.retry_after_s) * 1000)
                await store.release(b.id, c.line, self.replica, retry_at)
            elif not await store.record(b.id, c.line, self.replica, status, rid, body.decode("utf-8", "replace")):
                log.info("batch %s line %d: its lease was lost; this result is dropped", b.id, c.line)
        except GatewayError as e:  # not recorded: the lease lapses and the line is redone
            log.warning("batch %s line %d not recorded: %s", b.id, c.line, e.message)
        finally:
            lines = self._running.get(b.id)
            if lines is not None and lines.get(c.line) is asyncio.current_task():
                del lines[c.line]
                if not lines:
                    del self._running[b.id]
            self._wake.set()

    async def _execute(self, b: ActiveBatch, c: ClaimedLine) -> tuple[int, str, bytes]:
        """Run one line through the service; (status, request id, the answer's JSON body)."""
        gw, rt = self.gw, self.gw.runtime
        rid = os.urandom(12).hex()
        endpoint = ENDPOINTS[b.endpoint]
        exchange = BatchExchange(rid, {rt.priority_header: rt.config.batches.priority.encode()})
        rec = RequestRecord(rid, time.perf_counter(), "POST", b.endpoint)
        rec.endpoint = endpoint
        gw.usage.begin(rec)
        try:
            who = rt.auth.principal_by_id(b.owner)
            if who is None:
                raise AuthenticationFailed("The API key that created this batch is no longer valid.")
            rec.key, rec.key_id = who.name, who.id
            body: dict[str, Any] = orjson.loads(c.body)
            await self.service.handle(exchange, rec, rt, endpoint, body, who)
            return exchange.status or 200, rid, exchange.body
        except GatewayError as e:
            rec.status, rec.error = e.status, e.code
            rec.outcome = outcome_of(e.status, e.code)
            return e.status, rid, e.body()
        except asyncio.CancelledError:
            rec.status, rec.outcome = 499, "cancelled"
            raise
        except Exception:
            log.exception("batch %s line %d: unexpected error", b.id, c.line)
            rec.status, rec.outcome, rec.error = 500, "error", "internal_error"
            error = GatewayError("The gateway hit an internal error; see its logs.", code="internal_error")
            return 500, rid, error.body()
        finally:
            if rec.status == 0:
                rec.status = exchange.status or 200
            finish_record(gw.metrics, gw.access, rec, gw.usage)
