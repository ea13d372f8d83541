"""Handlers of the HTTP surface. Each parses what it needs and hands over; no routing logic here.

A handler gets `(HandlerContext, Call, RequestRecord, Runtime)`: the few shared objects it needs
(the generation service, the server settings, the metrics, the start time), not the whole app.
The status of each answer is recorded by the `Call` that sends it.

OpenAI routes: `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `GET /v1/models`,
`GET /v1/models/{id}` (also without the `/v1` prefix); Anthropic's `POST /v1/messages` and
`/v1/messages/count_tokens` are in `http/anthropic.py`, and OpenAI's Responses API
(`/v1/responses`) in `http/responses.py`, over the same service. Operations:
`GET /healthz` (the process is alive), `GET /readyz` (at least one backend is ready or busy),
`GET /metrics`, `GET /openapi.json`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway.auth import Principal
from llm_gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    InvalidJSON,
    InvalidRequest,
    ModelNotFound,
    RouteNotFound,
    ServiceUnavailable,
    UnsupportedMediaType,
)
from llm_gateway.http.call import Call
from llm_gateway.http.openapi import openapi_document
from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.record import RequestRecord
from llm_gateway.request_info import FORMAT_SEP
from llm_gateway.routing.table import ModelRoute
from llm_gateway.runtime import Runtime
from llm_gateway.service import GenerationService
from llm_gateway.settings import ServerConfig
from llm_gateway.types import Endpoint

if TYPE_CHECKING:
    from llm_gateway.state.responses import ResponseStore

PROM = b"text/plain; version=0.0.4; charset=utf-8"
REOPEN_AFTER_S = 5.0


class StoredResponses:
    """The process's store of Responses API answers, opened on first need by the opener the composition
    root gives (None: the gateway keeps no responses). An opening that failed is tried again after
    `REOPEN_AFTER_S`, not on every request."""

    __slots__ = ("_lock", "_open", "_retry_at", "store")

    def __init__(self, open_store: Callable[[], Awaitable[ResponseStore]] | None) -> None:
        self._open = open_store
        self._lock = asyncio.Lock()
        self._retry_at = 0.0
        self.store: ResponseStore | None = None

    async def get(self) -> ResponseStore:
        if self.store is not None:
            return self.store
        if self._open is None:
            raise ServiceUnavailable("This gateway keeps no stored responses.", code="database_unavailable")
        async with self._lock:
            if self.store is None:
                if time.monotonic() < self._retry_at:
                    raise ServiceUnavailable(
                        "The database of stored responses is unavailable; try again shortly.",
                        code="database_unavailable",
                    )
                try:
                    self.store = await self._open()
                except GatewayError:
                    self._retry_at = time.monotonic() + REOPEN_AFTER_S
                    raise
        return self.store

    async def aclose(self) -> None:
        if self.store is not None:
            await self.store.db.aclose()
            self.store = None


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What the handlers need of the process: fixed for its lifetime (the Runtime comes per request)."""

    service: GenerationService
    server: ServerConfig
    metrics: Metrics
    started_at: int
    responses: StoredResponses


def authenticate(call: Call, rec: RequestRecord, rt: Runtime) -> Principal:
    """The caller's key (`Authorization: Bearer` or `x-api-key`), recorded on the request."""
    who = rt.auth.authenticate(call.header(b"authorization"), call.header(b"x-api-key"))
    rec.key, rec.key_id = who.name, who.id
    call.who = who  # a refusal before the limiter admits the request is still one against its rpm (asgi.py)
    call.authenticated()  # its connection leaves the unauthenticated ones' cap (http/hardened_protocol.py)
    return who


def record_model(rec: RequestRecord, rt: Runtime, body: dict[str, Any]) -> None:
    """Count a translated request (Responses, Messages) under the public model it names from the moment its
    body parsed, so that its translation's 400s are not counted as "unknown"; a name the gateway does not
    serve stays "unknown" (metric labels never take a client's string)."""
    model = body.get("model")
    if isinstance(model, str):
        route = rt.table.resolve(model.rpartition(FORMAT_SEP)[0] or model)
        if route is not None:
            rec.model = route.name


async def _generation(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime, endpoint: Endpoint) -> None:
    rec.endpoint = endpoint
    who = authenticate(call, rec, rt)
    body = await read_json_object(ctx, call)
    await ctx.service.handle(call, rec, rt, endpoint, body, who)


async def read_json_object(ctx: HandlerContext, call: Call) -> dict[str, Any]:
    """The request body as a JSON object, within the server's size and time limits."""
    ct = call.header(b"content-type")
    if ct is not None and not ct.lower().startswith(b"application/json"):
        raise UnsupportedMediaType("The request body must be JSON: send it with 'Content-Type: application/json'.")
    server = ctx.server
    raw = await call.read_body(server.max_body_bytes, server.body_timeout_s)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidJSON(
            "We could not parse the JSON body of your request. The body must be valid JSON (UTF-8)."
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body


async def chat(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await _generation(ctx, call, rec, rt, "chat")


async def completions(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await _generation(ctx, call, rec, rt, "completions")


async def embeddings(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await _generation(ctx, call, rec, rt, "embeddings")


def _card(name: str, created: int, route: ModelRoute, now: float) -> dict[str, Any]:
    """OpenAI's model object, plus `context_length` (OpenRouter's field: the smallest window known of the
    model's deployments, absent when none is known) and `ready` (a deployment's backend is live and
    lists the model) and, where an engine tells, `resident` (a deployment has the model loaded)."""
    card: dict[str, Any] = {"id": name, "object": "model", "created": created, "owned_by": "llm-gateway"}
    if name != route.name:
        card["root"] = route.name
    windows = [n for d in route.deployments if (n := d.context_length) is not None]
    if windows:
        card["context_length"] = min(windows)
    card["ready"] = any(d.backend.health(now) in ("ready", "busy") and d.model_present() for d in route.deployments)
    known = [r for d in route.deployments if (r := d.resident) is not None]
    if known:
        card["resident"] = any(known)
    return card


async def list_models(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    now = time.monotonic()
    data = [
        _card(name, ctx.started_at, route, now)
        for name, route in rt.table.public_names()
        if who.may_use(route.name, route.cfg.aliases)
    ]
    await call.respond(200, orjson.dumps({"object": "list", "data": data}), [(b"x-request-id", call.rid.encode())])


async def get_model(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    name = call.scope["path"].split("/models/", 1)[1]
    route = rt.table.resolve(name)
    if route is None or not who.may_use(route.name, route.cfg.aliases):
        raise ModelNotFound(
            "The requested model does not exist; GET /v1/models lists the models this key may use.", param="model"
        )
    await call.respond(
        200,
        orjson.dumps(_card(name, ctx.started_at, route, time.monotonic())),
        [(b"x-request-id", call.rid.encode())],
    )


async def healthz(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    await call.respond(200, b'{"status":"ok"}', [])


async def readyz(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    now = time.monotonic()
    backends = {
        b.name: {"engine": b.kind, "state": b.health(now), "in_flight": b.in_flight} for b in rt.table.backends.values()
    }
    ready = any(v["state"] in ("ready", "busy") for v in backends.values())
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
