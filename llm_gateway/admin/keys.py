"""/admin/keys: API keys at runtime (create, list, read, change, revoke, rotate, delete).

A created or rotated key is answered once (`key`) and only its SHA-256 digest is stored. Keys from the
config file are listed too, marked `source: config`, `read_only: true`: changing one is 409 (edit the
file). Every change writes one audit row (who, what, which fields, when) in the same transaction, and
takes effect on this replica at once and on every other within `admin.key_poll_s` (see refresh.py).
Revoking keeps the key listed (status `revoked`) and refuses it; deleting removes it, deletes the stored
responses it owns and frees its name.

Every key has an `id`, its identity (minted for a runtime key at creation, derived from the digest for a
config key); a name is a label, unique across the config file's keys and the runtime keys: creating a
runtime key under a config key's name is 409 `name_taken`, and a config reload that would give a config
key a runtime key's name is refused (service/reload.py). A runtime key whose name a config key took while the
gateway was down is listed with status `conflict` and refused (refresh.py); the routes that change a key
act on the runtime key of a name whenever there is one, so it can still be revoked or deleted. A row an
older version stored in a form this one cannot read is listed as `malformed`, never a 500.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from pydantic import ValidationError

from llm_gateway.access.keys import config_key_id, new_key, new_key_id
from llm_gateway.admin.context import AdminContext, admin_context
from llm_gateway.admin.errors import Conflict, NotFound
from llm_gateway.admin.schemas import (
    DIGEST_PREFIX_CHARS,
    KeyCreate,
    KeyCreated,
    KeyList,
    KeyName,
    KeyOut,
    KeyUpdate,
    Status,
    to_time,
    to_unix,
)
from llm_gateway.admin.security import AdminUser
from llm_gateway.admin.store import KeyRow, KeyStore, NameTaken
from llm_gateway.errors import InvalidRequest
from llm_gateway.settings import KeyConfig, Limits

log = logging.getLogger("gateway.admin")

router = APIRouter(prefix="/keys", tags=["keys"])
Ctx = Annotated[AdminContext, Depends(admin_context)]


def _limits(lim: Limits) -> dict[str, Any]:
    return lim.model_dump(mode="json", exclude_none=True)


def _config_out(k: KeyConfig) -> KeyOut:
    return KeyOut(
        id=config_key_id(k.sha256),
        name=k.name,
        source="config",
        read_only=True,
        status="active",
        sha256_prefix=k.sha256[:DIGEST_PREFIX_CHARS],
        models=list(k.models),
        limits=k.limits,
        model_limits=dict(k.model_limits),
    )


def _out(ctx: AdminContext, row: KeyRow, now: float) -> KeyOut:
    try:
        limits = Limits(**row.limits)
        model_limits = {g: Limits(**v) for g, v in row.model_limits.items()}
        malformed = False
    except (ValidationError, TypeError, AttributeError):  # stored by an older version: listed, refused
        limits, model_limits, malformed = Limits(), {}, True
    status: Status = "active"
    if row.revoked_at is not None:
        status = "revoked"
    elif malformed:
        status = "malformed"
    elif row.name in ctx.gw.runtime.auth.config_names:
        status = "conflict"
    elif row.expires_at is not None and row.expires_at <= now:
        status = "expired"
    return KeyOut(
        id=row.id,
        name=row.name,
        source="runtime",
        read_only=False,
        status=status,
        sha256_prefix=row.sha256[:DIGEST_PREFIX_CHARS],
        models=list(row.models),
        limits=limits,
        model_limits=model_limits,
        expires_at=to_time(row.expires_at),
        revoked_at=to_time(row.revoked_at),
        created_at=to_time(row.created_at),
        updated_at=to_time(row.updated_at),
    )


def _config_key(ctx: AdminContext, name: str) -> KeyConfig | None:
    return next((k for k in ctx.gw.runtime.config.auth.keys if k.name == name), None)


async def _runtime_row(ctx: AdminContext, store: KeyStore, name: str) -> KeyRow:
    """The runtime key a change acts on: 404 when there is none, 409 when the name is a config key's."""
    row = await store.get(name)
    if row is not None:
        return row
    if _config_key(ctx, name) is not None:
        raise _read_only(name)
    raise _missing(name)


def _read_only(name: str) -> Conflict:
    return Conflict(
        f"The key '{name}' comes from the config file and is read-only here; change it in the file.",
        code="read_only_key",
    )


def _missing(name: str) -> NotFound:
    return NotFound(f"No key named '{name}'.", code="key_not_found", param="name")


async def _store(ctx: AdminContext) -> KeyStore:
    return KeyStore(await ctx.database())


async def _refresh(ctx: AdminContext) -> None:
    """This replica applies its own change at once (the others at their next poll)."""
    try:
        await ctx.refresher.refresh()
    except Exception as e:  # the change is committed: the poll will pick it up
        log.warning("runtime keys not refreshed after a change (%s); the next poll will", type(e).__name__)


