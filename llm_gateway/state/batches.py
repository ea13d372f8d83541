"""The Batch API's state: files, batches, and each batch's lines with the lease that lets one replica at a time
run a line and the result that ends it.

Files (uploads and a batch's output and error files) keep their bodies in the database, in `batch_files`: the
replicas already share it (Postgres), so any replica can serve any file and run any batch without a shared disk,
and the embedded SQLite file keeps everything in the one place that is backed up; uploads are bounded by
`batches.max_file_bytes`. Like stored responses, a file or batch belongs to the key that created it (`owner`, the
key's id): every read names the owner, and another key's is indistinguishable from one that does not exist.
A file uploaded with OpenAI's `expires_after` has an `expires_at`: from then on it is read, listed and deleted as if
it were gone, and the batch runner's sweep (`delete_expired`) deletes it.

A batch's lines are copied out of its input file when it is created (`batch_lines`, one row each). Running them is
exactly-once per line in effect, across a `kill -9` and across replicas:
- a replica *claims* free lines with an UPDATE ... RETURNING (on Postgres of the rows a `SELECT ... FOR
  UPDATE SKIP LOCKED` just locked, so two replicas never take the same row; SQLite has one writer at a time): it
  becomes the line's `lease_owner` until `lease_until`, and renews the leases of the lines it runs (`renew`);
- the result is written by the UPDATE that ends the line (`record`), which holds only while the replica still owns
  the lease: a line is done with its result recorded, or it is still pending and its lease lapses, and then any
  replica redoes it. A replica killed mid-line loses nothing but that line's work in flight (the engine may have
  generated it once more; nothing is recorded twice);
- ending the batch (`finish`: completed, expired or cancelled) is one transaction that moves it out of its state
  only if it is still in it, ends its pending lines, and writes the output and error files from the lines in order,
  so it happens once, and a result that comes after it is refused.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_gateway.state.database import Database
from llm_gateway.state.tables import batch_files, batch_lines, batches

LINES_PER_INSERT = 500
#: the states a batch runs in (its lines are claimed, or its end is due)
ACTIVE = ("in_progress", "cancelling")
RUNNING = ("validating", "in_progress")  # what a cancel moves to "cancelling"
UNRUN = {
    "expired": ("batch_expired", "This request could not be executed before the completion window expired."),
    "cancelled": ("batch_cancelled", "This request was not executed: its batch was cancelled."),
}
#: the batch's columns as OpenAI names them, without the counts and errors (made by the dialect)
FILE_COLUMNS = (
    batch_files.c.id,
    batch_files.c.owner,
    batch_files.c.purpose,
    batch_files.c.filename,
    batch_files.c.bytes,
    batch_files.c.created_at,
    batch_files.c.expires_at,
)


def _live(now: int | None = None) -> Any:
    """The files not expired at `now` (default: this second)."""
    at = int(time.time()) if now is None else now
    return sa.or_(batch_files.c.expires_at.is_(None), batch_files.c.expires_at > at)


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True, slots=True)
class FileRow:
    id: str
    owner: str
    purpose: str
    filename: str
    bytes: int
    created_at: int
    expires_at: int | None = None  # unix seconds; None: never


@dataclass(frozen=True, slots=True)
class ClaimedLine:
    batch_id: str
    line: int
    custom_id: str
    body: str  # the request body, JSON text
    attempts: int  # this claim included


@dataclass(frozen=True, slots=True)
class ActiveBatch:
    id: str
    owner: str
    endpoint: str
    status: str
    expires_at: int


class BatchStore:
    """Files, batches and their lines in the gateway's database."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.postgres = db.engine.url.get_backend_name() == "postgresql"

    # -- files ---------------------------------------------------------------------------------------------
    async def save_file(self, f: FileRow, content: bytes) -> None:
        async with self.db.begin() as conn:
            await _insert_file(conn, f, content)

    async def file(self, file_id: str, owner: str) -> FileRow | None:
        query = sa.select(*FILE_COLUMNS).where(batch_files.c.id == file_id, batch_files.c.owner == owner, _live())
        async with self.db.begin() as conn:
            row = (await conn.execute(query)).one_or_none()
        return None if row is None else FileRow(*row)

    async def content(self, file_id: str, owner: str) -> bytes | None:
        query = sa.select(batch_files.c.content).where(
            batch_files.c.id == file_id, batch_files.c.owner == owner, _live()
        )
        async with self.db.begin() as conn:
            data = (await conn.execute(query)).scalar_one_or_none()
        return None if data is None else bytes(data)

    async def files(
        self, owner: str, *, purpose: str | None, after: str | None, limit: int, ascending: bool
    ) -> tuple[list[FileRow], bool]:
        """A page of the owner's files by creation (and id), after the file `after`; (page, whether more follow)."""
        where = [batch_files.c.owner == owner, _live()]
        if purpose is not None:
            where.append(batch_files.c.purpose == purpose)
        rows = await self._page(batch_files, FILE_COLUMNS, where, owner, after, limit, ascending)
        return [FileRow(*r) for r in rows[:limit]], len(rows) > limit

    async def delete_file(self, file_id: str, owner: str) -> bool:
        query = batch_files.delete().where(batch_files.c.id == file_id, batch_files.c.owner == owner, _live())
        async with self.db.begin() as conn:
            return (await conn.execute(query)).rowcount > 0

    async def delete_expired(self, now: int) -> int:
        """Delete the files expired at `now` (any owner's); how many."""
        query = batch_files.delete().where(batch_files.c.expires_at <= now)
        async with self.db.begin() as conn:
            return int((await conn.execute(query)).rowcount or 0)

    async def _page(
        self,
        table: sa.Table,
        columns: Sequence[Any],
        where: list[Any],
        owner: str,
        after: str | None,
        limit: int,
        ascending: bool,
    ) -> list[Any]:
        created, ident = table.c.created_at, table.c.id
        async with self.db.begin() as conn:
            if after is not None:
                at = sa.select(created).where(ident == after, table.c.owner == owner)
                cursor = (await conn.execute(at)).scalar_one_or_none()
                if cursor is None:
                    return []
                key = sa.tuple_(created, ident)
                where = [*where, key > sa.tuple_(cursor, after) if ascending else key < sa.tuple_(cursor, after)]
            order = (created.asc(), ident.asc()) if ascending else (created.desc(), ident.desc())
            query = sa.select(*columns).where(*where).order_by(*order).limit(limit + 1)
            return list(await conn.execute(query))

    # -- batches -------------------------------------------------------------------------------------------
    async def create_batch(self, row: dict[str, Any], lines: Sequence[tuple[str, str]]) -> None:
        """Insert the batch (`row`: its columns) and its lines ((custom_id, body JSON text), in order) at once."""
        async with self.db.begin() as conn:
            await conn.execute(batches.insert().values(**row))
            for at in range(0, len(lines), LINES_PER_INSERT):
                chunk = lines[at : at + LINES_PER_INSERT]
                await conn.execute(
                    batch_lines.insert(),
                    [
                        {
                            "batch_id": row["id"],
                            "line": at + i + 1,
                            "custom_id": cid,
                            "body": body,
                            "state": "pending",
                            "lease_owner": None,
                            "lease_until": 0,
                            "attempts": 0,
                        }
                        for i, (cid, body) in enumerate(chunk)
                    ],
                )

    async def batch(self, batch_id: str, owner: str) -> dict[str, Any] | None:
        """The owner's batch, its columns by name, with its counts now (None: unknown or another key's)."""
        query = sa.select(batches).where(batches.c.id == batch_id, batches.c.owner == owner)
        async with self.db.begin() as conn:
            row = (await conn.execute(query)).one_or_none()
            if row is None:
                return None
            return await _with_counts(conn, dict(row._mapping))

    async def list_batches(self, owner: str, after: str | None, limit: int) -> tuple[list[dict[str, Any]], bool]:
        rows = await self._page(batches, (batches,), [batches.c.owner == owner], owner, after, limit, False)
        async with self.db.begin() as conn:
            out = [await _with_counts(conn, dict(r._mapping)) for r in rows[:limit]]
        return out, len(rows) > limit

    async def cancel(self, batch_id: str, owner: str, now: int) -> dict[str, Any] | None:
        """Ask a running batch to stop (`cancelling`; the runner ends it); the batch as it is then, or None."""
        query = (
            batches.update()
            .where(batches.c.id == batch_id, batches.c.owner == owner, batches.c.status.in_(RUNNING))
            .values(status="cancelling", cancelling_at=now)
        )
        async with self.db.begin() as conn:
            await conn.execute(query)
        return await self.batch(batch_id, owner)

    # -- the runner ----------------------------------------------------------------------------------------
    async def active(self) -> list[ActiveBatch]:
        """Every batch that is running or being cancelled, oldest first (any owner: the runner serves them all)."""
        cols = (batches.c.id, batches.c.owner, batches.c.endpoint, batches.c.status, batches.c.expires_at)
        query = sa.select(*cols).where(batches.c.status.in_(ACTIVE)).order_by(batches.c.created_at, batches.c.id)
        async with self.db.begin() as conn:
            return [ActiveBatch(*r) for r in await conn.execute(query)]

    async def held(self, batch_id: str, now_ms: int) -> int:
        """Lines of the batch leased now, by any replica (what counts against its concurrency bound)."""
        query = sa.select(sa.func.count()).where(
            batch_lines.c.batch_id == batch_id, batch_lines.c.state == "pending", batch_lines.c.lease_until > now_ms
        )
        async with self.db.begin() as conn:
            return int((await conn.execute(query)).scalar_one())

    async def claim(self, batch_id: str, replica: str, n: int, now_ms: int, lease_ms: int) -> list[ClaimedLine]:
        """Lease up to `n` free lines of the batch (pending, no live lease) to `replica`, lowest first."""
        L = batch_lines.c
        free = (L.batch_id == batch_id, L.state == "pending", L.lease_until <= now_ms)
        pick = sa.select(L.line).where(*free).order_by(L.line).limit(n)
        claim = batch_lines.update().values(lease_owner=replica, lease_until=now_ms + lease_ms, attempts=L.attempts + 1)
        async with self.db.begin() as conn:
            if self.postgres:
                # two statements: Postgres may run an `IN (SELECT ... LIMIT n FOR UPDATE SKIP LOCKED)` subquery once
                # per row it joins, each run skipping the rows the last one locked, and so claim more than n (seen
                # in tests/e2e/test_batches_postgres.py); the lines locked here are passed over by other replicas
                lines = list((await conn.execute(pick.with_for_update(skip_locked=True))).scalars())
                if not lines:
                    return []
                where = L.line.in_(lines)
            else:  # one statement: SQLite has one writer, and a read before the write could not upgrade its lock
                where = L.line.in_(pick.scalar_subquery())
            rows = list(
                await conn.execute(claim.where(where, *free).returning(L.line, L.custom_id, L.body, L.attempts))
            )
        return sorted((ClaimedLine(batch_id, *r) for r in rows), key=lambda c: c.line)

    async def renew(self, replica: str, batch_id: str, lines: Sequence[int], until_ms: int) -> None:
        """Extend the leases `replica` holds on these lines of the batch."""
        L = batch_lines.c
        query = (
            batch_lines.update()
            .where(L.batch_id == batch_id, L.line.in_(list(lines)), L.lease_owner == replica, L.state == "pending")
            .values(lease_until=until_ms)
        )
        async with self.db.begin() as conn:
            await conn.execute(query)

    async def record(
        self, batch_id: str, line: int, replica: str, status_code: int, request_id: str, response: str
    ) -> bool:
        """End the line with its answer, if `replica` still holds it; False: it does not (the line was taken by
        another replica after the lease lapsed, or its batch ended): this result is dropped."""
        L = batch_lines.c
        query = (
            batch_lines.update()
            .where(L.batch_id == batch_id, L.line == line, L.lease_owner == replica, L.state == "pending")
            .values(
                state="done" if 200 <= status_code < 300 else "failed",
                status_code=status_code,
                request_id=request_id,
                response=response,
                lease_owner=None,
            )
        )
        async with self.db.begin() as conn:
            return (await conn.execute(query)).rowcount > 0

    async def release(self, batch_id: str, line: int, replica: str, retry_at_ms: int) -> bool:
        """Give the line back, to be tried again from `retry_at_ms` (by any replica)."""
        L = batch_lines.c
        query = (
            batch_lines.update()
            .where(L.batch_id == batch_id, L.line == line, L.lease_owner == replica, L.state == "pending")
            .values(lease_owner=None, lease_until=retry_at_ms)
        )
        async with self.db.begin() as conn:
            return (await conn.execute(query)).rowcount > 0

    async def finish(self, batch_id: str, status: str, now: int) -> bool:
        """End the batch as `status` (completed: only once no line is pending; expired: from in_progress;
        cancelled: from cancelling), write its output and error files; False when it was not in that state
        (another replica ended it, or lines are still pending)."""
        B = batches.c
        if status == "completed":
            pending = sa.select(batch_lines.c.line).where(
                batch_lines.c.batch_id == batch_id, batch_lines.c.state == "pending"
            )
            where: tuple[Any, ...] = (B.status == "in_progress", ~pending.exists())
            stamps = {"finalizing_at": now, "completed_at": now}
        elif status == "expired":
            where, stamps = (B.status == "in_progress",), {"expired_at": now}
        else:
            where, stamps = (B.status == "cancelling",), {"cancelled_at": now}
        async with self.db.begin() as conn:
            moved = await conn.execute(batches.update().where(B.id == batch_id, *where).values(status=status, **stamps))
            if moved.rowcount == 0:
                return False
            if status != "completed":
                L = batch_lines.c
                await conn.execute(
                    batch_lines.update()
                    .where(L.batch_id == batch_id, L.state == "pending")
                    .values(state=status, lease_owner=None)
                )
            owner = (await conn.execute(sa.select(B.owner).where(B.id == batch_id))).scalar_one()
            await _write_results(conn, batch_id, owner, now)
        return True


