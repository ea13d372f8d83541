"""The usage ledger: a bounded buffer filled on the request path and written behind it in batches (one
INSERT each), kept and retried while the database is down, counted when it overflows, written on shutdown;
then the aggregates per key, model and day from a real SQLite file, as JSON and CSV through
/admin/usage, and as the `llm-gateway usage` table."""

from __future__ import annotations

import asyncio
import csv
import io
import itertools
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.access.keys import config_key_id, digest_of
from llm_gateway.app import create_app
from llm_gateway.cli import main
from llm_gateway.errors import DatabaseUnavailable
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.observability.activity import Activity
from llm_gateway.observability.ledger import COLUMNS, UsageLedger
from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.record import RequestRecord
from llm_gateway.settings import Price, UsageConfig
from llm_gateway.settings.loader import parse_config
from llm_gateway.state.database import Database, database_url
from llm_gateway.state.usage import UsageStore, parse_since, to_csv, to_table
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.support.postgres_server import PostgresServer, running_postgres

DEADLINE_S = 30.0


async def eventually(cond: Callable[[], Any], what: str, timeout: float = DEADLINE_S) -> Any:
    """Poll `cond` (on the event loop, so the background writer runs between polls) until it is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last seen {got!r}")
        await asyncio.sleep(0.01)


def rec(i: int = 0, key: str = "alice", model: str = "m", **fields: Any) -> RequestRecord:
    r = RequestRecord(f"req-{i}", time.perf_counter(), "POST", "/v1/chat/completions", endpoint="chat", key=key)
    r.key_id = f"kc_{key}"  # a key's id (its identity; the name is a label)
    r.model, r.backend, r.engine, r.status = model, "engine-a", "vllm", 200
    r.prompt_tokens, r.completion_tokens, r.ttft_s = 10, 5, 0.25
    for k, v in fields.items():
        setattr(r, k, v)
    return r


class Sink:
    """Records every INSERT; fails while `down` is set (as the database does when it is unavailable);
    blocks while `hang` is set."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.down = False
        self.hang = False
        self.attempts = 0

    @property
    def rows(self) -> list[dict[str, Any]]:
        return [r for b in self.batches for r in b]

    async def insert_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        self.attempts += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.down:
            raise DatabaseUnavailable("the gateway's database is unavailable (timed out); try again later")
        self.batches.append([dict(zip(COLUMNS, r, strict=True)) for r in rows])


def ledger(**cfg: Any) -> tuple[UsageLedger, Metrics]:
    m = Metrics()
    return UsageLedger(m, UsageConfig(ledger=True, **cfg)), m


def metric(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)  # type: ignore[no-any-return]


def opener(sink: Sink) -> Callable[[], Awaitable[Sink]]:
    async def open_() -> Sink:
        return sink

    return open_


# -- the buffer ---------------------------------------------------------------------------------------


def test_record_appends_one_row_with_the_requests_fields_and_never_blocks():
    led, m = ledger()
    r = rec(7, usage_estimated=True)
    led.record(r, 1.5)
    assert led.buffered == 1 and metric(m, "gateway_usage_rows_buffered") == 1.0
    (row,) = led._rows
    assert row[1:] == (
        "req-7",
        "alice",
        "kc_alice",
        "m",
        "engine-a",
        "chat",
        200,
        "success",
        10,
        5,
        True,
        250.0,
        1500.0,
    )
    assert abs(row[0] - (time.time() - 1.5) * 1000) < 5000  # when the request arrived, in unix ms


def test_a_full_buffer_drops_new_rows_and_counts_them():
    led, m = ledger(buffer_rows=3)
    for i in range(5):
        led.record(rec(i), 0.1)
    assert led.buffered == 3 and [r[1] for r in led._rows] == ["req-0", "req-1", "req-2"]
    assert metric(m, "gateway_usage_rows_dropped_total", reason="buffer_full") == 2.0
    assert metric(m, "gateway_usage_rows_dropped_total", reason="shutdown") == 0.0


def test_requests_without_a_key_and_a_ledger_that_is_off_write_no_rows():
    led, _ = ledger()
    led.record(rec(1, key="none", status=401, outcome="auth_error"), 0.1)
    assert led.buffered == 0
    off = UsageLedger(Metrics(), UsageConfig())
    off.record(rec(2), 0.1)
    assert off.buffered == 0 and off.activity.tokens_by_key(time.time())[0]["key"] == "alice"


