"""The ASGI entry point: request ids, dispatch by (method, path), error rendering, the lifespan.

Routes are a dict lookup, not a framework router (measured in bench/: the whole HTTP surface is a
handful of fixed paths), plus two prefixes with an id in the path (/v1/models/{id},
/v1/responses/{id}). Every error becomes the OpenAI envelope with its status, or on the
routes of another API (`DIALECTS`: Anthropic's /v1/messages) that API's envelope; an exception the
gateway did not expect is logged and answered 500 with no internals in the body. A key's request refused
before the limiter saw it (a bad body, an unknown or forbidden model) still counts against the key's
requests per minute, and is a 429 once they are spent: a flood of bad requests is limited like any
other. Each request ends in exactly one `finish_record` (metrics + access log), with the status its
`Call` sent. The app is handed the service it serves (built by the composition root, app.py), never
builds it.

Two optional extras cost the hot path nothing when unused. The admin API (`admin`, a FastAPI app built
by app.py) gets every request whose path starts with `/admin` and is not a route here (one `startswith`
for paths outside `ROUTES`; the lifespan stays here). CORS (`server.cors`, off while it names no origin:
one attribute check) answers browsers' preflight `OPTIONS` on every route and adds
`Access-Control-Allow-Origin` to every answer for an allowed origin, errors and streams included.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable

from llm_gateway.errors import GatewayError, MethodNotAllowed, RouteNotFound
from llm_gateway.http import anthropic, handlers, responses
from llm_gateway.http.call import Call, Receive, Scope, Send
from llm_gateway.http.cors import Cors
from llm_gateway.ingress.anthropic_response import error_answer
from llm_gateway.observability.record import RequestRecord, finish_record, outcome_of
from llm_gateway.runtime import Gateway, Runtime
from llm_gateway.service import GenerationService

log = logging.getLogger("gateway")
_RID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,128}$")

Handler = Callable[[handlers.HandlerContext, Call, RequestRecord, Runtime], Awaitable[None]]
Lifecycle = Callable[[], Awaitable[None]]
ErrorRenderer = Callable[[GatewayError, str], tuple[int, bytes]]  # (error, request id) -> (status, body)
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def _routes() -> dict[tuple[str, str], Handler]:
    r: dict[tuple[str, str], Handler] = {}
    for prefix in ("/v1", ""):
        r[("POST", prefix + "/chat/completions")] = handlers.chat
        r[("POST", prefix + "/completions")] = handlers.completions
        r[("POST", prefix + "/embeddings")] = handlers.embeddings
        r[("GET", prefix + "/models")] = handlers.list_models
        r[("POST", prefix + "/responses")] = responses.create
    r[("GET", "/healthz")] = handlers.healthz
    r[("GET", "/readyz")] = handlers.readyz
    r[("GET", "/metrics")] = handlers.metrics
    r[("GET", "/openapi.json")] = handlers.openapi
    r[("POST", "/v1/responses/input_tokens")] = responses.input_tokens
    r[("POST", "/v1/messages")] = anthropic.messages
    r[("POST", "/v1/messages/count_tokens")] = anthropic.count_tokens
    return r


ROUTES = _routes()
PATHS = {p for _, p in ROUTES}
MODEL_PREFIXES = ("/v1/models/", "/models/")
#: /v1/responses/{id} and /v1/responses/{id}/input_items
RESPONSE_ROUTES: dict[str, Handler] = {"GET": responses.retrieve, "DELETE": responses.delete}
RESPONSE_ITEMS_ROUTES: dict[str, Handler] = {"GET": responses.retrieve}
# the `Allow` header of a 405 (RFC 9110 section 15.5.6): the methods the path does serve
ALLOW = {path: ", ".join(sorted(m for m, p in ROUTES if p == path)) for path in PATHS}
# the error envelope of the paths that speak another API than OpenAI's (all their errors, 404/405 included)
DIALECTS: dict[str, ErrorRenderer] = {"/v1/messages": error_answer, "/v1/messages/count_tokens": error_answer}
ADMIN_PREFIX = "/admin"
STATUS_PAGE = "/status"  # the status page (llm_gateway/admin/status.py), served by the admin app too


def _methods(path: str) -> str | None:
    """The methods a path serves (None: no route), for a CORS preflight's answer."""
    if path in PATHS:
        return ALLOW[path]
    if path.startswith(MODEL_PREFIXES):
        return "GET"
    if path.startswith(responses.PREFIXES):
        return "DELETE, GET"
    return None


