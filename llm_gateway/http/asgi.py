"""The ASGI entry point: request ids, dispatch by (method, path), error rendering, the lifespan.

Routes are a dict lookup, not a framework router (measured in bench/: the whole HTTP surface is a
handful of fixed paths), plus prefix routes with an id in the path (/v1/models/{id},
/v1/responses/{id}); the dialects build the table (`Routes`) and the server knows no route by name.
Every error becomes the OpenAI envelope with its status, or on the routes of another API (`Routes.renderers`:
Anthropic's /v1/messages) that API's envelope; an exception the
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
from dataclasses import dataclass, field
from typing import Any

from llm_gateway.errors import GatewayError, MethodNotAllowed, RouteNotFound
from llm_gateway.http.call import Call, Receive, Scope, Send
from llm_gateway.http.cors import Cors
from llm_gateway.observability.record import RequestRecord, finish_record, outcome_of
from llm_gateway.service.runtime import Gateway, Runtime

log = logging.getLogger("gateway")
_RID = re.compile(rb"^[A-Za-z0-9._:/+=-]{1,128}$")

#: a handler gets the dialects' handler context (opaque here), the call, its record and the live runtime
Handler = Callable[[Any, Call, RequestRecord, Runtime], Awaitable[None]]
Lifecycle = Callable[[], Awaitable[None]]
ErrorRenderer = Callable[[GatewayError, str], tuple[int, bytes]]  # (error, request id) -> (status, body)
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ADMIN_PREFIX = "/admin"
STATUS_PAGE = "/status"  # the status page (llm_gateway/admin/status.py), served by the admin app too


@dataclass(frozen=True, slots=True)
class PrefixRoute:
    """The paths that start with one of `prefixes` (and end with `suffix`, when given): an id in the path."""

    prefixes: tuple[str, ...]
    methods: dict[str, Handler]
    suffix: str | None = None

    def matches(self, path: str) -> bool:
        return path.startswith(self.prefixes) and (self.suffix is None or path.endswith(self.suffix))

    @property
    def allow(self) -> str:
        return ", ".join(sorted(self.methods))


@dataclass(frozen=True)
class Routes:
    """What the server dispatches by: fixed (method, path) routes, then the prefix routes in order, and the
    error renderers of the paths that speak another API than OpenAI's (all their errors, 404/405 included).
    The dialects build it (`llm_gateway.dialects.routes`); the server knows no route by name."""

    exact: dict[tuple[str, str], Handler]
    prefixed: tuple[PrefixRoute, ...] = ()
    renderers: dict[str, ErrorRenderer] = field(default_factory=dict)
    paths: frozenset[str] = field(init=False)
    allow: dict[str, str] = field(init=False)  # the `Allow` header of a 405 (RFC 9110 section 15.5.6)

    def __post_init__(self) -> None:
        paths = frozenset(p for _, p in self.exact)
        object.__setattr__(self, "paths", paths)
        allow = {path: ", ".join(sorted(m for m, p in self.exact if p == path)) for path in paths}
        object.__setattr__(self, "allow", allow)

    def prefix_route(self, path: str) -> PrefixRoute | None:
        for route in self.prefixed:
            if route.matches(path):
                return route
        return None

    def methods(self, path: str) -> str | None:
        """The methods a path serves (None: no route), for a CORS preflight's answer."""
        if path in self.paths:
            return self.allow[path]
        route = self.prefix_route(path)
        return route.allow if route is not None else None


class GatewayApp:
    def __init__(
        self,
        gw: Gateway,
        routes: Routes,
        context: Any,
        *,
        on_startup: Lifecycle | None = None,
        on_shutdown: Lifecycle | None = None,
        admin: ASGIApp | None = None,
    ) -> None:
        self.gw = gw
        self.routes = routes
        self.admin = admin
        self.cors = Cors(gw.server.cors, routes.methods) if gw.server.cors.allow_origins else None
        self.context = context  # the dialects' handler context, handed to every handler
        self._on_startup = on_startup
        self._on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        method, path = scope["method"], scope["path"]
        routes = self.routes
        handler = routes.exact.get((method, path))
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
        rec = RequestRecord(rid, t0, method, path if path in routes.paths else "other")
        if self.gw.tracing is not None and method == "POST":  # off: this one check (observability/tracing.py)
            rec.trace = self.gw.tracing.begin(rec, by_name)
        self.gw.usage.begin(rec)  # in flight: a crash spool's checkpoint sees it (one dict insert)
        rt = self.gw.runtime
        try:
            if handler is None:
                if path in routes.paths:  # a fixed path (/v1/responses/input_tokens too) before the prefixes
                    raise MethodNotAllowed(f"{method} is not allowed on {path}", headers={"allow": routes.allow[path]})
                prefixed = routes.prefix_route(path)
                if prefixed is None:
                    raise RouteNotFound(f"Unknown request URL: {method} {path[:200]}")
                handler = prefixed.methods.get(method)
                if handler is None:
                    raise MethodNotAllowed(
                        f"{method} is not allowed on {path[:200]}", headers={"allow": prefixed.allow}
                    )
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
        render = self.routes.renderers.get(call.scope["path"])
        status, body = render(e, call.rid) if render is not None else (e.status, e.body())
        with contextlib.suppress(OSError):
            await call.respond(status, body, headers)

    async def shutdown(self) -> None:
        """What `lifespan.shutdown` runs: for a host that drives the app without a lifespan (tests, embedders), so
        the databases, tasks and engines it opened are closed rather than left to the garbage collector."""
        if self._on_shutdown:
            await self._on_shutdown()

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
                    await self.shutdown()
                finally:
                    await send({"type": "lifespan.shutdown.complete"})
                return