async def test_rows_are_written_in_batches_one_insert_each():
    led, m = ledger(batch_rows=2)
    sink = Sink()
    led._opener = opener(sink)
    for i in range(5):
        led.record(rec(i), 0.1)
    assert await led.flush() is True
    assert [len(b) for b in sink.batches] == [2, 2, 1]
    assert [r["request_id"] for r in sink.rows] == [f"req-{i}" for i in range(5)]
    assert led.buffered == 0 and metric(m, "gateway_usage_rows_written_total") == 5.0


async def test_a_full_batch_is_written_at_once_and_a_partial_one_on_the_interval():
    led, _ = ledger(batch_rows=3, flush_interval_s=60)
    sink = Sink()
    led.start(opener(sink))
    try:
        for i in range(3):
            led.record(rec(i), 0.1)
        await eventually(lambda: len(sink.rows) == 3, "the full batch to be written")
        led.record(rec(9), 0.1)
        assert led.buffered == 1  # waits for the interval (60 s), or shutdown
    finally:
        await led.aclose()
    assert [r["request_id"] for r in sink.rows] == ["req-0", "req-1", "req-2", "req-9"]  # the rest, on shutdown

    quick, _ = ledger(flush_interval_s=0.02)
    sink2 = Sink()
    quick.start(opener(sink2))
    try:
        quick.record(rec(1), 0.1)
        await eventually(lambda: len(sink2.rows) == 1, "the interval's write")
    finally:
        await quick.aclose()


async def test_rows_stay_buffered_while_the_database_is_down_and_are_written_once_it_is_back():
    led, m = ledger(batch_rows=2)
    sink = Sink()
    led._opener = opener(sink)
    sink.down = True
    for i in range(3):
        led.record(rec(i), 0.1)
    assert await led.flush() is False
    assert await led.flush() is False
    assert led.buffered == 3 and sink.rows == []
    assert metric(m, "gateway_usage_flush_errors_total") == 2.0
    assert led._delay > led.interval_s  # the next try waits longer
    sink.down = False
    assert await led.flush() is True
    assert [r["request_id"] for r in sink.rows] == ["req-0", "req-1", "req-2"]  # each once, in order
    assert led._delay == led.interval_s


async def test_the_background_writer_retries_by_itself_until_the_database_is_back():
    led, _ = ledger(flush_interval_s=0.01)
    sink = Sink()
    sink.down = True
    led.start(opener(sink))
    try:
        led.record(rec(1), 0.1)
        await eventually(lambda: sink.attempts >= 2, "two failed writes")
        assert led.buffered == 1
        sink.down = False
        await eventually(lambda: sink.rows, "the write after the database came back")
        assert led.buffered == 0
    finally:
        await led.aclose()


async def test_an_opener_that_fails_is_retried_too():
    led, _ = ledger()
    sink, calls = Sink(), []

    async def flaky() -> Sink:
        calls.append(1)
        if len(calls) == 1:
            raise DatabaseUnavailable("cannot open")
        return sink

    led._opener = flaky
    led.record(rec(1), 0.1)
    assert await led.flush() is False and led.buffered == 1
    assert await led.flush() is True and len(sink.rows) == 1


async def test_past_the_bound_while_the_database_is_down_rows_are_counted_as_dropped():
    led, m = ledger(buffer_rows=3)
    sink = Sink()
    sink.down = True
    led._opener = opener(sink)
    for i in range(5):
        led.record(rec(i), 0.1)
        await led.flush()
    assert metric(m, "gateway_usage_rows_dropped_total", reason="buffer_full") == 2.0
    sink.down = False
    await led.flush()
    assert len(sink.rows) == 3  # what the buffer held is written; the two dropped are counted, not lost silently


async def test_shutdown_writes_what_is_left():
    led, m = ledger(flush_interval_s=60)
    sink = Sink()
    led.start(opener(sink))
    for i in range(4):
        led.record(rec(i), 0.1)
    await led.aclose()
    assert len(sink.rows) == 4 and led.buffered == 0
    assert metric(m, "gateway_usage_rows_dropped_total", reason="shutdown") == 0.0


