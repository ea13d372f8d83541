"""/admin/audit: the audit log, newest first. Each row says who (the admin key's name), what (the action,
the key acted on, by name and by id, the fields it set) and when; never a key or a digest. Written by the key routes in
the same transaction as the change itself (store.py); mutations are audited, reads are not."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from llm_gateway.admin.context import AdminContext, admin_context
from llm_gateway.admin.schemas import AuditEntry, AuditList, from_unix
from llm_gateway.admin.security import AdminUser
from llm_gateway.admin.store import KeyStore

router = APIRouter(tags=["audit"])
Ctx = Annotated[AdminContext, Depends(admin_context)]


@router.get("/audit", summary="The audit log, newest first")
async def list_audit(
    admin: AdminUser,
    ctx: Ctx,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    before: Annotated[
        int | None, Query(ge=1, le=2**63 - 1, description="only entries older than this id (paging)")
    ] = None,
    actor: Annotated[str | None, Query(max_length=128, description="an admin key's name")] = None,
    target: Annotated[str | None, Query(max_length=128, description="a key's name")] = None,
    target_id: Annotated[str | None, Query(max_length=64, description="a key's id")] = None,
    action: Annotated[str | None, Query(max_length=64, examples=["key.create"])] = None,
) -> AuditList:
    store = KeyStore(await ctx.database())
    rows = list(
        await store.audit(
            limit=limit + 1, before=before, actor=actor, target=target, target_id=target_id, action=action
        )
    )
    more = len(rows) > limit
    rows = rows[:limit]
    data = [
        AuditEntry(
            id=r.id,
            at=from_unix(r.at),
            actor=r.actor,
            action=r.action,
            target=r.target,
            target_id=r.target_id,
            changes=r.changes,
        )
        for r in rows
    ]
    return AuditList(data=data, has_more=more, next_before=rows[-1].id if more else None)
