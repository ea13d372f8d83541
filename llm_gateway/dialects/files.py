"""OpenAI's Files API as the Batch API needs it: `POST /v1/files` (purpose `batch`, a JSONL up to
`batches.max_file_bytes`, uploaded as multipart/form-data the way the `openai` SDK sends it), `GET /v1/files`
(paged: `after`, `limit`, `order`, `purpose`), `GET /v1/files/{id}`, `GET /v1/files/{id}/content` and
`DELETE /v1/files/{id}` (also without the `/v1` prefix). A batch's output and error files are listed and read the
same way (purpose `batch_output`).

Files live in the gateway's database with their bodies (state/batches.py says why) and belong to the key that
uploaded them: another key's file is a 404, as an unknown one. An upload may carry OpenAI's `expires_after` (anchor
`created_at`, seconds): the file object's `expires_at`, after which the file is a 404 and the runner's sweep
deletes it. The upload is read whole, within its size limit,
and checked to be UTF-8 text; its lines are checked when a batch is created from it (dialects/batches.py), as
OpenAI does. The helpers the batches' routes share (the store, paging, 404s) are here too.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson

from llm_gateway.dialects import multipart
from llm_gateway.dialects.common import HandlerContext, authenticate
from llm_gateway.errors import GatewayError, InvalidRequest, PayloadTooLarge, RouteNotFound
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service.runtime import Runtime

if TYPE_CHECKING:
    from llm_gateway.service.batch_runner import Batches
    from llm_gateway.state.batches import BatchStore, FileRow

FILE_PREFIXES = ("/v1/files/", "/files/")
MULTIPART_OVERHEAD = 64 * 1024  # the form's other fields and part headers, over the file's own limit
JSONL = b"application/jsonl"
#: OpenAI's bounds of a file's `expires_after.seconds`: an hour to 30 days
MIN_EXPIRY_S, MAX_EXPIRY_S = 3600, 30 * 24 * 3600


def batches_of(ctx: HandlerContext, call: Call, rt: Runtime) -> Batches:
    """The Batch API's objects, or the 404 of a route this gateway does not serve (batches.enabled false)."""
    if ctx.batches is None or not rt.config.batches.enabled:
        raise RouteNotFound(f"Unknown request URL: {call.scope['method']} {call.scope['path'][:200]}")
    return ctx.batches


async def store_of(ctx: HandlerContext, call: Call, rt: Runtime) -> BatchStore:
    return await batches_of(ctx, call, rt).store()