async def test_shutdown_with_the_database_down_or_hanging_ends_in_time_and_counts_the_rest():
    for how in ("down", "hang"):
        led, m = ledger(flush_interval_s=60)
        sink = Sink()
        setattr(sink, how, True)
        led.start(opener(sink))
        for i in range(4):
            led.record(rec(i), 0.1)
        t = time.monotonic()
        await led.aclose(timeout_s=0.3)
        assert time.monotonic() - t < 5, how
        assert metric(m, "gateway_usage_rows_dropped_total", reason="shutdown") == 4.0, how
        assert led.buffered == 0


# -- recent activity (the status page) ----------------------------------------------------------------


def test_activity_keeps_the_last_errors_newest_first_without_messages():
    a = Activity(errors=3)
    for i in range(5):
        a.record(rec(i, status=502, outcome="upstream_error", error="upstream_unreachable"), 1000.0 + i)
    a.record(rec(9), 1010.0)  # a success is no error
    errs = a.recent_errors()
    assert [e["request_id"] for e in errs] == ["req-4", "req-3", "req-2"]
    assert errs[0] == {
        "at": 1004.0,
        "request_id": "req-4",
        "key": "alice",
        "model": "m",
        "backend": "engine-a",
        "endpoint": "chat",
        "status": 502,
        "outcome": "upstream_error",
        "error": "upstream_unreachable",
    }


def test_activity_sums_tokens_per_key_per_minute_for_the_last_hour():
    a = Activity(minutes=60)
    t0 = 60_000.0 * 60  # a minute boundary
    a.record(rec(1, key="alice"), t0)
    a.record(rec(2, key="alice"), t0 + 59)
    a.record(rec(3, key="bob"), t0 + 60)
    early = {k["key"]: k for k in a.tokens_by_key(t0 + 60)}
    assert early["alice"]["total_tokens"] == 30 and early["alice"]["requests"] == 2
    assert early["alice"]["per_minute"][-2:] == [30, 0] and early["bob"]["per_minute"][-2:] == [0, 15]
    assert [k["key"] for k in a.tokens_by_key(t0 + 60)] == ["alice", "bob"]  # most tokens first
    a.record(rec(4, key="alice"), t0 + 61 * 60)  # an hour later: those minutes have left the window
    assert a.tokens_by_key(t0 + 61 * 60) == [
        {"key": "alice", "requests": 1, "prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
         "per_minute": [0] * 59 + [15]},
    ]  # fmt: skip
    assert len(a._buckets) == 1  # the old minutes are dropped, not only hidden


# -- the database: rows in, aggregates out ------------------------------------------------------------


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    opened = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}", statement_timeout_s=0.3)
    yield opened
    await opened.aclose()


@pytest.fixture(params=["sqlite", "postgres"])
async def any_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    """The embedded SQLite file, and a real Postgres: the same SQL must hold on both."""
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}"
    else:
        url = request.getfixturevalue("postgres").new_database()
    opened = await Database.open(url, statement_timeout_s=2)
    yield opened
    await opened.aclose()


DAY1 = 1_764_547_200.0  # 2025-12-01T00:00:00Z
DAY2 = DAY1 + 86400


async def fill(db: Database, rows: list[tuple[float, RequestRecord]]) -> None:
    led, _ = ledger()
    for at, r in rows:
        led._wall = lambda at=at: at  # type: ignore[misc]
        led.record(r, 0.0)
    led._opener = opener(UsageStore(db))  # type: ignore[arg-type]
    assert await led.flush()


