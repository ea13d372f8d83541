"""What a `kill -9` costs the usage ledger (red-team M5): before, the rows of the requests that had ended
in the last flush interval, every row the database had not taken yet, and every request in flight were
lost without a trace. Now each flush checkpoints them to a spool on local disk (off the loop) and the next
start writes them: a crash loses at most what ended or began since the last checkpoint, and
`gateway_usage_rows_at_risk` says how much that is. Killed for real: a gateway process, SIGKILL."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.errors import DatabaseUnavailable
from llm_gateway.observability.ledger import COLUMNS, UsageLedger
from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.record import RequestRecord
from llm_gateway.settings import UsageConfig
from llm_gateway.state.database import DB_FILE, Database
from llm_gateway.state.usage import UsageStore
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.waiting import metric, wait_until

KEY = "sk-gw-teamB-" + "5" * 32
INTERVAL_S = 0.5

CONFIG = """
server: {{access_log: false, data_dir: "{data}"}}
auth: {{mode: keys, keys: [{{name: team-b, sha256: "{sha}", models: ["*"]}}]}}
usage: {{ledger: true, flush_interval_s: {interval}}}
database: {{statement_timeout_s: 0.3}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", capacity: 8, probe: {{interval_s: 0.5}}}}
models:
  - name: beta-70b
    deployments: [{{backend: emu, model: tiny, format: safetensors}}]
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8, tpot_ms=20)) as emu:
        yield emu


def config(data: Path, engine: EmulatorThread) -> str:
    return CONFIG.format(data=data, sha=digest_of(KEY), interval=INTERVAL_S, url=engine.url)


