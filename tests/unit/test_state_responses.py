"""The stored responses on the embedded database (a real SQLite file in tmp_path): round trips, owner
isolation, restarts, idempotent migrations that build exactly the schema of `tables`, big and odd
documents, the config that names the database, and a database that cannot serve surfacing as
`DatabaseUnavailable`."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from llm_gateway.errors import DatabaseUnavailable
from llm_gateway.settings import GatewayConfig
from llm_gateway.settings.loader import ConfigError, parse_config
from llm_gateway.state.database import DB_FILE, Database, database_url, schema_head
from llm_gateway.state.migrations import VERSION_TABLE
from llm_gateway.state.responses import ResponseStore, StoredResponse
from llm_gateway.state.tables import metadata


def _response(rid: str = "resp_1", owner: str = "alice", **overrides: object) -> StoredResponse:
    fields: dict[str, object] = {
        "id": rid,
        "owner": owner,
        "model": "tiny",
        "created_at": 1_760_000_000,
        "previous_response_id": None,
        "response": {"id": rid, "object": "response", "output": [{"type": "message", "content": "hello"}]},
        "input_items": [{"type": "message", "role": "user", "content": "hi"}],
        "conversation": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    fields.update(overrides)
    return StoredResponse(**fields)  # type: ignore[arg-type]


def _config(data_dir: Path | str) -> GatewayConfig:
    return GatewayConfig(server={"data_dir": str(data_dir)})  # type: ignore[arg-type]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return database_url(_config(tmp_path / "data"))


@pytest.fixture
async def db(url: str) -> AsyncIterator[Database]:
    opened = await Database.open(url)
    yield opened
    await opened.aclose()


async def test_a_saved_response_loads_back_equal_and_deletes_once(db: Database):
    store = ResponseStore(db)
    saved = _response(previous_response_id="resp_0")
    await store.save(saved)
    assert await store.load("resp_1", "alice") == saved
    assert await store.delete("resp_1", "alice") is True
    assert await store.load("resp_1", "alice") is None
    assert await store.delete("resp_1", "alice") is False


async def test_another_owner_sees_nothing_and_cannot_delete(db: Database):
    store = ResponseStore(db)
    await store.save(_response(owner="alice"))
    assert await store.load("resp_1", "bob") is None
    assert await store.delete("resp_1", "bob") is False
    assert await store.load("resp_1", "alice") == _response(owner="alice")


async def test_an_unknown_id_loads_as_none_and_deletes_as_false(db: Database):
    store = ResponseStore(db)
    await store.save(_response("resp_known"))
    assert await store.load("resp_unknown", "alice") is None
    assert await store.delete("resp_unknown", "alice") is False


async def test_a_duplicate_id_is_a_bug_not_an_unavailable_database(db: Database):
    store = ResponseStore(db)
    await store.save(_response())
    with pytest.raises(IntegrityError):
        await store.save(_response(model="another"))


async def test_responses_survive_closing_and_reopening_the_database(url: str):
    first = await Database.open(url)
    await ResponseStore(first).save(_response())
    await first.aclose()
    second = await Database.open(url)
    try:
        assert await ResponseStore(second).load("resp_1", "alice") == _response()
    finally:
        await second.aclose()


async def test_opening_again_and_together_migrates_once(url: str):
    await (await Database.open(url)).aclose()
    replicas = await asyncio.gather(*(Database.open(url) for _ in range(3)))
    try:
        async with replicas[0].begin() as conn:
            versions = (await conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}"))).scalars().all()
        assert versions == [schema_head()]
        await ResponseStore(replicas[1]).save(_response())
        assert await ResponseStore(replicas[2]).load("resp_1", "alice") == _response()
    finally:
        for replica in replicas:
            await replica.aclose()


async def test_the_migrated_schema_is_exactly_the_tables(db: Database):
    def differences(connection: sa.Connection) -> list[object]:
        context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
        return list(compare_metadata(context, metadata))

    async with db.begin() as conn:
        assert await conn.run_sync(differences) == []


async def test_a_big_conversation_round_trips(db: Database):
    turn = "long text with ünïcödé, 中文 and emoji 🚀 " * 50
    conversation = [{"role": "user" if i % 2 else "assistant", "content": f"{i}: {turn}"} for i in range(1000)]
    saved = _response(conversation=conversation)
    assert sum(len(m["content"].encode()) for m in conversation) > 2_000_000
    store = ResponseStore(db)
    await store.save(saved)
    assert await store.load("resp_1", "alice") == saved


async def test_unicode_nul_and_key_order_round_trip(db: Database):
    response = {"zeta": 1, "alpha": "NUL \x00 inside", "mid": {"b": "\u2028 ☃ 𝄞", "a": [None, True, 1.5]}}
    saved = _response(owner="ünïcödé-key", response=response)
    store = ResponseStore(db)
    await store.save(saved)
    loaded = await store.load("resp_1", "ünïcödé-key")
    assert loaded == saved
    assert loaded is not None and list(loaded.response) == ["zeta", "alpha", "mid"]
    assert list(loaded.response["mid"]) == ["b", "a"]


async def test_the_embedded_database_is_a_wal_file_in_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    config = _config("relative/data")
    assert database_url(config) == f"sqlite+aiosqlite:///{tmp_path / 'relative' / 'data' / DB_FILE}"
    db = await Database.from_config(config)
    try:
        assert (tmp_path / "relative" / "data" / DB_FILE).is_file()
        async with db.begin() as conn:
            assert (await conn.execute(sa.text("PRAGMA journal_mode"))).scalar() == "wal"
    finally:
        await db.aclose()


def test_database_url_is_the_configured_secret_when_set():
    secret = "postgresql+asyncpg://gw:s3cret-pw@db.internal:5432/gateway"
    config = GatewayConfig(database={"url": secret})  # type: ignore[arg-type]
    assert database_url(config) == secret
    assert "s3cret-pw" not in repr(config)


def test_an_empty_database_url_means_the_embedded_database(tmp_path: Path):
    config = GatewayConfig(server={"data_dir": str(tmp_path)}, database={"url": ""})  # type: ignore[arg-type]
    assert config.database.url is None
    assert database_url(config) == f"sqlite+aiosqlite:///{tmp_path / DB_FILE}"


@pytest.mark.parametrize(
    "url", ["postgresql://gw:s3cret-pw@db:5432/gw", "mysql+aiomysql://gw:s3cret-pw@db/gw", "s3cret-pw"]
)
def test_a_database_url_of_another_driver_is_refused_without_echoing_it(url: str):
    with pytest.raises(ConfigError) as caught:
        parse_config(f"database: {{url: '{url}'}}\n", "gateway.yaml", {})
    message = str(caught.value)
    assert "database.url: must start with postgresql+asyncpg://" in message
    assert "s3cret-pw" not in message
    with pytest.raises(ValidationError, match="postgresql\\+asyncpg"):
        GatewayConfig(database={"url": url})  # type: ignore[arg-type]


async def test_open_refuses_a_url_it_cannot_use_without_echoing_it():
    for url in ("mysql://gw:s3cret-pw@db/gw", "postgresql+asyncpg://gw:s3cret-pw@db:notaport/gw"):
        with pytest.raises(ValueError, match="database URL") as caught:
            await Database.open(url)
        assert "s3cret-pw" not in str(caught.value)


async def test_a_locked_database_is_unavailable_after_the_busy_timeout(url: str, tmp_path: Path):
    db = await Database.open(url, statement_timeout_s=0.2)
    holder = sqlite3.connect(tmp_path / "data" / DB_FILE, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # another process holding the write lock
        with pytest.raises(DatabaseUnavailable, match="database is locked") as caught:
            await asyncio.wait_for(ResponseStore(db).save(_response()), timeout=30)
        assert caught.value.status == 503
        assert caught.value.envelope()["error"]["code"] == "database_unavailable"
        assert caught.value.envelope()["error"]["type"] == "service_unavailable"
        holder.execute("ROLLBACK")
        await ResponseStore(db).save(_response())  # and it serves again once the lock is gone
    finally:
        holder.close()
        await db.aclose()


async def test_a_data_dir_that_cannot_be_made_is_unavailable(tmp_path: Path):
    (tmp_path / "not-a-dir").write_text("a file where the data dir should be")
    with pytest.raises(DatabaseUnavailable, match="unavailable"):
        await Database.open(database_url(_config(tmp_path / "not-a-dir" / "data")))


# -- items by id, for `item_reference` ------------------------------------------------------------------------


def _statements(db: Database) -> list[str]:
    """The SQL statements `db` runs from now on (appended as they go)."""
    seen: list[str] = []
    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", lambda *a: seen.append(a[2]))
    return seen


async def test_items_are_found_by_id_for_their_owner_in_one_query(db: Database):
    store = ResponseStore(db)
    user = {"id": "msg_in", "type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
    said = {"id": "msg_out", "type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "yo"}]}
    thought = {"id": "rs_1", "type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]}
    call = {"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    await store.save(_response(), items=[user, thought, said, call])
    seen = _statements(db)
    found = await store.load_items(["msg_in", "rs_1", "msg_out", "fc_1", "msg_unknown"], "alice")
    assert found == {"msg_in": user, "rs_1": thought, "msg_out": said, "fc_1": call}
    assert len([s for s in seen if s.lstrip().upper().startswith("SELECT")]) == 1  # one query for all of them
    assert await store.load_items(["msg_in", "fc_1"], "bob") == {}  # another key's items do not exist for it
    assert await store.load_items([], "alice") == {}


async def test_an_item_saved_twice_is_found_once_and_goes_with_its_last_response(db: Database):
    store = ResponseStore(db)
    item = {"id": "msg_x", "type": "message", "role": "user", "content": "again"}
    await store.save(_response("resp_1"), items=[item])
    await store.save(_response("resp_2"), items=[item, item])  # a client resending an item with its id
    assert await store.load_items(["msg_x"], "alice") == {"msg_x": item}
    assert await store.delete("resp_1", "alice") and await store.delete("resp_2", "alice")
    assert await store.load_items(["msg_x"], "alice") == {}  # a deleted response's items are gone with it


async def test_many_references_are_found_in_few_queries(db: Database):
    store = ResponseStore(db)
    items = [{"id": f"msg_{i}", "type": "message", "role": "user", "content": str(i)} for i in range(2500)]
    await store.save(_response(), items=items)
    seen = _statements(db)
    found = await store.load_items([it["id"] for it in items], "alice")
    assert len(found) == 2500 and found["msg_2499"]["content"] == "2499"
    selects = [s for s in seen if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 5  # batched (SQLite bounds the parameters of one statement), never one per item