async def delete_owned(conn: AsyncConnection, owner: str) -> int:
    """Delete everything of the Batch API a key owns (its files, its batches and their lines), in the caller's
    transaction (the admin store's deletion of the key); the number of files deleted."""
    mine = sa.select(batches.c.id).where(batches.c.owner == owner)
    await conn.execute(batch_lines.delete().where(batch_lines.c.batch_id.in_(mine.scalar_subquery())))
    await conn.execute(batches.delete().where(batches.c.owner == owner))
    return int((await conn.execute(batch_files.delete().where(batch_files.c.owner == owner))).rowcount)


async def _insert_file(conn: AsyncConnection, f: FileRow, content: bytes) -> None:
    await conn.execute(
        batch_files.insert().values(
            id=f.id,
            owner=f.owner,
            purpose=f.purpose,
            filename=f.filename,
            bytes=f.bytes,
            created_at=f.created_at,
            expires_at=f.expires_at,
            content=content,
        )
    )


async def _with_counts(conn: AsyncConnection, row: dict[str, Any]) -> dict[str, Any]:
    """A batch that still runs gets its counts from its lines; an ended one has them in its row."""
    if row["status"] in ACTIVE:
        L = batch_lines.c
        query = sa.select(L.state, sa.func.count()).where(L.batch_id == row["id"]).group_by(L.state)
        by_state: dict[str, int] = {state: n for state, n in await conn.execute(query)}
        row["completed"] = by_state.get("done", 0)
        row["failed"] = by_state.get("failed", 0)
    return row


