"""The runtime keys and the audit log in the gateway database (tables `api_keys`, `api_keys_revision`,
`audit_log`; see llm_gateway/state/tables.py).

Every change of a key is one transaction that first bumps the single revision row (on Postgres its row
lock orders the admins' writes, so a read-then-write here cannot interleave with another replica's),
then changes the key, then writes its audit row: the change, its audit entry and the revision the
replicas poll move together or not at all. Only digests are stored; the audit row says who, what and
when, never a key or a digest. A key is changed by its name (unique) but is its `id`, minted when it is
created and never changed: the audit rows name both, and deleting a key deletes the stored responses it
owns (no later key can be given them, and nobody else could read them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from llm_gateway.state.batches import delete_owned
from llm_gateway.state.database import Database
from llm_gateway.state.tables import api_keys, api_keys_revision, audit_log, responses


@dataclass(frozen=True, slots=True)
class KeyRow:
    id: str
    name: str
    sha256: str
    models: tuple[str, ...]
    limits: dict[str, Any]
    model_limits: dict[str, dict[str, Any]]
    expires_at: int | None
    revoked_at: int | None
    created_at: int
    updated_at: int


@dataclass(frozen=True, slots=True)
class AuditRow:
    id: int
    at: int
    actor: str
    action: str
    target: str | None
    target_id: str | None
    changes: dict[str, Any] | None


class NameTaken(Exception):
    """A key of that name exists already."""


class _NoSuchKey(Exception):
    """Raised inside a transaction to roll it back (its revision bump with it)."""


def _key(row: Any) -> KeyRow:
    return KeyRow(
        id=row.id,
        name=row.name,
        sha256=row.sha256,
        models=tuple(row.models),
        limits=dict(row.limits),
        model_limits={g: dict(v) for g, v in row.model_limits.items()},
        expires_at=row.expires_at,
        revoked_at=row.revoked_at,
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


async def _bump(conn: AsyncConnection) -> int:
    query = (
        api_keys_revision.update()
        .where(api_keys_revision.c.id == 1)
        .values(revision=api_keys_revision.c.revision + 1)
        .returning(api_keys_revision.c.revision)
    )
    return int((await conn.execute(query)).scalar_one())


async def _audit(
    conn: AsyncConnection, at: int, actor: str, action: str, target: KeyRow | None, changes: Mapping[str, Any] | None
) -> None:
    await conn.execute(
        audit_log.insert().values(
            at=at,
            actor=actor,
            action=action,
            target=None if target is None else target.name,
            target_id=None if target is None else target.id,
            changes=dict(changes or {}),
        )
    )


class KeyStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def revision(self) -> int:
        async with self.db.begin() as conn:
            return int((await conn.execute(sa.select(api_keys_revision.c.revision))).scalar_one())

    async def snapshot(self) -> tuple[int, list[KeyRow]]:
        """The revision, then every key (at least as new as that revision)."""
        async with self.db.begin() as conn:
            rev = int((await conn.execute(sa.select(api_keys_revision.c.revision))).scalar_one())
            rows = (await conn.execute(sa.select(api_keys).order_by(api_keys.c.name))).all()
        return rev, [_key(r) for r in rows]

    async def all(self) -> list[KeyRow]:
        return (await self.snapshot())[1]

    async def get(self, name: str) -> KeyRow | None:
        async with self.db.begin() as conn:
            row = (await conn.execute(sa.select(api_keys).where(api_keys.c.name == name))).one_or_none()
        return None if row is None else _key(row)

    async def create(self, key: KeyRow, actor: str, changes: Mapping[str, Any]) -> None:
        """Insert a new key; `NameTaken` when the name is in use."""
        try:
            async with self.db.begin() as conn:
                await _bump(conn)
                await conn.execute(
                    api_keys.insert().values(
                        id=key.id,
                        name=key.name,
                        sha256=key.sha256,
                        models=list(key.models),
                        limits=key.limits,
                        model_limits=key.model_limits,
                        expires_at=key.expires_at,
                        revoked_at=key.revoked_at,
                        created_at=key.created_at,
                        updated_at=key.updated_at,
                    )
                )
                await _audit(conn, key.created_at, actor, "key.create", key, changes)
        except IntegrityError:
            raise NameTaken(key.name) from None

    async def update(
        self, name: str, values: Mapping[str, Any], at: int, actor: str, action: str, changes: Mapping[str, Any]
    ) -> KeyRow | None:
        """Set `values` on the key (None when there is none) and audit `action` with `changes`."""
        query = api_keys.update().where(api_keys.c.name == name).values(**values, updated_at=at).returning(*api_keys.c)
        try:
            async with self.db.begin() as conn:
                await _bump(conn)
                row = (await conn.execute(query)).one_or_none()
                if row is None:
                    raise _NoSuchKey
                key = _key(row)
                await _audit(conn, at, actor, action, key, changes)
        except _NoSuchKey:
            return None
        return key

    async def delete(self, name: str, at: int, actor: str) -> bool:
        """Delete the key and the stored responses, batches and files it owns; False when there is no such key."""
        query = api_keys.delete().where(api_keys.c.name == name).returning(*api_keys.c)
        try:
            async with self.db.begin() as conn:
                await _bump(conn)
                row = (await conn.execute(query)).one_or_none()
                if row is None:
                    raise _NoSuchKey
                key = _key(row)
                gone = await conn.execute(responses.delete().where(responses.c.owner == key.id))
                files = await delete_owned(conn, key.id)  # its batches and files go with it too
                changes = {"stored_responses_deleted": gone.rowcount, "batch_files_deleted": files}
                await _audit(conn, at, actor, "key.delete", key, changes)
        except _NoSuchKey:
            return False
        return True

    async def audit(
        self,
        *,
        limit: int,
        before: int | None = None,
        actor: str | None = None,
        target: str | None = None,
        target_id: str | None = None,
        action: str | None = None,
    ) -> Sequence[AuditRow]:
        """Audit rows, newest first; `before` is an id (the page after the one that ended there)."""
        query = sa.select(audit_log).order_by(audit_log.c.id.desc()).limit(limit)
        if before is not None:
            query = query.where(audit_log.c.id < before)
        if actor is not None:
            query = query.where(audit_log.c.actor == actor)
        if target is not None:
            query = query.where(audit_log.c.target == target)
        if target_id is not None:
            query = query.where(audit_log.c.target_id == target_id)
        if action is not None:
            query = query.where(audit_log.c.action == action)
        async with self.db.begin() as conn:
            rows = (await conn.execute(query)).all()
        return [AuditRow(r.id, r.at, r.actor, r.action, r.target, r.target_id, r.changes or None) for r in rows]