class GatewayApp:
    def __init__(
        self,
        gw: Gateway,
        service: GenerationService,
        responses: handlers.StoredResponses | None = None,
        *,
        on_startup: Lifecycle | None = None,
        on_shutdown: Lifecycle | None = None,
        admin: ASGIApp | None = None,
    ) -> None:
        self.gw = gw
        self.admin = admin
        self.cors = Cors(gw.server.cors, _methods) if gw.server.cors.allow_origins else None
        self.service = service
        self._on_startup = on_startup
        self._on_shutdown = on_shutdown
        self.started_at = int(time.time())
        self.responses = responses or handlers.StoredResponses(None)
        self.context = handlers.HandlerContext(service, gw.server, gw.metrics, self.started_at, self.responses)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        method, path = scope["method"], scope["path"]
        handler = ROUTES.get((method, path))
        if handler is None and (path.startswith(ADMIN_PREFIX) or path == STATUS_PAGE) and self.admin is not None:
            await self.admin(scope, receive, send)
            return
        by_name = dict(reversed(scope["headers"]))  # a header sent twice: its first value
        rid_in = by_name.get(b"x-request-id")
        rid = rid_in.decode() if rid_in is not None and _RID.match(rid_in) else os.urandom(12).hex()
        server_send = None
        if self.cors is not None:
            origin = by_name.get(b"origin")
            if origin is not None:
                server_send, send = send, self.cors.wrap(origin, send)
                if method == "OPTIONS" and handler is None and by_name.get(b"access-control-request-method"):
                    handler = self.cors.preflight_handler(path)
        call = Call(scope, receive, send, rid, by_name, server_send)
        rec = RequestRecord(rid, t0, method, path if path in PATHS else "other")
        self.gw.usage.begin(rec)  # in flight: a crash spool's checkpoint sees it (one dict insert)
        rt = self.gw.runtime
        try:
            if handler is None:
                if path.startswith(MODEL_PREFIXES):
                    if method != "GET":
                        raise MethodNotAllowed(f"{method} is not allowed on {path[:200]}", headers={"allow": "GET"})
                    handler = handlers.get_model
                elif path in PATHS:  # a fixed path (/v1/responses/input_tokens too) before the prefixes
                    raise MethodNotAllowed(f"{method} is not allowed on {path}", headers={"allow": ALLOW[path]})
                elif path.startswith(responses.PREFIXES):
                    items = path.endswith("/input_items")  # /v1/responses/{id}/input_items serves GET only
                    handler = (RESPONSE_ITEMS_ROUTES if items else RESPONSE_ROUTES).get(method)
                    if handler is None:
                        allow = "GET" if items else "DELETE, GET"
                        raise MethodNotAllowed(f"{method} is not allowed on {path[:200]}", headers={"allow": allow})
                else:
                    raise RouteNotFound(f"Unknown request URL: {method} {path[:200]}")
            await handler(self.context, call, rec, rt)
        except GatewayError as e:
            if call.who is not None and not rec.metered and 400 <= e.status < 500 and e.status not in (401, 429):
                e = await self._metered(call, rt, e)  # refused before the limiter: still one request per minute
            rec.status, rec.error = e.status, e.code
            rec.outcome = outcome_of(e.status, e.code)
            if not call.started:
                await self.send_error(call, e)
                rec.status = call.status or rec.status  # a dialect may answer another status (Anthropic's 529)
        except asyncio.CancelledError:
            if not call.disconnected:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            rec.status, rec.outcome = 499, "cancelled"
        except Exception:
            log.exception("unexpected error while handling %s %s (request %s)", method, rec.path, rid)
            rec.status, rec.outcome, rec.error = 500, "error", "internal_error"
            if not call.started:
                await self.send_error(
                    call, GatewayError("The gateway hit an internal error; see its logs.", code="internal_error")
                )
        finally:
            if rec.status == 0:
                rec.status = call.status or 200
            finish_record(self.gw.metrics, self.gw.access, rec, self.gw.usage)

    @staticmethod
    async def _metered(call: Call, rt: Runtime, e: GatewayError) -> GatewayError:
        """A key's request refused before its limits were applied (a bad body, an unknown or forbidden model)
        counts against its requests per minute: once they are spent, the answer is that 429 instead."""
        assert call.who is not None
        try:
            await rt.limiter.meter_refused(call.who, call.rid)
        except GatewayError as limited:
            return limited
        return e

    async def send_error(self, call: Call, e: GatewayError) -> None:
        headers = [(b"x-request-id", call.rid.encode())]
        for k, v in e.headers.items():
            headers.append((k.encode(), v.encode()))
        if e.backend:
            headers.append((b"x-gateway-backend", e.backend.encode()))
        render = DIALECTS.get(call.scope["path"])
        status, body = render(e, call.rid) if render is not None else (e.status, e.body())
        with contextlib.suppress(OSError):
            await call.respond(status, body, headers)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    if self._on_startup:
                        await self._on_startup()
                except Exception as e:
                    log.exception("startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                try:
                    if self._on_shutdown:
                        await self._on_shutdown()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})
                return
