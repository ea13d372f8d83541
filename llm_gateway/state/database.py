"""The gateway's one SQL database: an async SQLAlchemy engine, migrated to head when it opens, whose
failures reach callers as one exception, `DatabaseUnavailable` (503).

Two kinds, chosen by URL. Without `database.url` it is the embedded SQLite file
`<server.data_dir>/llm-gateway.db` (aiosqlite; WAL, a busy timeout, and real transactions: SQLAlchemy
emits BEGIN itself, since the sqlite3 driver's legacy mode would run DDL outside them). With
`database.url` it is a Postgres that the replicas share (asyncpg), with bounded waits everywhere: the
connect timeout, a server-side statement timeout (lock waits included), a client-side command timeout a
little past it (for a server that stops answering), a pool checkout timeout, and a liveness check of
each pooled connection before use (so a restarted Postgres costs no request).

Migrations (Alembic, `llm_gateway.state.migrations`) run in `Database.open`, in one transaction under a
lock, so replicas starting together migrate once: a Postgres advisory lock, a `BEGIN IMMEDIATE` on
SQLite. The second one waits, then finds the schema at head.

The URL is a secret: only `safe_url` (`redacted_url`: the userinfo password and every query parameter
that names a password, a secret or a token hidden) is ever logged or shown, and the errors raised
here name the kind of failure, never the URL. `DatabaseUnavailable` chains to the driver's own
exception, not to SQLAlchemy's wrapper, whose text carries the statement's parameters (user content).

Append-only batches (the usage ledger's rows) have a path of their own, `Database.insert_rows`, that costs the
event loop one hand-off per batch whatever its size: on SQLite a dedicated writer thread with its own stdlib
`sqlite3` connection runs a few multi-row INSERTs of fixed sizes, each prepared once (the driver releases
the GIL while SQLite works); on Postgres asyncpg's `executemany` (rows encoded in C, pipelined). Neither
compiles SQL per batch:
SQLAlchemy's multi-row `insert().values([...])` built and compiled one bind parameter per value on the loop
thread, ~170 µs a row, a 50-250 ms stall for a batch of 500 (bench/ledger_ab.py, issue 36).

The SQLite file holds every stored prompt and answer: it is created 0600 (SQLite gives its -wal and
-shm files the database file's mode), in a directory created 0700 when the gateway creates it (an
existing directory keeps the mode its operator gave it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import event, exc
from sqlalchemy.engine import URL, Connection, make_url
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import ConnectionPoolEntry, NullPool

from llm_gateway.access.keys import config_key_id
from llm_gateway.errors import DatabaseUnavailable
from llm_gateway.settings import DATABASE_SCHEMES, GatewayConfig
from llm_gateway.settings.server import DB_FILE
from llm_gateway.state.driver_errors import translated
from llm_gateway.state.migrations import MIGRATIONS_DIR
from llm_gateway.state.sqlite_writer import Prepare, Rows, SqliteWriter, sqlite_pragmas

log = logging.getLogger("gateway.state")

#: the Postgres advisory lock the replicas take to migrate one at a time (a fixed 64-bit number)
MIGRATION_LOCK = int.from_bytes(hashlib.sha256(b"llm-gateway/migrations").digest()[:8], "big", signed=True)
#: the client gives up on a statement this long after the server should have cancelled it
CLIENT_MARGIN_S = 1.0
#: an execution option: this SQLite transaction takes the write lock at BEGIN (the migration's)
_IMMEDIATE = "llm_gateway_begin_immediate"
#: Postgres error classes that mean the database cannot serve now, not that the statement is wrong:
#: 08 connection, 28 authorization, 3D no such database, 53 resources, 57 operator (shutdown, cancel)
_SECRET_PARAM = re.compile(r"pass|secret|token", re.IGNORECASE)


def database_url(config: GatewayConfig) -> str:
    """`database.url` when set, else the embedded SQLite file (an absolute path: the working directory
    is read once, here)."""
    if config.database.url is not None:
        return config.database.url.get_secret_value()
    return f"sqlite+aiosqlite:///{Path(config.server.data_dir).resolve() / DB_FILE}"


#: a batch's rows as the database takes them: the values of the columns named, in order


class Database:
    """One SQLAlchemy AsyncEngine, migrated to head."""

    def __init__(self, engine: AsyncEngine, safe_url: str, busy_timeout_s: float = 10.0) -> None:
        self.engine = engine
        #: the URL with its password hidden: the only form that may be logged
        self.safe_url = safe_url
        self._busy_timeout_s = busy_timeout_s
        self._writer: SqliteWriter | None = None  # made at the first insert_rows on a SQLite file
        self._inserts: dict[tuple[str, tuple[str, ...]], str] = {}  # (table, columns) -> the INSERT's SQL

    def __repr__(self) -> str:
        return f"Database({self.safe_url})"

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        pool_size: int = 5,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = 10.0,
        migrate_timeout_s: float = 60.0,
        config_key_ids: Mapping[str, str] | None = None,
    ) -> Self:
        """Connect, migrate to head (idempotent; one replica at a time) and return the database.
        `config_key_ids` (the config file's keys, name -> id) lets a migration give rows that named a key
        by its name to that key's id (see migrations/versions/0005_key_ids.py).
        Raises `DatabaseUnavailable` when it cannot be reached in time, `ValueError` for a bad URL."""
        parsed = _parse(url)
        safe_url = _redacted(parsed)
        postgres = parsed.get_backend_name() == "postgresql"
        with translated():
            if postgres:
                engine = _postgres_engine(parsed, pool_size, connect_timeout_s, statement_timeout_s)
                # a connection of its own, with the longer timeout that a migration (or the wait for
                # another replica's) may need
                migrator = _postgres_engine(parsed, 0, connect_timeout_s, migrate_timeout_s)
            else:
                engine = migrator = _sqlite_engine(parsed, pool_size, statement_timeout_s)
            try:
                await _migrate(migrator, postgres=postgres, config_key_ids=config_key_ids)
            except BaseException:
                await engine.dispose()
                raise
            finally:
                if migrator is not engine:
                    await migrator.dispose()
        log.info("database ready at schema head: %s", safe_url)
        return cls(engine, safe_url, statement_timeout_s)

    @classmethod
    async def from_config(cls, config: GatewayConfig) -> Self:
        """`open` with the URL, pool and timeouts of the config's `database` section."""
        db = config.database
        return await cls.open(
            database_url(config),
            pool_size=db.pool_size,
            connect_timeout_s=db.connect_timeout_s,
            statement_timeout_s=db.statement_timeout_s,
            config_key_ids={k.name: config_key_id(k.sha256) for k in config.auth.keys},
        )

    @asynccontextmanager
    async def begin(self) -> AsyncIterator[AsyncConnection]:
        """A connection in a transaction, committed when the block ends normally; a database that is
        down or too slow raises `DatabaseUnavailable`, from the block or from the commit."""
        with translated():
            async with self.engine.begin() as conn:
                yield conn

    async def insert_rows(
        self,
        table: sa.Table,
        columns: Sequence[str],
        rows: Rows,
        prepare: Prepare | None = None,
    ) -> None:
        """Append `rows` (each the values of `columns`, in order) to `table` in one transaction, all or none,
        for the cost of a hand-off on the event loop: no SQL is compiled and no row is touched there on SQLite
        (the dedicated writer thread runs `prepare`, if given, on the batch, then the INSERT; its `Batch` may
        hold the values of `columns`' first ones once for every row); on Postgres asyncpg encodes the rows in
        C. `DatabaseUnavailable` when the database is down, locked or too slow."""
        if not rows:
            return
        key = (table.name, tuple(columns))
        sql = self._inserts.get(key)
        if sql is None:
            sql = self._inserts[key] = self._insert_sql(table, columns)
        url = self.engine.url
        with translated():
            if url.get_backend_name() == "postgresql":
                await self._insert_asyncpg(sql, rows if prepare is None else prepare(rows).whole())
                return
            path = url.database or ""
            if path in ("", ":memory:") or path.startswith("file:"):  # the engine's own connection only
                data = rows if prepare is None else prepare(rows).whole()
                async with self.engine.begin() as conn:
                    await conn.execute(table.insert(), [dict(zip(columns, r, strict=True)) for r in data])
                return
            if self._writer is None:
                self._writer = SqliteWriter(path, self._busy_timeout_s)
            await self._writer.insert(sql, rows, prepare)

    def _insert_sql(self, table: sa.Table, columns: Sequence[str]) -> str:
        for c in columns:
            table.c[c]  # a KeyError for a column the table lacks, before any SQL runs
        quote = self.engine.dialect.identifier_preparer.quote
        postgres = self.engine.url.get_backend_name() == "postgresql"
        marks = ", ".join(f"${i}" if postgres else "?" for i in range(1, len(columns) + 1))
        # only the table's own names, quoted by the dialect, and placeholders: the values are bound
        return f"INSERT INTO {quote(table.name)} ({', '.join(quote(c) for c in columns)}) VALUES ({marks})"  # noqa: S608

    async def _insert_asyncpg(self, sql: str, rows: Rows) -> None:
        import asyncpg  # type: ignore[import-untyped]

        async with self.engine.connect() as conn:  # a pooled connection, pre-pinged
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            try:
                await driver.executemany(sql, rows)  # atomic; bounded by the connection's command timeout
            except asyncpg.InterfaceError as e:  # the connection is closed or unusable: not the pool's any more
                await conn.invalidate()
                raise DatabaseUnavailable(
                    "the gateway's database is unavailable (connection lost); try again later"
                ) from e
            except BaseException:
                await conn.invalidate()  # the driver's state is not what SQLAlchemy's pool expects: a new one
                raise

    async def aclose(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.aclose()
        await self.engine.dispose()


def redacted_url(url: str) -> str:
    """The URL as it may be logged or shown: no password, wherever the URL carries one."""
    try:
        return _redacted(make_url(url))
    except (exc.ArgumentError, ValueError):
        return "(a database URL that cannot be parsed)"


def _redacted(url: URL) -> str:
    shown = url.set(query={}).render_as_string(hide_password=True)  # the userinfo password as ***
    params = []
    for name, value in url.query.items():
        for one in value if isinstance(value, tuple) else (value,):
            params.append(f"{quote(name, safe='')}={'***' if _SECRET_PARAM.search(name) else quote(one, safe='')}")
    return shown + ("?" + "&".join(params) if params else "")


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except (exc.ArgumentError, ValueError):
        raise ValueError("the database URL cannot be parsed") from None  # the URL itself stays out of it
    if parsed.drivername not in DATABASE_SCHEMES:
        raise ValueError(f"the database URL must start with {' or '.join(s + '://' for s in DATABASE_SCHEMES)}")
    return parsed


def _postgres_engine(url: URL, pool_size: int, connect_timeout_s: float, statement_timeout_s: float) -> AsyncEngine:
    """pool_size 0: no pool (one connection per use, closed after it)."""
    connect_args = {
        "timeout": connect_timeout_s,
        "command_timeout": statement_timeout_s + CLIENT_MARGIN_S,
        "server_settings": {
            "statement_timeout": str(max(1, round(statement_timeout_s * 1000))),
            "application_name": "llm-gateway",
        },
    }
    if pool_size == 0:
        return create_async_engine(url, connect_args=connect_args, poolclass=NullPool)
    return create_async_engine(
        url,
        connect_args=connect_args,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_timeout=statement_timeout_s,
        pool_pre_ping=True,
        pool_recycle=1800,
    )


def _sqlite_engine(url: URL, pool_size: int, busy_timeout_s: float) -> AsyncEngine:
    path = url.database or ""
    in_memory = path in ("", ":memory:")
    if not in_memory and not path.startswith("file:"):  # "file:" is a URI (uri=true): the driver reads it
        _private_file(Path(path))
    # in memory: SQLAlchemy's one shared connection (StaticPool), which takes no pool size
    pool_args = {} if in_memory else {"pool_size": pool_size}
    engine = create_async_engine(url, connect_args={"timeout": busy_timeout_s}, **pool_args)

    def on_connect(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        dbapi_connection.isolation_level = None  # the driver emits no BEGIN of its own: on_begin does
        cursor = dbapi_connection.cursor()
        for pragma in sqlite_pragmas(busy_timeout_s):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    def on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(_IMMEDIATE) else "BEGIN")

    event.listen(engine.sync_engine, "connect", on_connect)
    event.listen(engine.sync_engine, "begin", on_begin)
    return engine


def _private_file(path: Path) -> None:
    """Create the database file 0600 before SQLite opens it (SQLite would create it 0644 under the usual
    umask, and its -wal and -shm files take the database file's mode), and its directory 0700 when it
    does not exist yet. A file that exists keeps its mode, unless others may read it: then it is made 0600."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077 and st.st_uid == os.getuid():  # an older gateway's file, created 0644
            os.fchmod(fd, 0o600)
            log.warning("the database file %s was readable by others; it is now 0600", path)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):  # left by an older gateway with the old mode: SQLite would reuse them
        side = path.with_name(path.name + suffix)
        if side.exists() and side.stat().st_mode & 0o077 and side.stat().st_uid == os.getuid():
            side.chmod(0o600)


async def _migrate(engine: AsyncEngine, *, postgres: bool, config_key_ids: Mapping[str, str] | None = None) -> None:
    async with engine.connect() as conn:
        if not postgres:
            await conn.execution_options(**{_IMMEDIATE: True})
        async with conn.begin():
            if postgres:  # held until this transaction ends: the next replica reads the version after it
                await conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            await conn.run_sync(_upgrade_to_head, dict(config_key_ids or {}))


def _alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    config.set_main_option("path_separator", "os")
    return config


def schema_head() -> str:
    """The revision the migrations lead to (what an opened database's version table holds). A test hook: the
    tests check an opened database against it; the product itself never asks."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    assert head is not None, "no migrations"
    return head


def _upgrade_to_head(connection: Connection, config_key_ids: dict[str, str]) -> None:
    config = _alembic_config()
    config.attributes["connection"] = connection  # env.py runs on it, inside our transaction
    config.attributes["config_key_ids"] = config_key_ids
    command.upgrade(config, "head")
