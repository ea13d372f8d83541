"""The admin API's gate: who may reach it at all, decided from the request's headers alone, and a trace of
every admin request.

Pure ASGI, the outermost layer of the admin app (so in front of FastAPI and of `BodyLimit`): a request that
shows no admin key, or a wrong one, is answered 401 in the admin envelope with `connection: close` before
anything reads its body. FastAPI reads a route's body before it resolves the route's dependencies, so
`require_admin` alone let anyone hold a connection and a task by declaring a body and never sending it
(red-team H4). A request with a good key tells its connection that it authenticated (it leaves the cap of
unauthenticated connections, http/hardened_protocol.py) and goes on to the app, where `require_admin`
still names the admin for the routes. The paths anyone may read (the status page's HTML; the docs when
`admin.docs` is on) pass without a key: they are GETs that read no body.

Every admin request leaves one access-log line (`server.access_log`; the logger of the data plane's lines,
with `"admin"`: the admin key's name, or `"auth_failure"`: `missing_api_key` or `invalid_api_key`; never a
key or a header value) and counts in `gateway_admin_requests_total{status_class}`; a refused admin
key also counts in `gateway_admin_auth_failures_total{reason}` (red-team L4).
"""

from __future__ import annotations

import time
from collections.abc import Collection

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llm_gateway.admin.context import AdminContext
from llm_gateway.admin.security import CHALLENGE, INVALID_KEY, MISSING_KEY
from llm_gateway.http.direct_cycle import CoalescingCycle

JSON_TYPE = b"application/json"


def presented_token(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The key a request presents, as `require_admin` reads it: `Authorization: Bearer <key>`, else
    `x-api-key: <key>`; b"" when none."""
    bearer = api_key = b""
    for name, value in headers:
        if name == b"authorization" and not bearer:
            scheme, _, credentials = value.partition(b" ")
            if scheme.lower() == b"bearer":
                bearer = credentials.strip()
        elif name == b"x-api-key" and not api_key:
            api_key = value.strip()
    return bearer or api_key


def _refusal(code: str, message: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}})
    headers = [
        (b"content-type", JSON_TYPE),
        (b"content-length", b"%d" % len(body)),
        (b"www-authenticate", CHALLENGE.encode()),
        (b"connection", b"close"),
    ]
    return body, headers


_MISSING = _refusal("missing_api_key", MISSING_KEY)
_INVALID = _refusal("invalid_api_key", INVALID_KEY)


class AdminGate:
    """In front of the admin app: the admin key checked from the headers, then one access line per request."""

    def __init__(self, app: ASGIApp, ctx: AdminContext, public_paths: Collection[str]) -> None:
        self.app = app
        self.ctx = ctx
        self.public = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 0

        async def traced(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        admin: str | None = None
        failure: str | None = None
        try:
            if scope["path"] in self.public:
                await self.app(scope, receive, traced)
                return
            token = presented_token(scope["headers"])
            if token:
                ctx = self.ctx
                admin = ctx.admin_keys.lookup(ctx.gw.runtime.config.admin, token)
            if admin is None:
                failure = "invalid_api_key" if token else "missing_api_key"
                body, headers = _INVALID if token else _MISSING
                await traced({"type": "http.response.start", "status": 401, "headers": list(headers)})
                await traced({"type": "http.response.body", "body": body})
                return
            cycle = getattr(send, "__self__", None)  # the server's own cycle, when the app is served directly
            if isinstance(cycle, CoalescingCycle):
                cycle.authenticated()
            await self.app(scope, receive, traced)
        finally:
            self._trace(scope, status, admin, failure, time.perf_counter() - t0)

    def _trace(self, scope: Scope, status: int, admin: str | None, failure: str | None, took: float) -> None:
        gw = self.ctx.gw
        method = scope["method"]
        metrics = gw.metrics
        metrics.admin_requests.labels(f"{status // 100}xx" if status else "none").inc()
        if failure is not None:
            metrics.admin_auth_failures.labels(failure).inc()
        client = scope.get("client")
        fields = {
            "method": method,
            "path": scope["path"][:200],
            "status": status or 499,  # 0: the client left before any answer
            "admin": admin,
            "client": client[0] if client else None,
            "duration_ms": round(took * 1000, 2),
        }
        if failure is not None:
            fields["auth_failure"] = failure
        gw.access.emit(fields)