async def _write_results(conn: AsyncConnection, batch_id: str, owner: str, now: int) -> None:
    """The output file (2xx answers) and the error file (the rest), one line per request in input order with
    its `custom_id`, in OpenAI's shape; the batch's counts and file ids."""
    L = batch_lines.c
    query = (
        sa.select(L.line, L.custom_id, L.state, L.status_code, L.request_id, L.response)
        .where(L.batch_id == batch_id)
        .order_by(L.line)
    )
    out: list[bytes] = []
    err: list[bytes] = []
    for line, custom_id, state, status_code, request_id, response in await conn.execute(query):
        cid = orjson.dumps(custom_id)
        if state in UNRUN:
            code, message = UNRUN[state]
            error = orjson.dumps({"code": code, "message": message})
            err.append(
                b'{"id":"batch_req_%s_%d","custom_id":%s,"response":null,"error":%s}'
                % (batch_id.encode(), line, cid, error)
            )
            continue
        rid = request_id.encode()
        entry = (
            b'{"id":"batch_req_%s","custom_id":%s,"response":{"status_code":%d,"request_id":"%s","body":%s},'
            b'"error":null}' % (rid, cid, status_code, rid, response.encode())
        )
        (out if state == "done" else err).append(entry)
    ids: dict[str, Any] = {"completed": len(out), "failed": len(err), "output_file_id": None, "error_file_id": None}
    for kind, entries in (("output", out), ("error", err)):
        if entries:
            body = b"\n".join(entries) + b"\n"
            f = FileRow(new_id("file-"), owner, "batch_output", f"{batch_id}_{kind}.jsonl", len(body), now)
            await _insert_file(conn, f, body)
            ids[f"{kind}_file_id"] = f.id
    await conn.execute(batches.update().where(batches.c.id == batch_id).values(**ids))
