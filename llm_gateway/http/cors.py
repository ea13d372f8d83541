"""CORS for browser clients (`server.cors`): preflight answers and the allow-origin headers of answers.

Off while `allow_origins` is empty: then `GatewayApp` holds no `Cors` and pays one attribute check per
request. On, a request with an `Origin` header from an allowed origin gets `Access-Control-Allow-Origin`
(and `Vary: Origin`, unless any origin is allowed) plus `Access-Control-Expose-Headers` on its answer,
whatever it is: success, error or stream, since the headers are added where the answer starts. A
preflight (`OPTIONS` with `Access-Control-Request-Method`) on a route is answered 204 with the methods
the route serves, the allowed request headers and the max age; from an origin not allowed, 403.
No credentials mode: keys travel in the Authorization or x-api-key header, never in cookies.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from llm_gateway.errors import PermissionDenied
from llm_gateway.http.call import Call, Send
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service.runtime import Runtime
from llm_gateway.settings import CorsConfig

#: answer headers a browser script may read: every header of the gateway's own that an answer can carry (the
#: limits', the budget's included: a browser client has no other way to see what it has left)
EXPOSED = b", ".join(
    (
        b"x-request-id",
        b"x-gateway-backend",
        b"x-gateway-engine",
        b"x-gateway-model",
        b"x-gateway-overhead-ms",
        b"x-gateway-token-count",
        b"x-gateway-stored",
        b"x-gateway-reject-reason",
        b"retry-after",
        b"x-ratelimit-limit-requests",
        b"x-ratelimit-remaining-requests",
        b"x-ratelimit-reset-requests",
        b"x-ratelimit-limit-tokens",
        b"x-ratelimit-remaining-tokens",
        b"x-ratelimit-reset-tokens",
        b"x-ratelimit-limit-budget-tokens",
        b"x-ratelimit-remaining-budget-tokens",
        b"x-ratelimit-limit-budget-cost",
        b"x-ratelimit-remaining-budget-cost",
        b"x-ratelimit-reset-budget",
    )
)
Headers = list[tuple[bytes, bytes]]


class Cors:
    """`wrap` adds the allow-origin headers to an answer's start; `preflight` answers a browser's OPTIONS
    (a handler). `methods(path)` names the methods a path serves, None when it is no route."""

    def __init__(self, cfg: CorsConfig, methods: Callable[[str], str | None]) -> None:
        self.any = "*" in cfg.allow_origins
        self.origins = frozenset(o.encode() for o in cfg.allow_origins)
        self.allow_headers = ", ".join(cfg.allow_headers).encode()
        self.max_age = str(cfg.max_age_s).encode()
        self.methods = methods

    def allowed(self, origin: bytes) -> Headers | None:
        """The allow-origin headers for this origin; None when it is not allowed."""
        if self.any:
            return [(b"access-control-allow-origin", b"*")]
        if origin.lower() in self.origins:
            return [(b"access-control-allow-origin", origin), (b"vary", b"origin")]
        return None

    def wrap(self, origin: bytes, send: Send) -> Send:
        extra = self.allowed(origin)
        if extra is None:
            return send
        extra.append((b"access-control-expose-headers", EXPOSED))

        async def cors_send(msg: MutableMapping[str, Any]) -> None:
            if msg["type"] == "http.response.start":
                msg["headers"] = [*msg.get("headers", ()), *extra]
            await send(msg)

        return cors_send

    def preflight_handler(self, path: str) -> Callable[[Any, Call, RequestRecord, Runtime], Awaitable[None]] | None:
        """The preflight handler when `path` is a route; None leaves the request to the router (404)."""
        return self.preflight if self.methods(path) is not None else None

    async def preflight(self, ctx: Any, call: Call, rec: RequestRecord, rt: Runtime) -> None:
        """Answered through the `wrap`ped send, which adds the allow-origin headers."""
        if self.allowed(call.header(b"origin") or b"") is None:
            raise PermissionDenied(
                "This origin may not call the gateway (server.cors).", code="cors_origin_not_allowed"
            )
        headers = [
            (b"access-control-allow-methods", (self.methods(call.scope["path"]) or "").encode()),
            (b"access-control-allow-headers", self.allow_headers),
            (b"access-control-max-age", self.max_age),
            (b"x-request-id", call.rid.encode()),
        ]
        await call.start(204, headers)
        await call.end()
