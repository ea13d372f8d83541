"""The stored responses on a real Postgres shared by replicas (a throwaway server from
tests/support/postgres_server.py): each replica's `Database` sees the others' writes and deletes,
replicas starting together migrate once, documents round trip byte for byte, and a Postgres that is
stopped, frozen, slow or refuses the password surfaces as `DatabaseUnavailable` within a bounded
time, with the URL's password nowhere in what is raised or logged."""

from __future__ import annotations

import asyncio
import logging
import traceback
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from llm_gateway.errors import DatabaseUnavailable
from llm_gateway.state.database import Database, schema_head
from llm_gateway.state.migrations import VERSION_TABLE
from llm_gateway.state.responses import ResponseStore, StoredResponse
from llm_gateway.state.tables import metadata
from tests.support.postgres_server import PostgresServer, running_postgres

#: a hang guard, not a timing assertion: the bounded failures below take about a second
DEADLINE_S = 30.0
T = TypeVar("T")
#: small timeouts, so that the failures they bound come quickly (a connect gets a second: a local one
#: takes milliseconds, but a CI machine running the whole suite has been seen to need more than 0.5 s)
FAST = {"connect_timeout_s": 1.0, "statement_timeout_s": 0.5}


def _response(rid: str = "resp_1", owner: str = "alice", **overrides: object) -> StoredResponse:
    fields: dict[str, object] = {
        "id": rid,
        "owner": owner,
        "model": "tiny",
        "created_at": 1_760_000_000,
        "previous_response_id": None,
        "response": {"id": rid, "object": "response", "status": "completed"},
        "input_items": [{"type": "message", "role": "user", "content": "hi"}],
        "conversation": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    }
    fields.update(overrides)
    return StoredResponse(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of this test's own, to stop or freeze."""
    with running_postgres() as server:
        yield server


def _assert_no_password(err: BaseException, password: str) -> None:
    for text in (str(err), repr(err), "".join(traceback.format_exception(err))):
        assert password not in text


async def test_two_replicas_see_each_others_writes_and_deletes(postgres: PostgresServer):
    url = postgres.new_database()
    one, two = await Database.open(url), await Database.open(url)
    try:
        a, b = ResponseStore(one), ResponseStore(two)
        await a.save(_response("resp_a"))
        await b.save(_response("resp_b", previous_response_id="resp_a"))
        assert await b.load("resp_a", "alice") == _response("resp_a")
        assert await a.load("resp_b", "alice") == _response("resp_b", previous_response_id="resp_a")
        assert await b.load("resp_a", "bob") is None
        assert await b.delete("resp_a", "bob") is False
        assert await b.delete("resp_a", "alice") is True
        assert await a.load("resp_a", "alice") is None
        assert await a.delete("resp_a", "alice") is False
    finally:
        await one.aclose()
        await two.aclose()


async def test_items_saved_on_one_replica_are_referenced_on_the_other(postgres: PostgresServer):
    url = postgres.new_database()
    one, two = await Database.open(url), await Database.open(url)
    try:
        a, b = ResponseStore(one), ResponseStore(two)
        items = [{"id": f"msg_{i}", "type": "message", "role": "user", "content": f"NUL \x00 {i}"} for i in range(600)]
        await a.save(_response("resp_a"), items=items)
        found = await b.load_items([it["id"] for it in items], "alice")  # two batches
        assert found == {it["id"]: it for it in items}
        assert await b.load_items(["msg_1"], "bob") == {}
        assert await b.delete("resp_a", "alice")
        assert await a.load_items(["msg_1"], "alice") == {}
    finally:
        await one.aclose()
        await two.aclose()


async def test_replicas_opening_together_migrate_once_to_exactly_the_tables(postgres: PostgresServer):
    url = postgres.new_database()
    replicas = await asyncio.gather(*(Database.open(url) for _ in range(4)))
    try:

        def differences(connection: sa.Connection) -> list[object]:
            context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
            return list(compare_metadata(context, metadata))

        async with replicas[0].begin() as conn:
            versions = (await conn.execute(sa.text(f"SELECT version_num FROM {VERSION_TABLE}"))).scalars().all()
            assert versions == [schema_head()]
            assert await conn.run_sync(differences) == []
    finally:
        for replica in replicas:
            await replica.aclose()
    again = await Database.open(url)  # and a later start finds nothing to do
    await again.aclose()


async def test_big_unicode_and_nul_documents_round_trip(postgres: PostgresServer):
    db = await Database.open(postgres.new_database())
    try:
        turn = "ünïcödé 中文 🚀 and a NUL \x00 " * 60
        conversation = [{"role": "user", "content": f"{i}: {turn}"} for i in range(1000)]
        saved = _response(response={"z": 1, "a": "\x00", "m": {"y": 2, "b": "☃"}}, conversation=conversation)
        assert sum(len(m["content"].encode()) for m in conversation) > 2_000_000
        store = ResponseStore(db)
        await store.save(saved)
        loaded = await store.load("resp_1", "alice")
        assert loaded == saved
        assert loaded is not None and list(loaded.response) == ["z", "a", "m"]
    finally:
        await db.aclose()


async def test_a_restarted_or_stopped_postgres_costs_no_request_or_is_unavailable(
    own_postgres: PostgresServer, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.DEBUG)
    url = own_postgres.new_database()
    db = await Database.open(url, **FAST)
    try:
        store = ResponseStore(db)
        await store.save(_response())
        own_postgres.stop()  # a restart while the pool is idle costs no request
        own_postgres.start()
        assert await store.load("resp_1", "alice") == _response()
        own_postgres.stop()
        for call in (store.load("resp_1", "alice"), store.save(_response("resp_2")), store.delete("resp_1", "alice")):
            with pytest.raises(DatabaseUnavailable, match="the gateway's database is unavailable") as caught:
                await asyncio.wait_for(call, DEADLINE_S)
            _assert_no_password(caught.value, own_postgres.password)
        with pytest.raises(DatabaseUnavailable) as at_open:
            await asyncio.wait_for(Database.open(url, **FAST), DEADLINE_S)
        _assert_no_password(at_open.value, own_postgres.password)
        own_postgres.start()
        assert await store.load("resp_1", "alice") == _response()  # the pool drops its dead connections
    finally:
        await db.aclose()
    assert own_postgres.password not in caplog.text
    assert "gw:***@" in caplog.text


async def test_a_frozen_postgres_is_unavailable_after_the_timeouts(own_postgres: PostgresServer):
    url = own_postgres.new_database()
    db = await Database.open(url, **FAST)
    try:
        store = ResponseStore(db)
        await store.save(_response())
        own_postgres.pause()  # connections stay open, nothing answers
        try:
            with pytest.raises(DatabaseUnavailable, match="timed out") as caught:
                await asyncio.wait_for(store.load("resp_1", "alice"), DEADLINE_S)
            _assert_no_password(caught.value, own_postgres.password)
            with pytest.raises(DatabaseUnavailable, match="timed out"):
                await asyncio.wait_for(Database.open(url, **FAST), DEADLINE_S)
        finally:
            own_postgres.resume()
        assert await _served_again(lambda: store.load("resp_1", "alice")) == _response()
    finally:
        await db.aclose()


async def _served_again(call: Callable[[], Awaitable[T]]) -> T:
    """The call's answer once the store serves again, tried until DEADLINE_S. A thawed server first
    works through what queued while it was frozen (the open above left a connection waiting), so on a
    loaded machine the first connect after it may still pass its timeout; what this checks is that the
    same pool recovers, not how fast."""
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while True:
        try:
            return await call()
        except DatabaseUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
        await asyncio.sleep(0.1)


async def test_a_statement_past_the_timeout_is_cancelled_by_the_server(postgres: PostgresServer):
    db = await Database.open(postgres.new_database(), **FAST)
    try:
        with pytest.raises(DatabaseUnavailable, match="timed out") as caught:
            async with db.begin() as conn:
                await asyncio.wait_for(conn.execute(sa.text("SELECT pg_sleep(60)")), DEADLINE_S)
        assert type(caught.value.__cause__).__name__ == "QueryCanceledError"  # the server's cancel, not ours
        assert await ResponseStore(db).load("resp_1", "alice") is None  # and the connection is still good
    finally:
        await db.aclose()


async def test_a_wrong_password_is_unavailable_without_showing_either_password(postgres: PostgresServer):
    wrong = "wrong-secret-7f3a9c"
    url = postgres.url(password=wrong)
    with pytest.raises(DatabaseUnavailable, match="InvalidPasswordError") as caught:
        await asyncio.wait_for(Database.open(url, **FAST), DEADLINE_S)
    _assert_no_password(caught.value, wrong)
    _assert_no_password(caught.value, postgres.password)
