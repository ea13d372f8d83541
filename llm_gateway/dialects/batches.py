"""OpenAI's Batch API: `POST /v1/batches`, `GET /v1/batches/{id}`, `GET /v1/batches` (paged: `after`, `limit`)
and `POST /v1/batches/{id}/cancel` (also without the `/v1` prefix), in OpenAI's shapes, so that the `openai`
SDK's `batches` client works unmodified.

Creating a batch reads its input file (one of the key's files of purpose `batch`) and checks every line as OpenAI
does: a JSON object with a unique `custom_id`, `method` POST, the batch's `url` and a `body` object. A file with
bad lines makes a batch that is `failed` at once, with the errors (line numbers are the file's); a good one is
`in_progress` at once, its lines copied into the database (state/batches.py), and this replica's runner is woken
(service/batch_runner.py; the other replicas find it at their next poll). `stream` is dropped from the bodies: a
batch's answers are whole. `completion_window` is a number and a unit (`24h` as OpenAI's; `90m`, `30s` too, up to
`batches.max_window_s`): past it the batch ends `expired`, honestly, with what was done in its output file.
Batches belong to the key that created them; another key's batch is a 404.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import orjson

from llm_gateway.dialects.common import HandlerContext, authenticate, read_json_object
from llm_gateway.dialects.files import batches_of, listing, not_found, page_limit, query, rid_header, store_of, target
from llm_gateway.errors import GatewayError, InvalidRequest, RouteNotFound
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service.batch_runner import ENDPOINTS
from llm_gateway.service.runtime import Runtime

BATCH_PREFIXES = ("/v1/batches/", "/batches/")
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_ERRORS = 100  # the errors a failed batch lists (its first ones)
ENDED = ("completed", "failed", "expired")
STAGES = ("in_progress", "finalizing", "completed", "failed", "expired", "cancelling", "cancelled")


def batch_object(row: dict[str, Any]) -> dict[str, Any]:
    errors = row["errors"]
    obj: dict[str, Any] = {
        "id": row["id"],
        "object": "batch",
        "endpoint": row["endpoint"],
        "model": row["model"],
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": row["input_file_id"],
        "completion_window": row["completion_window"],
        "status": row["status"],
        "output_file_id": row["output_file_id"],
        "error_file_id": row["error_file_id"],
        "created_at": row["created_at"],
        "expires_at": row["expires_at"],
    }
    for stage in STAGES:
        obj[f"{stage}_at"] = row[f"{stage}_at"]
    obj["request_counts"] = {"total": row["total"], "completed": row["completed"], "failed": row["failed"]}
    obj["metadata"] = row["batch_metadata"]
    return obj


def _window_s(value: Any, most: float) -> int:
    m = _WINDOW.match(value) if isinstance(value, str) else None
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)] if m else 0
    if not 0 < seconds <= most:
        raise InvalidRequest(
            f"completion_window must be a duration such as '24h' (units s, m, h, d), at most {most:g} seconds.",
            param="completion_window",
        )
    return seconds


def _pair(k: Any, v: Any) -> bool:
    return isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    ok = isinstance(value, dict) and len(value) <= 16
    ok = ok and all(_pair(k, v) for k, v in value.items())
    if not ok:
        message = "metadata must be at most 16 string pairs (keys up to 64 characters, values up to 512)."
        raise InvalidRequest(message, param="metadata")
    return dict(value)


def read_lines(content: bytes, url: str, most: int) -> tuple[list[tuple[str, str]], list[dict[str, Any]], str | None]:
    """The file's requests as (custom_id, body JSON text), the errors of its bad lines (OpenAI's BatchError), and
    the one model they all name (None when they differ)."""
    lines: list[tuple[str, str]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()
    models: set[Any] = set()

    def bad(n: int, code: str, message: str, param: str | None = None) -> None:
        if len(errors) < MAX_ERRORS:
            errors.append({"code": code, "line": n, "message": message, "param": param})

    for n, raw in enumerate(content.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            req = orjson.loads(raw)
        except orjson.JSONDecodeError:
            bad(n, "invalid_json_line", "This line is not valid JSON.")
            continue
        if not isinstance(req, dict):
            bad(n, "invalid_json_line", "This line is not a JSON object.")
            continue
        cid, body = req.get("custom_id"), req.get("body")
        if not isinstance(cid, str) or not cid or len(cid) > 512:
            bad(n, "missing_required_parameter", "custom_id must be a non-empty string.", "custom_id")
        elif cid in seen:
            bad(n, "duplicate_custom_id", f"The custom_id {cid[:64]!r} is used by an earlier line.", "custom_id")
        elif req.get("method") != "POST":
            bad(n, "invalid_method", "method must be POST.", "method")
        elif req.get("url") != url:
            bad(n, "invalid_url", f"url must be the batch's endpoint, {url}.", "url")
        elif not isinstance(body, dict):
            bad(n, "missing_required_parameter", "body must be a JSON object.", "body")
        else:
            seen.add(cid)
            body.pop("stream", None)
            body.pop("stream_options", None)
            models.add(body.get("model"))
            lines.append((cid, orjson.dumps(body).decode()))
    if not lines and not errors:
        bad(1, "empty_file", "The input file has no requests.")
    if len(lines) > most:
        bad(len(lines), "too_many_requests", f"A batch holds at most {most} requests.")
    model = next(iter(models)) if len(models) == 1 else None
    return lines, errors, model if isinstance(model, str) else None


async def create(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    batches = batches_of(ctx, call, rt)
    cfg = rt.config.batches
    body = await read_json_object(ctx, call)
    endpoint, file_id = body.get("endpoint"), body.get("input_file_id")
    if not isinstance(endpoint, str) or endpoint not in ENDPOINTS:  # an object is unhashable: a 400, not a 500
        raise InvalidRequest(f"endpoint must be one of {', '.join(ENDPOINTS)}.", param="endpoint")
    if not isinstance(file_id, str):
        raise InvalidRequest("input_file_id must be a file's id.", param="input_file_id")
    window = body.get("completion_window")
    window_s = _window_s(window, cfg.max_window_s)
    metadata = _metadata(body.get("metadata"))
    store = await batches.store()
    f = await store.file(file_id[:128], who.id)
    content = await store.content(f.id, who.id) if f is not None and f.purpose == "batch" else None
    if content is None:
        raise not_found(f"No such File object of purpose 'batch': {file_id[:128]}", param="input_file_id")
    # up to batches.max_file_bytes of JSON: parsed off the event loop, which keeps serving meanwhile
    lines, errors, model = await asyncio.to_thread(read_lines, content, endpoint, cfg.max_lines)
    from llm_gateway.state.batches import new_id  # with the store: SQLAlchemy is loaded by then

    now = int(time.time())
    row: dict[str, Any] = {
        "id": new_id("batch_"),
        "owner": who.id,
        "endpoint": endpoint,
        "input_file_id": f.id,  # type: ignore[union-attr]
        "completion_window": window,
        "model": model,
        "created_at": now,
        "expires_at": now + window_s,
        "errors": errors or None,
        "batch_metadata": metadata,
        "completed": 0,
        "failed": 0,
        "output_file_id": None,
        "error_file_id": None,
        **{f"{stage}_at": None for stage in STAGES},
    }
    if errors:
        row.update(status="failed", failed_at=now, total=0)
        lines = []
    else:
        row.update(status="in_progress", in_progress_at=now, total=len(lines))
    await store.create_batch(row, lines)
    if lines:
        batches.kick()
    await call.respond(200, orjson.dumps(batch_object(row)), rid_header(call))


async def retrieve(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    store = await store_of(ctx, call, rt)
    batch_id, sub = target(call, "/batches/")
    if sub:
        raise RouteNotFound(f"Unknown request URL: GET {call.scope['path'][:200]}")
    row = await store.batch(batch_id, who.id)
    if row is None:
        raise not_found(f"No such Batch object: {batch_id}", param="batch_id")
    await call.respond(200, orjson.dumps(batch_object(row)), rid_header(call))


async def list_batches(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    store = await store_of(ctx, call, rt)
    params = query(call)
    rows, more = await store.list_batches(who.id, params.get("after"), page_limit(params, 20, 100))
    await call.respond(200, listing([batch_object(r) for r in rows], more), rid_header(call))


async def cancel(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    batches = batches_of(ctx, call, rt)
    batch_id, _ = target(call, "/batches/")
    row = await (await batches.store()).cancel(batch_id, who.id, int(time.time()))
    if row is None:
        raise not_found(f"No such Batch object: {batch_id}", param="batch_id")
    if row["status"] in ENDED:
        raise GatewayError(
            f"Cannot cancel a batch with status '{row['status']}'.",
            status=409,
            type_="invalid_request_error",
            code="batch_not_cancellable",
        )
    batches.kick()
    await call.respond(200, orjson.dumps(batch_object(row)), rid_header(call))
