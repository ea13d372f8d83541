"""What every handler of the client dialects shares: the handler context, the store of stored responses,
authenticating the caller and reading a JSON body within the server's limits.

A handler gets `(HandlerContext, Call, RequestRecord, Runtime)`: the few shared objects it needs (the
generation service, the server settings, the metrics, the start time, the stored responses), not the
whole app. The status of each answer is recorded by the `Call` that sends it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway.access.keys import Principal
from llm_gateway.errors import GatewayError, InvalidJSON, InvalidRequest, ServiceUnavailable, UnsupportedMediaType
from llm_gateway.http.call import Call
from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.request_info import FORMAT_SEP
from llm_gateway.service.pipeline import GenerationService
from llm_gateway.service.runtime import Runtime
from llm_gateway.settings import ServerConfig
from llm_gateway.wire import body_json
from llm_gateway.wire.client_body import ClientBody

if TYPE_CHECKING:
    from llm_gateway.service.batch_runner import Batches
    from llm_gateway.state.responses import ResponseStore

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
    batches: Batches | None = None  # the Batch API's store and runner (None: batches.enabled is false)


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


async def read_client_body(ctx: HandlerContext, call: Call) -> ClientBody:
    """The request body as a JSON object (see `read_json_object`) that keeps the bytes it was parsed from: an
    OpenAI-compatible engine gets those bytes where the gateway only adds fields (wire/client_body.py)."""
    return await read_json_object(ctx, call, keep_bytes=True)  # type: ignore[return-value]


async def read_json_object(ctx: HandlerContext, call: Call, *, keep_bytes: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, within the server's size and time limits."""
    body, raw = await read_json_and_bytes(ctx, call)
    return ClientBody(body, raw) if keep_bytes else body


async def read_json_and_bytes(ctx: HandlerContext, call: Call) -> tuple[dict[str, Any], bytes]:
    """`read_json_object`'s body, and the bytes it was parsed from (a translation looks for what it kept in them)."""
    ct = call.header(b"content-type")
    if ct is not None and not ct.lower().startswith(b"application/json"):
        raise UnsupportedMediaType("The request body must be JSON: send it with 'Content-Type: application/json'.")
    server = ctx.server
    raw = await call.read_body(server.max_body_bytes, server.body_timeout_s)
    try:
        body = body_json.loads(raw)  # an agent's resent tools not parsed again
    except orjson.JSONDecodeError:
        raise InvalidJSON(
            "We could not parse the JSON body of your request. The body must be valid JSON (UTF-8)."
        ) from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    return body, raw