def chat(gw: GatewayProcess, rid: str) -> int:
    r = httpx.post(
        gw.url + "/v1/chat/completions",
        headers={"authorization": f"Bearer {KEY}", "x-request-id": rid},
        json={"model": "beta-70b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        timeout=30,
    )
    return r.status_code


class Stream(threading.Thread):
    """A long stream (3,000 tokens at 20 ms each) that the kill cuts; counts the content events it got."""

    def __init__(self, gw: GatewayProcess, rid: str) -> None:
        super().__init__(daemon=True)
        self.gw, self.rid, self.events = gw, rid, 0

    def run(self) -> None:
        body = {"model": "beta-70b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3000, "stream": True}
        headers = {"authorization": f"Bearer {KEY}", "x-request-id": self.rid}
        try:
            with httpx.stream(
                "POST", self.gw.url + "/v1/chat/completions", json=body, headers=headers, timeout=60
            ) as r:
                for line in r.iter_lines():
                    if '"content":"' in line:
                        self.events += 1
        except httpx.HTTPError:
            pass  # the gateway died: expected


def rows(db: Path, like: str = "kill9-%") -> list[dict[str, Any]]:
    """The ledger's rows (none while the gateway has not created the database: this never creates it)."""
    try:
        conn = sqlite3.connect(f"file:{db}?mode=rw", uri=True)
    except sqlite3.OperationalError:
        return []
    try:
        conn.row_factory = sqlite3.Row
        found = conn.execute("select * from usage_ledger where request_id like ? order by request_id", (like,))
        return [dict(r) for r in found]
    except sqlite3.OperationalError:  # not migrated yet
        return []
    finally:
        conn.close()


def at_risk_none(gw: GatewayProcess) -> bool:
    return metric(gw.url, "gateway_usage_rows_at_risk") == 0.0


def settle(gw: GatewayProcess) -> None:
    """Until the last checkpoint covers everything (the figure the README gives: one flush interval)."""
    if metric(gw.url, "gateway_usage_rows_at_risk") is None:  # a gateway without the gauge: one interval's worth
        time.sleep(4 * INTERVAL_S)
        return
    wait_until(lambda: at_risk_none(gw), what="a checkpoint covering every row and request in flight")


def kill9(gw: GatewayProcess) -> None:
    gw.signal(signal.SIGKILL)
    assert gw.proc is not None
    assert gw.proc.wait(10) == -signal.SIGKILL


def test_kill9_with_the_database_busy_loses_no_finished_row_and_leaves_a_row_for_the_stream(
    engine: EmulatorThread, tmp_path: Path
):
    data = tmp_path / "rt-data"
    db = data / DB_FILE
    gw = GatewayProcess(config(data, engine), tmp_path).start()
    lock: sqlite3.Connection | None = None
    try:
        assert chat(gw, "warm-1") == 200
        wait_until(lambda: rows(db, "warm-%"), what="the ledger writing its first row")
        # someone holds the database's write lock: the ledger's INSERTs time out, its rows stay buffered
        lock = sqlite3.connect(db, timeout=0, isolation_level=None)
        lock.execute("BEGIN IMMEDIATE")
        for i in range(1, 6):  # the red team's five quick requests
            assert chat(gw, f"kill9-quick-{i}") == 200
        stream = Stream(gw, "kill9-stream")
        stream.start()
        wait_until(lambda: stream.events >= 20, what="the stream relaying")
        settle(gw)
        assert (metric(gw.url, "gateway_usage_rows_buffered") or 0) >= 5  # not in the database: only buffered
        kill9(gw)
        stream.join(10)
        seen = stream.events
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        gw.stop()
    assert rows(db) == []  # nothing reached the database before the kill

    again = GatewayProcess(config(data, engine), tmp_path, name="restarted").start()
    try:
        got = wait_until(lambda: len(rows(db)) >= 6 and rows(db), timeout=20, what="the crashed process's rows")
        recovered = {
            kind: metric(again.url, "gateway_usage_rows_recovered_total", kind=kind)
            for kind in ("finished", "interrupted")
        }
        assert recovered == {"finished": 5.0, "interrupted": 1.0}
        assert "did not shut down cleanly" in again.log_text()
    finally:
        again.stop()
    quick = [r for r in got if r["request_id"].startswith("kill9-quick-")]
    assert [(r["status"], r["outcome"], r["key"]) for r in quick] == [(200, "success", "team-b")] * 5
    (cut,) = [r for r in got if r["request_id"] == "kill9-stream"]
    assert (cut["status"], cut["outcome"], cut["usage_estimated"]) == (500, "interrupted", 1)
    assert 0 < cut["completion_tokens"] <= seen + 1  # what it had relayed at its last checkpoint
    assert len(rows(db, "warm-%")) == 1  # nothing written twice
    assert not list((data / "ledger-spool").iterdir())  # replayed, then removed; a clean stop leaves nothing


def test_kill9_mid_stream_with_the_database_up_writes_every_row_once(engine: EmulatorThread, tmp_path: Path):
    data = tmp_path / "data"
    db = data / DB_FILE
    gw = GatewayProcess(config(data, engine), tmp_path).start()
    try:
        for i in range(1, 4):
            assert chat(gw, f"kill9-done-{i}") == 200
        stream = Stream(gw, "kill9-stream")
        stream.start()
        wait_until(lambda: stream.events >= 20, what="the stream relaying")
        wait_until(lambda: len(rows(db)) == 3, what="the finished rows written")
        settle(gw)
        kill9(gw)
        stream.join(10)
    finally:
        gw.stop()
    assert [r["request_id"] for r in rows(db)] == ["kill9-done-1", "kill9-done-2", "kill9-done-3"]

    again = GatewayProcess(config(data, engine), tmp_path, name="restarted").start()
    try:
        got = wait_until(lambda: len(rows(db)) >= 4 and rows(db), timeout=20, what="the stream's interrupted row")
        assert chat(again, "kill9-zafter") == 200
        wait_until(lambda: len(rows(db)) == 5, what="the new process's own row")
    finally:
        again.stop()
    assert sorted((r["request_id"], r["outcome"]) for r in rows(db)) == [
        ("kill9-done-1", "success"),
        ("kill9-done-2", "success"),
        ("kill9-done-3", "success"),
        ("kill9-stream", "interrupted"),
        ("kill9-zafter", "success"),
    ]
    assert got[-1]["completion_tokens"] > 0


# -- the ledger itself: what is at risk, the spool, a shutdown with the database down ------------------


class Sink:
    """The database as the ledger sees it; refuses while `down` (as an unavailable database does)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.down = False

    async def insert_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        if self.down:
            raise DatabaseUnavailable("the gateway's database is unavailable (timed out); try again later")
        self.rows += [dict(zip(COLUMNS, r, strict=True)) for r in rows]

    async def insert_missing(self, rows: Sequence[Mapping[str, Any]]) -> int:
        if self.down:
            raise DatabaseUnavailable("the gateway's database is unavailable (timed out); try again later")
        self.rows += [dict(r) for r in rows]
        return len(rows)


def record(i: int, key: str = "alice") -> RequestRecord:
    r = RequestRecord(f"req-{i}", time.perf_counter(), "POST", "/v1/chat/completions", endpoint="chat", key=key)
    r.model, r.backend, r.status, r.prompt_tokens, r.completion_tokens = "m", "b", 200, 3, 4
    return r


def led(metrics: Metrics | None = None) -> tuple[UsageLedger, Metrics]:
    m = metrics or Metrics()
    return UsageLedger(m, UsageConfig(ledger=True, flush_interval_s=60)), m


def sample(m: Metrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


async def started(ledger: UsageLedger, sink: Sink, spool: Path) -> None:
    async def opener() -> Sink:
        return sink

    ledger.start(opener, spool)
    await asyncio.wait_for(_until(lambda: ledger._spool is not None), 10)


async def _until(cond: Any) -> None:
    while not cond():
        await asyncio.sleep(0.01)


async def test_rows_at_risk_are_those_a_checkpoint_has_not_covered(tmp_path: Path):
    ledger, m = led()
    sink = Sink()
    sink.down = True
    await started(ledger, sink, tmp_path / "spool")
    for i in range(3):
        ledger.record(record(i), 0.01)
    running = record(9)
    ledger.begin(running)  # a stream in flight
    running.live = lambda: (3, 42)
    assert sample(m, "gateway_usage_rows_at_risk") == 4
    assert sample(m, "gateway_usage_requests_open") == 1
    assert await ledger.flush() is False  # the database is down ...
    assert sample(m, "gateway_usage_rows_at_risk") == 0  # ... but everything is on disk
    assert sample(m, "gateway_usage_rows_buffered") == 3
    ledger.record(record(3), 0.01)
    assert sample(m, "gateway_usage_rows_at_risk") == 1
    ledger.record(running, 1.0)  # the stream ended: no longer in flight
    assert sample(m, "gateway_usage_requests_open") == 0
    sink.down = False
    await ledger.aclose()
    assert [r["request_id"] for r in sink.rows] == ["req-0", "req-1", "req-2", "req-3", "req-9"]
    assert not list((tmp_path / "spool").iterdir())


async def test_a_shutdown_with_the_database_down_keeps_the_rows_for_the_next_start(tmp_path: Path):
    first, m1 = led()
    sink = Sink()
    sink.down = True
    await started(first, sink, tmp_path / "spool")
    for i in range(3):
        first.record(record(i), 0.01)
    await first.aclose(timeout_s=2)
    assert sample(m1, "gateway_usage_rows_dropped_total", reason="shutdown") == 0  # not lost: on disk
    assert len(list((tmp_path / "spool").iterdir())) == 1

    second, m2 = led()
    sink.down = False
    await started(second, sink, tmp_path / "spool")
    await second.flush()
    assert [r["request_id"] for r in sink.rows] == ["req-0", "req-1", "req-2"]
    assert sample(m2, "gateway_usage_rows_recovered_total", kind="finished") == 3
    await second.aclose()
    assert not list((tmp_path / "spool").iterdir())


async def test_a_live_processs_spool_is_not_taken(tmp_path: Path):
    one, _ = led()
    sink = Sink()
    sink.down = True
    await started(one, sink, tmp_path / "spool")
    one.record(record(1), 0.01)
    await one.flush()
    other, m = led()
    await started(other, Sink(), tmp_path / "spool")  # a replica sharing the data_dir, still running
    await other.flush()
    assert sample(m, "gateway_usage_rows_recovered_total", kind="finished") == 0
    await other.aclose()
    sink.down = False
    await one.aclose()
    assert [r["request_id"] for r in sink.rows] == ["req-1"]


async def test_replayed_rows_the_database_already_holds_are_not_written_twice(tmp_path: Path):
    db = await Database.open(f"sqlite+aiosqlite:///{tmp_path / 'ledger.db'}")
    store = UsageStore(db)
    base = {
        "day": "2026-12-04",
        "key": "alice",
        "model": "m",
        "backend": "b",
        "endpoint": "chat",
        "status": 200,
        "outcome": "success",
        "prompt_tokens": 1,
        "completion_tokens": 2,
        "usage_estimated": False,
        "ttft_ms": None,
        "duration_ms": 5.0,
    }
    try:
        await store.insert([{**base, "at_ms": 1_000_000, "request_id": "a"}])
        replay = [
            {**base, "at_ms": 1_000_000, "request_id": "a"},  # committed just before the crash
            {**base, "at_ms": 1_000_400, "request_id": "a", "outcome": "interrupted"},  # its in-flight snapshot
            {**base, "at_ms": 1_000_000, "request_id": "a", "key": "bob"},  # another key's id: another request
            {**base, "at_ms": 1_000_000, "request_id": "b"},
            {**base, "at_ms": 9_000_000, "request_id": "a"},  # the same id much later: another request
        ]
        assert await store.insert_missing(replay) == 3
        assert await store.insert_missing(replay) == 0
        assert await store.count() == 4
    finally:
        await db.aclose()