async def test_rows_round_trip_through_the_database_and_aggregate_per_key_model_and_day(any_db: Database):
    db = any_db
    await fill(
        db,
        [
            (DAY1 + 10, rec(1, "alice", "small", prompt_tokens=100, completion_tokens=10)),
            (DAY1 + 20, rec(2, "alice", "small", prompt_tokens=50, completion_tokens=5)),
            (DAY1 + 30, rec(3, "alice", "big", prompt_tokens=1000, completion_tokens=100, status=429)),
            (DAY2 + 10, rec(4, "bob", "small", prompt_tokens=7, completion_tokens=3)),
        ],
    )
    store = UsageStore(db)
    assert await store.count() == 4
    since = int(DAY1 * 1000)
    by_key_model = [r.as_dict() for r in await store.report(since, ["key", "model"])]
    assert by_key_model == [
        {"key": "alice", "key_id": "kc_alice", "model": "big", "requests": 1, "errors": 1, "prompt_tokens": 1000,
         "completion_tokens": 100, "total_tokens": 1100, "cost": None},
        {"key": "alice", "key_id": "kc_alice", "model": "small", "requests": 2, "errors": 0, "prompt_tokens": 150,
         "completion_tokens": 15, "total_tokens": 165, "cost": None},
        {"key": "bob", "key_id": "kc_bob", "model": "small", "requests": 1, "errors": 0, "prompt_tokens": 7,
         "completion_tokens": 3, "total_tokens": 10, "cost": None},
    ]  # fmt: skip
    by_day = {r.group["day"]: r.requests for r in await store.report(since, ["day"])}
    assert by_day == {"2025-12-01": 3, "2025-12-02": 1}
    assert [r.group for r in await store.report(int(DAY2 * 1000), ["key"])] == [{"key": "bob", "key_id": "kc_bob"}]
    assert [r.requests for r in await store.report(since, ["key"], until_ms=int(DAY2 * 1000))] == [3]
    # by key alone, priced per model: alice = 1000 x 1 + 100 x 2 (big) + 150 x 0.1 + 15 x 0.2 (small), per 1M
    prices = {"big": Price(input_per_million=1, output_per_million=2), "small": Price(input_per_million=0.1,
              output_per_million=0.2)}  # fmt: skip
    alice = (await store.report(since, ["key"], prices))[0]
    assert alice.group == {"key": "alice", "key_id": "kc_alice"} and alice.cost == pytest.approx((1200 + 18) / 1e6)
    # a name that was two keys (one deleted, one created under its name) is two lines; an unknown id is null
    await fill(db, [(DAY2 + 20, rec(5, "bob", "small", key_id="kr_new")), (DAY2 + 30, rec(6, "bob", key_id=None))])
    bobs = [r.group for r in await store.report(int(DAY2 * 1000), ["key"])]
    assert sorted(bobs, key=lambda g: g["key_id"] or "") == [
        {"key": "bob", "key_id": None},
        {"key": "bob", "key_id": "kc_bob"},
        {"key": "bob", "key_id": "kr_new"},
    ]


async def test_a_locked_database_keeps_the_rows_until_it_is_free_again(db: Database, tmp_path: Path):
    led, _ = ledger()
    led._opener = opener(UsageStore(db))  # type: ignore[arg-type]
    led.record(rec(1), 0.1)
    other = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the database: ours times out (busy timeout 0.3 s)
    try:
        assert await led.flush() is False
        assert led.buffered == 1
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert await led.flush() is True
    assert await UsageStore(db).count() == 1


async def test_rows_wait_in_the_buffer_while_postgres_is_down_and_are_written_after_its_restart(
    postgres: PostgresServer,
):
    db = await Database.open(postgres.new_database(), connect_timeout_s=1, statement_timeout_s=1)
    led, m = ledger()
    led._opener = opener(UsageStore(db))  # type: ignore[arg-type]
    try:
        led.record(rec(1), 0.1)
        assert await led.flush() is True
        postgres.stop()
        try:
            led.record(rec(2), 0.1)
            led.record(rec(3), 0.1)
            assert await led.flush() is False
            assert led.buffered == 2 and metric(m, "gateway_usage_flush_errors_total") == 1.0
        finally:
            postgres.start()
        assert await led.flush() is True  # the pool's dead connections are replaced (pre-ping)
        assert await UsageStore(db).count() == 3
    finally:
        await db.aclose()


# -- what a flush costs the event loop (issue 36: 2x CPU per request and a ~55 ms stall per flush) ------------

FLUSHED = 2000
#: loop-thread CPU a flushed row may cost: the tuples are handed over as they are (measured ~0.3 us a row on
#: SQLite; SQLAlchemy's multi-row insert compiled on the loop cost ~150 us a row)
LOOP_CPU_PER_ROW_US = 20


