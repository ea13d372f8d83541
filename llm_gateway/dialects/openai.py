"""OpenAI's own routes on the gateway: `POST /v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
`GET /v1/models` and `GET /v1/models/{id}` (also without the `/v1` prefix). The service speaks this
dialect, so a handler only authenticates, reads the body and hands over.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from llm_gateway.dialects.common import HandlerContext, authenticate, read_client_body
from llm_gateway.errors import ModelNotFound
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.table import ModelRoute
from llm_gateway.service.runtime import Runtime
from llm_gateway.types import Endpoint


async def _generation(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime, endpoint: Endpoint) -> None:
    rec.endpoint = endpoint
    who = authenticate(call, rec, rt)
    body = await read_client_body(ctx, call)
    await ctx.service.handle(call, rec, rt, endpoint, body, who)


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
