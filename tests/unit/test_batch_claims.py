"""The batch lines' claims on the embedded database (state/batches.py), as two replicas would make them: a line is
leased to one replica at a time, a lapsed lease lets another redo it, a result is recorded only by the replica that
holds the line (so a line is done once, with one result), and a batch ends once, with its files in input order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from llm_gateway.settings import GatewayConfig
from llm_gateway.state.batches import BatchStore
from llm_gateway.state.database import Database, database_url

NOW_MS = 1_800_000_000_000
LEASE_MS = 60_000


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[BatchStore]:
    db = await Database.open(database_url(GatewayConfig(server={"data_dir": str(tmp_path)})))  # type: ignore[arg-type]
    yield BatchStore(db)
    await db.aclose()


async def make_batch(store: BatchStore, n: int, batch_id: str = "batch_1") -> None:
    row = {
        "id": batch_id,
        "owner": "kc_alice",
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-1",
        "completion_window": "24h",
        "status": "in_progress",
        "model": "m",
        "created_at": 1,
        "expires_at": 2**40,
        "in_progress_at": 1,
        "total": n,
        "completed": 0,
        "failed": 0,
    }
    await store.create_batch(row, [(f"c{i}", orjson.dumps({"i": i}).decode()) for i in range(n)])


async def test_two_replicas_claiming_at_once_never_share_a_line(store: BatchStore) -> None:
    await make_batch(store, 50)
    claims = await asyncio.gather(
        *(store.claim("batch_1", f"rep_{r}", 7, NOW_MS, LEASE_MS) for r in range(2) for _ in range(5))
    )
    lines = [c.line for batch in claims for c in batch]
    assert len(lines) == len(set(lines)) == 50  # every line once, to exactly one claimant
    assert await store.claim("batch_1", "rep_0", 10, NOW_MS, LEASE_MS) == []  # all leased now
    assert await store.held("batch_1", NOW_MS) == 50


async def test_a_lapsed_lease_is_redone_and_only_its_holder_records(store: BatchStore) -> None:
    await make_batch(store, 2)
    [first] = await store.claim("batch_1", "rep_dead", 1, NOW_MS, LEASE_MS)
    assert (first.line, first.custom_id, first.attempts) == (1, "c0", 1)
    assert orjson.loads(first.body) == {"i": 0}
    later = NOW_MS + LEASE_MS + 1  # the replica died: its lease lapsed
    again = await store.claim("batch_1", "rep_live", 5, later, LEASE_MS)
    assert [(c.line, c.attempts) for c in again] == [(1, 2), (2, 1)]
    # the dead replica's late result is refused; the holder's is recorded, once
    assert not await store.record("batch_1", 1, "rep_dead", 200, "r0", '{"late":true}')
    assert await store.record("batch_1", 1, "rep_live", 200, "r1", '{"ok":1}')
    assert not await store.record("batch_1", 1, "rep_live", 200, "r2", '{"ok":2}')
    # a renewed lease keeps the line from others
    await store.renew("rep_live", "batch_1", [2], later + 10 * LEASE_MS)
    assert await store.claim("batch_1", "rep_other", 5, later + 2 * LEASE_MS, LEASE_MS) == []


async def test_a_batch_completes_once_with_its_files_in_input_order(store: BatchStore) -> None:
    await make_batch(store, 3)
    claimed = await store.claim("batch_1", "rep", 3, NOW_MS, LEASE_MS)
    assert not await store.finish("batch_1", "completed", 5)  # lines still pending
    for c in reversed(claimed):
        status = 400 if c.line == 2 else 200
        assert await store.record("batch_1", c.line, "rep", status, f"r{c.line}", orjson.dumps({"n": c.line}).decode())
    done = await asyncio.gather(*(store.finish("batch_1", "completed", 5) for _ in range(3)))
    assert sorted(done) == [False, False, True]
    row = await store.batch("batch_1", "kc_alice")
    assert row is not None and (row["status"], row["completed"], row["failed"]) == ("completed", 2, 1)
    out = await store.content(row["output_file_id"], "kc_alice")
    err = await store.content(row["error_file_id"], "kc_alice")
    assert out is not None and err is not None
    assert [orjson.loads(x)["custom_id"] for x in out.splitlines()] == ["c0", "c2"]
    assert orjson.loads(err)["response"] == {"status_code": 400, "request_id": "r2", "body": {"n": 2}}
    assert await store.batch("batch_1", "kc_bob") is None


async def test_an_expired_batch_ends_its_pending_lines_and_refuses_late_results(store: BatchStore) -> None:
    await make_batch(store, 3)
    [c] = await store.claim("batch_1", "rep", 1, NOW_MS, LEASE_MS)
    assert await store.finish("batch_1", "expired", 9)
    assert not await store.record("batch_1", c.line, "rep", 200, "r", "{}")  # too late: not recorded
    row = await store.batch("batch_1", "kc_alice")
    assert row is not None and row["status"] == "expired" and row["expired_at"] == 9 and row["output_file_id"] is None
    err = await store.content(row["error_file_id"], "kc_alice")
    assert err is not None
    assert [orjson.loads(x)["error"]["code"] for x in err.splitlines()] == ["batch_expired"] * 3


async def test_deleting_a_key_deletes_its_batches_and_files_only(store: BatchStore) -> None:
    from llm_gateway.state.batches import FileRow, delete_owned

    await make_batch(store, 3)
    await store.save_file(FileRow("file-a", "kc_alice", "batch", "a.jsonl", 2, 1), b"{}")
    await store.save_file(FileRow("file-b", "kc_bob", "batch", "b.jsonl", 2, 1), b"{}")
    async with store.db.begin() as conn:
        assert await delete_owned(conn, "kc_alice") == 1
    assert await store.batch("batch_1", "kc_alice") is None
    assert await store.claim("batch_1", "rep", 10, NOW_MS, LEASE_MS) == []  # its lines are gone too
    assert await store.file("file-a", "kc_alice") is None
    assert await store.file("file-b", "kc_bob") is not None