async def test_a_flush_costs_the_event_loop_what_a_counter_costs(any_db: Database, tmp_path: Path):
    """The ledger on must cost the request path about what it costs off: writing N rows (with the crash
    spool's checkpoint) takes the loop's thread microseconds a row, not SQL compiled or rows converted there
    (CPU time of the loop's thread, which the machine's other load does not inflate)."""
    led, _ = ledger(batch_rows=500, buffer_rows=FLUSHED * 2, flush_interval_s=3600)
    led.start(opener(UsageStore(any_db)), tmp_path / "spool")  # type: ignore[arg-type]
    try:
        await eventually(lambda: led._spool is not None, "the spool to open")
        for round_ in range(2):  # the first round also connects and warms the statement
            for i in range(FLUSHED):
                led.record(rec(round_ * FLUSHED + i), 0.01)
            cpu0 = time.thread_time()
            assert await led.flush() is True
            loop_cpu_s = time.thread_time() - cpu0
        assert led.buffered == 0 and await UsageStore(any_db).count() == 2 * FLUSHED
        assert loop_cpu_s * 1e6 / FLUSHED < LOOP_CPU_PER_ROW_US, f"{loop_cpu_s * 1e3:.1f} ms of loop CPU"
    finally:
        await led.aclose()


def test_the_csv_has_a_header_a_line_per_group_and_defuses_formulas():
    from llm_gateway.state.usage import UsageRow

    rows = [
        UsageRow({"key": "=cmd|x", "key_id": "kr_1", "model": "m"}, 2, 1, 10, 5, 0.5),
        UsageRow({"key": "b", "key_id": None, "model": "m"}, 1),
    ]
    text = to_csv(rows, ["key", "model"])
    got = list(csv.reader(io.StringIO(text)))
    assert got[0] == [
        "key",
        "key_id",
        "model",
        "requests",
        "errors",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cost",
    ]
    assert got[1] == ["'=cmd|x", "kr_1", "m", "2", "1", "10", "5", "15", "0.5"]
    assert got[2] == ["b", "", "m", "1", "0", "0", "0", "0", ""]
    assert "cost" not in to_csv([UsageRow({"key": "b", "key_id": "kr_1"}, 1)], ["key"])  # no prices: no cost column


def test_the_table_is_aligned_with_a_total_line():
    from llm_gateway.state.usage import UsageRow

    text = to_table(
        [
            UsageRow({"key": "alice", "key_id": "kc_a"}, 2, 0, 100, 10),
            UsageRow({"key": "bob", "key_id": None}, 1, 1, 5, 5),
        ],
        ["key"],
    )
    lines = text.splitlines()
    assert lines[0].split() == [
        "key", "key_id", "requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens"
    ]  # fmt: skip
    assert lines[-1].split() == ["total", "3", "1", "105", "15", "120"]
    assert len({len(line) for line in lines}) == 1


@pytest.mark.parametrize(
    ("text", "expected_s"),
    [("30m", 1800), ("24h", 86400), ("7d", 7 * 86400), ("2w", 14 * 86400)],
)
def test_since_takes_durations_before_now(text: str, expected_s: int):
    assert parse_since(text, 1_000_000_000.0) == (1_000_000_000 - expected_s) * 1000


def test_since_takes_utc_dates_and_refuses_the_rest():
    assert parse_since("2025-12-01", 0) == int(DAY1 * 1000)
    assert parse_since("2025-12-01T06:00:00Z", 0) == int((DAY1 + 6 * 3600) * 1000)
    with pytest.raises(ValueError, match="since must be a duration"):
        parse_since("yesterday", 0)


# -- through the gateway: /admin/usage and the CLI ----------------------------------------------------

ADMIN_KEY = "sk-admin-root-0123456789"
CLIENT_KEY = "sk-client-alice-0123456789"
ENGINE_CHAT = "http://engine-a.test/v1/chat/completions"
CONFIG = """
server: {{access_log: false, data_dir: "{data_dir}"}}
usage: {{ledger: true, flush_interval_s: 0.05}}
admin:
  keys:
    - {{name: root, sha256: "{admin}"}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{alice}"}}
backends:
  - {{name: engine-a, engine: vllm, url: "http://engine-a.test"}}
models:
  - name: public-model
    price: {{input_per_million: 1000, output_per_million: 2000}}
    deployments:
      - {{backend: engine-a, model: upstream-model, format: safetensors}}
"""


def config_text(data_dir: Path) -> str:
    return CONFIG.format(data_dir=data_dir, admin=digest_of(ADMIN_KEY), alice=digest_of(CLIENT_KEY))


def engine_answer(*_: Any) -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "upstream-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


