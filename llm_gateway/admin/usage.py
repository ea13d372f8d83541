"""/admin/usage: the usage ledger aggregated, as JSON or CSV.

`GET /admin/usage?since=7d&by=key,model&format=json` sums the ledger's rows (one per generation request,
see llm_gateway/observability/ledger.py) from `since` (a duration before now: 30m, 24h, 7d, 2w; or a UTC
date or time) until `until` (default now), grouped by any of key, model, backend, endpoint, outcome and
day (UTC). Each group has requests, errors, prompt/completion/total tokens and, where the models have a
`price`, the cost at the current prices. `format=csv` answers the same table as `text/csv` (a header
line, then one line per group). The ledger is written about a second behind the traffic (and only with
`usage.ledger: true`; the answer says `ledger: false` otherwise).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, Literal, TypeVar

import orjson
from fastapi import APIRouter, Depends, Query
from fastapi.responses import Response

from llm_gateway.admin.context import AdminContext, admin_context
from llm_gateway.admin.security import AdminUser
from llm_gateway.errors import InvalidRequest
from llm_gateway.state.usage import DIMENSIONS, UsageStore, check_dimensions, parse_since, to_csv

T = TypeVar("T")
router = APIRouter(tags=["usage"])
Ctx = Annotated[AdminContext, Depends(admin_context)]


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


@router.get("/usage", summary="The usage ledger, aggregated (JSON or CSV)")
async def usage_report(
    admin: AdminUser,
    ctx: Ctx,
    since: Annotated[str, Query(max_length=40, description="30m, 24h, 7d, 2w, or a UTC date/time")] = "7d",
    until: Annotated[str | None, Query(max_length=40, description="default: now")] = None,
    by: Annotated[str, Query(max_length=200, description="comma-separated: " + ", ".join(DIMENSIONS))] = "key,model",
    format: Annotated[Literal["json", "csv"], Query()] = "json",
) -> Response:
    now = ctx.clock()
    since_ms = _parsed("since", lambda: parse_since(since, now))
    until_ms = None if until is None else _parsed("until", lambda: parse_since(until, now))
    dims = _parsed("by", lambda: check_dimensions(by.split(",")))
    cfg = ctx.gw.runtime.config
    prices = {m.name: m.price for m in cfg.models if m.price is not None}
    rows = await UsageStore(await ctx.database()).report(since_ms, dims, prices, until_ms)
    if format == "csv":
        return Response(
            to_csv(rows, dims),
            media_type="text/csv; charset=utf-8",
            headers={"content-disposition": 'attachment; filename="usage.csv"'},
        )
    data = [r.as_dict() for r in rows]
    total: dict[str, Any] = {
        k: sum(d[k] for d in data) for k in ("requests", "errors", "prompt_tokens", "completion_tokens", "total_tokens")
    }
    costs = [d["cost"] for d in data if d["cost"] is not None]
    total["cost"] = round(sum(costs), 9) if costs else None
    body = {
        "object": "usage_report",
        "since": _iso(since_ms),
        "until": _iso(until_ms if until_ms is not None else int(now * 1000)),
        "by": dims,
        "ledger": ctx.gw.usage.enabled,
        "data": data,
        "total": total,
    }
    return Response(orjson.dumps(body), media_type="application/json")


def _parsed(param: str, parse: Callable[[], T]) -> T:
    try:
        return parse()
    except ValueError as e:
        raise InvalidRequest(str(e).replace("since must", f"{param} must"), param=param) from None