def not_found(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(message, status=404, type_="invalid_request_error", code="not_found", param=param)


def target(call: Call, marker: str) -> tuple[str, str]:
    """(object id, what of it) from `.../{marker}/{id}[/{what}]`."""
    rest = call.scope["path"].split(marker, 1)[1]
    ident, _, sub = rest.partition("/")
    return ident[:128], sub


def query(call: Call) -> dict[str, str]:
    # blank values kept: `order=` is a bad order (a 400), not no order
    return dict(parse_qsl(call.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True))


def page_limit(params: dict[str, str], default: int, most: int) -> int:
    raw = params.get("limit")
    if raw is None:
        return default
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if not 1 <= n <= most:
        raise InvalidRequest(f"limit must be an integer from 1 to {most}.", param="limit")
    return n


def listing(data: list[dict[str, Any]], has_more: bool) -> bytes:
    return orjson.dumps(
        {
            "object": "list",
            "data": data,
            "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None,
            "has_more": has_more,
        }
    )


def rid_header(call: Call) -> list[tuple[bytes, bytes]]:
    return [(b"x-request-id", call.rid.encode())]


def file_object(f: FileRow) -> dict[str, Any]:
    return {
        "id": f.id,
        "object": "file",
        "bytes": f.bytes,
        "created_at": f.created_at,
        "filename": f.filename,
        "purpose": f.purpose,
        "status": "processed",
        "expires_at": f.expires_at,
        "status_details": None,
    }


async def upload(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    batches = batches_of(ctx, call, rt)
    limit = rt.config.batches.max_file_bytes
    boundary = multipart.boundary_of(call.header(b"content-type"))
    body = await call.read_body(limit + MULTIPART_OVERHEAD, ctx.server.body_timeout_s)
    parts = multipart.parse(body, boundary)
    purpose = parts.get("purpose")
    if purpose is None or purpose.data.strip() != b"batch":
        raise InvalidRequest("This gateway keeps files of purpose 'batch' only.", param="purpose")
    file = parts.get("file")
    if file is None or file.filename is None:
        raise InvalidRequest("The form has no 'file' field with a filename.", param="file")
    if len(file.data) > limit:
        raise PayloadTooLarge(f"The file is {len(file.data)} bytes; the limit is {limit}.")
    if not file.data.strip():
        raise InvalidRequest("The file is empty.", param="file")
    try:
        file.data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("The file must be UTF-8 text (JSONL).", param="file") from None
    from llm_gateway.state.batches import FileRow, new_id  # with the store: SQLAlchemy is loaded by then

    now = int(time.time())
    lifetime = expires_after(parts)
    f = FileRow(
        new_id("file-"),
        who.id,
        "batch",
        file.filename[:255],
        len(file.data),
        now,
        None if lifetime is None else now + lifetime,
    )
    await (await batches.store()).save_file(f, file.data)
    await call.respond(200, orjson.dumps(file_object(f)), rid_header(call))


def expires_after(parts: dict[str, multipart.Part]) -> int | None:
    """The seconds after its creation the file expires, from OpenAI's `expires_after` (the SDK sends the form fields
    `expires_after[anchor]`, which must be `created_at`, and `expires_after[seconds]`, from an hour to 30 days);
    None: it does not expire."""
    anchor, seconds = parts.get("expires_after[anchor]"), parts.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor is None or anchor.data.strip() != b"created_at":
        raise InvalidRequest("expires_after[anchor] must be 'created_at'.", param="expires_after.anchor")
    raw = seconds.data.strip() if seconds is not None else b""
    n = int(raw) if raw.isdigit() and len(raw) < 10 else -1
    if not MIN_EXPIRY_S <= n <= MAX_EXPIRY_S:
        raise InvalidRequest(
            f"expires_after[seconds] must be an integer from {MIN_EXPIRY_S} to {MAX_EXPIRY_S}.",
            param="expires_after.seconds",
        )
    return n


async def list_files(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    store = await store_of(ctx, call, rt)
    params = query(call)
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("order must be 'asc' or 'desc'.", param="order")
    rows, more = await store.files(
        who.id,
        purpose=params.get("purpose"),
        after=params.get("after"),
        limit=page_limit(params, 10_000, 10_000),
        ascending=order == "asc",
    )
    await call.respond(200, listing([file_object(f) for f in rows], more), rid_header(call))


async def retrieve(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    store = await store_of(ctx, call, rt)
    file_id, sub = target(call, "/files/")
    if sub == "content":
        data = await store.content(file_id, who.id)
        if data is None:
            raise not_found(f"No such File object: {file_id}", param="file_id")
        await call.respond(200, data, rid_header(call), JSONL)
        return
    if sub:
        raise RouteNotFound(f"Unknown request URL: GET {call.scope['path'][:200]}")
    f = await store.file(file_id, who.id)
    if f is None:
        raise not_found(f"No such File object: {file_id}", param="file_id")
    await call.respond(200, orjson.dumps(file_object(f)), rid_header(call))


async def delete(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    store = await store_of(ctx, call, rt)
    file_id, sub = target(call, "/files/")
    if sub:
        raise RouteNotFound(f"Unknown request URL: DELETE {call.scope['path'][:200]}")
    if not await store.delete_file(file_id, who.id):
        raise not_found(f"No such File object: {file_id}", param="file_id")
    await call.respond(200, orjson.dumps({"id": file_id, "object": "file", "deleted": True}), rid_header(call))