@asynccontextmanager
async def running(app: GatewayApp) -> AsyncIterator[None]:
    """The app's lifespan, as uvicorn drives it: startup (the ledger's writer starts), then shutdown."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan"}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        assert (await outbox.get())["type"] == "lifespan.shutdown.complete"
        await task


async def test_admin_usage_answers_json_and_csv_to_the_admin_only(tmp_path: Path):
    cfg = parse_config(config_text(tmp_path / "data"), "test.yaml", {})
    app = create_app(cfg, upstream=FakeUpstream({("POST", ENGINE_CHAT): engine_answer}), probes=False)
    client_auth = {"authorization": f"Bearer {CLIENT_KEY}"}
    admin_auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with (
        running(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway.test") as client,
    ):
        chat = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 10}
        for _ in range(3):
            assert (await client.post("/v1/chat/completions", json=chat, headers=client_auth)).status_code == 200
        assert (
            await client.post("/v1/chat/completions", json=chat, headers={"authorization": "Bearer x"})
        ).status_code == 401
        written = app.gw.metrics.registry
        await eventually(lambda: written.get_sample_value("gateway_usage_rows_written_total") == 3, "3 rows written")
        r = await client.get("/admin/usage", params={"since": "1h", "by": "key,model"}, headers=admin_auth)
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["by"] == ["key", "model"] and body["ledger"] is True
        assert body["data"] == [
            {"key": "alice", "key_id": config_key_id(digest_of(CLIENT_KEY)), "model": "public-model", "requests": 3,
             "errors": 0, "prompt_tokens": 15, "completion_tokens": 6, "total_tokens": 21,
             "cost": pytest.approx(3 * (5 * 0.001 + 2 * 0.002))},
        ]  # fmt: skip
        assert body["total"]["requests"] == 3
        c = await client.get("/admin/usage?since=1h&by=key,day&format=csv", headers=admin_auth)
        assert c.status_code == 200 and c.headers["content-type"].startswith("text/csv")
        lines = list(csv.DictReader(io.StringIO(c.text)))
        assert [(x["key"], x["requests"], x["total_tokens"]) for x in lines] == [("alice", "3", "21")]
        assert lines[0]["day"] == time.strftime("%Y-%m-%d", time.gmtime())
        assert (await client.get("/admin/usage")).status_code == 401
        assert (await client.get("/admin/usage", headers=client_auth)).status_code == 401
        bad = await client.get("/admin/usage?by=colour", headers=admin_auth)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "by"
        bad = await client.get("/admin/usage?since=soon", headers=admin_auth)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
        # one more request right before shutdown: written on the way out
        assert (await client.post("/v1/chat/completions", json=chat, headers=client_auth)).status_code == 200
    assert app.gw.usage.buffered == 0
    db = await Database.open(database_url(cfg))
    try:
        assert await UsageStore(db).count() == 4
    finally:
        await db.aclose()


def test_the_cli_prints_the_usage_table_from_the_database_the_config_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    cfg_path = tmp_path / "gateway.yaml"
    cfg_path.write_text(config_text(tmp_path / "data"))
    cfg = parse_config(cfg_path.read_text(), str(cfg_path), {})

    async def seed() -> None:
        db = await Database.open(database_url(cfg))
        try:
            now = time.time()
            await fill(db, [(now - 60, rec(1, "alice", "public-model")), (now - 30, rec(2, "bob", "public-model"))])
            await fill(db, [(now - 30 * 86400, rec(3, "carol", "public-model"))])  # older than 7 days
        finally:
            await db.aclose()

    asyncio.run(seed())
    assert main(["usage", "--config", str(cfg_path), "--since", "7d", "--by", "key,model"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["key", "key_id", "model", "requests", "errors", "prompt_tokens", "completion_tokens",
                              "total_tokens", "cost"]  # fmt: skip
    assert [line.split()[:4] for line in out[2:4]] == [
        ["alice", "kc_alice", "public-model", "1"], ["bob", "kc_bob", "public-model", "1"]
    ]  # fmt: skip
    assert out[-1].split()[:2] == ["total", "2"]
    assert main(["usage", "--config", str(cfg_path), "--since", "60d", "--by", "key", "--format", "json"]) == 0
    assert {r["key"] for r in json.loads(capsys.readouterr().out)} == {"alice", "bob", "carol"}
    assert main(["usage", "--config", str(cfg_path), "--by", "colour"]) == 2
    assert "cannot group by 'colour'" in capsys.readouterr().err


def test_the_ledgers_rows_are_in_the_order_the_store_inserts_them():
    from llm_gateway.state.usage import ROW_COLUMNS

    assert COLUMNS == ROW_COLUMNS  # the ledger hands its tuples over as they are


async def test_rows_that_end_while_a_flush_writes_wait_for_the_next_flush_not_a_transaction_each():
    """A flush writes the rows buffered when it began. Draining the rows that ended during its INSERTs as well made,
    under steady load, a chain of transactions of a few rows each (each paying a transaction's fixed cost)."""
    led, m = ledger(batch_rows=4)
    sink = Sink()
    arriving = iter(range(100, 110))

    class Busy(Sink):
        async def insert_rows(self, rows: Sequence[Sequence[Any]]) -> None:
            await sink.insert_rows(rows)
            led.record(rec(next(arriving)), 0.1)  # a request ends while the batch is written

    busy = Busy()
    led._opener = opener(busy)  # type: ignore[arg-type]
    for i in range(6):
        led.record(rec(i), 0.1)
    assert await led.flush() is True
    assert [len(b) for b in sink.batches] == [4, 2]  # the six buffered rows, in full batches
    assert [r[1] for r in led._rows] == ["req-100", "req-101"]  # buffered for the next flush
    assert await led.flush() is True
    assert [len(b) for b in sink.batches] == [4, 2, 2]  # one more transaction, of both
    assert [r[1] for r in led._rows] == ["req-102"]
    assert metric(m, "gateway_usage_rows_written_total") == 8.0
    for i in range(4):  # five buffered, the batch four: the one past it (less than half a batch) goes with it
        led.record(rec(i), 0.1)
    assert await led.flush() is True
    assert [len(b) for b in sink.batches] == [4, 2, 2, 5]


async def test_rows_that_end_while_a_full_batch_is_written_do_not_wake_the_writer_again():
    """Those rows took the buffer past a batch while the full one was still in it, so they woke the writer: once
    that batch is written they are fewer than a batch, and wait for the interval instead of a flush of their own."""
    led, _ = ledger(batch_rows=3, flush_interval_s=60)
    sink = Sink()
    arriving = [100, 101]

    class Busy(Sink):
        async def insert_rows(self, rows: Sequence[Sequence[Any]]) -> None:
            await sink.insert_rows(rows)
            while arriving:
                led.record(rec(arriving.pop(0)), 0.1)

    led.start(opener(Busy()))  # type: ignore[arg-type]
    try:
        for i in range(3):
            led.record(rec(i), 0.1)
        await eventually(lambda: len(sink.rows) == 3, "the full batch to be written")
        await asyncio.sleep(0.3)
        assert [len(b) for b in sink.batches] == [3] and led.buffered == 2  # the two wait (60 s, or shutdown)
    finally:
        await led.aclose()
    assert [len(b) for b in sink.batches] == [3, 2]


def test_the_spool_encodes_in_chunks_handing_the_core_over_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of 500 rows is encoded CHUNK_ROWS at a time with a yield after each chunk (a request that
    arrives meanwhile waits for one chunk), and the file still holds every row, in order, once."""
    from llm_gateway.observability import spool as spool_mod

    s = spool_mod.Spool(tmp_path / "spool", ("a", "b"))
    events: list[str] = []
    dumps = spool_mod.orjson.dumps

    def counted(value: Any) -> bytes:
        events.append("row")
        return dumps(value)

    monkeypatch.setattr(spool_mod.orjson, "dumps", counted)
    monkeypatch.setattr(spool_mod, "yield_cpu", lambda: events.append("yield"))
    rows = [(i, f"r{i}") for i in range(500)]
    s.write(rows, None)
    monkeypatch.undo()
    runs = [(k, len(list(g))) for k, g in itertools.groupby(events)]
    size = spool_mod.CHUNK_ROWS
    assert runs == [x for n in (*[size] * (500 // size), 500 % size) for x in (("row", n), ("yield", 1))]
    s.close(keep_rows=True)
    found = spool_mod.recover(tmp_path / "spool")
    assert [(r["a"], r["b"]) for r in found.finished] == rows
    found.remove()