@router.post("", status_code=201, summary="Create a key (answered once)")
async def create_key(body: KeyCreate, admin: AdminUser, ctx: Ctx) -> KeyCreated:
    if _config_key(ctx, body.name) is not None:
        raise Conflict(f"A key named '{body.name}' exists in the config file.", code="name_taken", param="name")
    key, digest = new_key()
    now = int(ctx.clock())
    row = KeyRow(
        id=new_key_id(),
        name=body.name,
        sha256=digest,
        models=tuple(body.models),
        limits=_limits(body.limits),
        model_limits={g: _limits(v) for g, v in body.model_limits.items()},
        expires_at=to_unix(body.expires_at),
        revoked_at=None,
        created_at=now,
        updated_at=now,
    )
    changes = {
        "models": list(row.models),
        "limits": row.limits,
        "model_limits": row.model_limits,
        "expires_at": row.expires_at,
    }
    try:
        await (await _store(ctx)).create(row, admin.name, changes)
    except NameTaken:
        raise Conflict(f"A key named '{body.name}' exists already.", code="name_taken", param="name") from None
    await _refresh(ctx)
    return KeyCreated(**dict(_out(ctx, row, now)), key=key)


@router.get("", summary="List the keys (config-file keys included, read-only)")
async def list_keys(admin: AdminUser, ctx: Ctx) -> KeyList:
    now = ctx.clock()
    config = [_config_out(k) for k in ctx.gw.runtime.config.auth.keys]
    runtime = [_out(ctx, r, now) for r in await (await _store(ctx)).all()]
    return KeyList(data=config + runtime)


@router.get("/{name}", summary="One key")
async def get_key(name: str, admin: AdminUser, ctx: Ctx) -> KeyOut:
    k = _config_key(ctx, name)
    if k is not None:
        return _config_out(k)
    row = await (await _store(ctx)).get(name)
    if row is None:
        raise _missing(name)
    return _out(ctx, row, ctx.clock())


@router.patch("/{name}", summary="Change a key's models, limits, model limits or expiry")
async def update_key(name: KeyName, body: KeyUpdate, admin: AdminUser, ctx: Ctx) -> KeyOut:
    fields = body.model_fields_set
    if not fields:
        raise InvalidRequest("Nothing to change: send models, limits, model_limits or expires_at.", code="empty_update")
    store = await _store(ctx)
    row = await _runtime_row(ctx, store, name)
    new: dict[str, Any] = {}
    if "models" in fields:
        new["models"] = list(body.models or ())
    if "limits" in fields:
        new["limits"] = _limits(body.limits or Limits())
    if "model_limits" in fields:
        new["model_limits"] = {g: _limits(v) for g, v in (body.model_limits or {}).items()}
    if "expires_at" in fields:
        new["expires_at"] = to_unix(body.expires_at)
    old: dict[str, Any] = {
        "models": list(row.models),
        "limits": row.limits,
        "model_limits": row.model_limits,
        "expires_at": row.expires_at,
    }
    values = {f: v for f, v in new.items() if v != old[f]}
    if not values:
        return _out(ctx, row, ctx.clock())  # nothing changes: nothing to audit
    now = int(ctx.clock())
    changes = {f: {"from": old[f], "to": v} for f, v in values.items()}
    updated = await store.update(name, values, now, admin.name, "key.update", changes)
    if updated is None:
        raise _missing(name)
    await _refresh(ctx)
    return _out(ctx, updated, now)


@router.post("/{name}/revoke", summary="Revoke a key (it stays listed, refused everywhere)")
async def revoke_key(name: KeyName, admin: AdminUser, ctx: Ctx) -> KeyOut:
    store = await _store(ctx)
    row = await _runtime_row(ctx, store, name)
    if row.revoked_at is not None:
        return _out(ctx, row, ctx.clock())  # revoked already
    now = int(ctx.clock())
    updated = await store.update(name, {"revoked_at": now}, now, admin.name, "key.revoke", {"revoked_at": now})
    if updated is None:
        raise _missing(name)
    await _refresh(ctx)
    return _out(ctx, updated, now)


@router.post("/{name}/rotate", summary="Give a key a new secret (answered once); the old one stops working")
async def rotate_key(name: KeyName, admin: AdminUser, ctx: Ctx) -> KeyCreated:
    store = await _store(ctx)
    row = await _runtime_row(ctx, store, name)
    if row.revoked_at is not None:
        raise Conflict(f"The key '{name}' is revoked; create a new one.", code="key_revoked")
    key, digest = new_key()
    now = int(ctx.clock())
    updated = await store.update(name, {"sha256": digest}, now, admin.name, "key.rotate", {"key": "rotated"})
    if updated is None:
        raise _missing(name)
    await _refresh(ctx)
    return KeyCreated(**dict(_out(ctx, updated, now)), key=key)


@router.delete(
    "/{name}",
    status_code=204,
    summary="Delete a key and its stored responses (refused everywhere; its name is free again)",
)
async def delete_key(name: KeyName, admin: AdminUser, ctx: Ctx) -> Response:
    store = await _store(ctx)
    await _runtime_row(ctx, store, name)
    if not await store.delete(name, int(ctx.clock()), admin.name):
        raise _missing(name)
    await _refresh(ctx)
    return Response(status_code=204)
