"""The operator's routes: `GET /healthz` (the process is alive), `GET /readyz` (at least one backend is
ready or busy, or a managed one can start on demand; a managed backend's entry says its phase, PID and loads),
`GET /metrics` (on the main port; see `metrics`), `GET /openapi.json`.
"""

from __future__ import annotations

import hashlib
import hmac
import time

import orjson

from llm_gateway.dialects.common import HandlerContext
from llm_gateway.dialects.openapi import openapi_document
from llm_gateway.errors import AuthenticationFailed, RouteNotFound
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service.runtime import Runtime

PROM = b"text/plain; version=0.0.4; charset=utf-8"


async def healthz(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await call.respond(200, b'{"status":"ok"}', [])


async def readyz(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    now = time.monotonic()
    backends: dict[str, dict[str, object]] = {}
    on_demand = False  # a managed backend that can start (routing/managed.py): the gateway can serve its models
    for b in rt.table.backends.values():
        entry: dict[str, object] = {"engine": b.kind, "state": b.health(now), "in_flight": b.in_flight}
        if b.managed is not None:
            entry["managed"] = b.managed.describe()
            on_demand = on_demand or b.managed.startable()
        if b.loras.held:  # the LoRA adapters its engine holds (routing/lora.py)
            entry["lora"] = b.loras.describe()
        if b.cfg.kv_events is not None:  # what cache_aware's record of its prefix cache follows (kv_events.py)
            entry["prefix_cache"] = b.kv.describe() if b.kv is not None else {"source": "approximate"}
        backends[b.name] = entry
    ready = on_demand or any(v["state"] in ("ready", "busy") for v in backends.values())
    status = 200 if ready else 503
    body = {"status": "ready" if ready else "not_ready", "backends": backends}
    await call.respond(status, orjson.dumps(body), [])


async def metrics(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    """/metrics on the main port: without `server.metrics_auth`, to anyone and without the series labelled by
    key (the metrics port has them); with it, every series to the bearer of its token, 401 to anyone else."""
    server = ctx.server
    if server.metrics_port is not None and not server.metrics_on_main_port:
        raise RouteNotFound("Metrics are served on the metrics port.")
    auth = server.metrics_auth
    if auth is not None:
        scheme, _, token = (call.header(b"authorization") or b"").partition(b" ")
        presented = hashlib.sha256(token.strip()).hexdigest().encode()
        if scheme.lower() != b"bearer" or not hmac.compare_digest(presented, auth.sha256.encode()):
            raise AuthenticationFailed(
                "/metrics needs the metrics token (server.metrics_auth) as 'Authorization: Bearer <token>'.",
                headers={"www-authenticate": "Bearer"},
            )
        call.authenticated()
    await call.respond(200, ctx.metrics.render(per_key=auth is not None), [], content_type=PROM)


async def openapi(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await call.respond(200, openapi_document(), [])
