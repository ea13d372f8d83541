"""The admin API's errors in the gateway's one envelope `{"error": {"message", "type", "param", "code"}}`.

Routes raise `GatewayError`s (the same tree as the data plane); FastAPI's own failures are rendered
the same way: a body that is not JSON is 400 `invalid_json`, a body or query that breaks the schema is
422 `validation_error` with the failing fields (never their values: a pasted secret is not echoed),
an unknown route 404, a wrong method 405, a body past the admin API's limit 413 and one that does not
arrive within `server.body_timeout_s` 408 (`BodyLimit`, before anything reads it whole; the admin key was
checked before, from the headers, by the gate: admin/gate.py). Anything else a route raises
(a bug) is a 500 `internal_error` in the same envelope, never Starlette's plain text; its traceback goes
to the log, not to the client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llm_gateway.errors import GatewayError

JSON_TYPE = "application/json"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


def _render(e: GatewayError, extra: dict[str, Any] | None = None) -> Response:
    body = e.envelope()
    if extra:
        body["error"].update(extra)
    return Response(orjson.dumps(body), status_code=e.status, headers=e.headers, media_type=JSON_TYPE)


async def _gateway_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, GatewayError)
    return _render(e)


async def _validation_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, RequestValidationError)
    errors = list(e.errors())
    if any(err.get("type") == "json_invalid" for err in errors):
        return _render(
            GatewayError(
                "The request body is not valid JSON.", status=400, type_="invalid_request_error", code="invalid_json"
            )
        )
    # the location and the reason only: `input` would echo what was sent (it may be a secret pasted by mistake)
    details = [
        {"loc": [str(p) for p in err.get("loc", ())], "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in errors
    ]
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    param = ".".join(p for p in first["loc"] if p not in ("body", "query", "path")) or None
    message = f"Invalid request: {param or 'body'}: {first['msg']}"
    err = GatewayError(message, status=422, type_="invalid_request_error", code="validation_error", param=param)
    return _render(err, {"details": details})


async def _http_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large"}.get(
        e.status_code, "http_error"
    )
    message = (
        str(e.detail)
        if e.status_code not in (404, 405)
        else (
            f"Unknown admin URL: {request.method} {request.url.path[:200]}"
            if e.status_code == 404
            else f"{request.method} is not allowed on {request.url.path[:200]}"
        )
    )
    err = GatewayError(
        message, status=e.status_code, type_="invalid_request_error", code=code, headers=dict(e.headers or {})
    )
    return _render(err)


async def _unexpected(request: Request, e: Exception) -> Response:
    return _render(
        GatewayError(
            "The admin API failed unexpectedly; see the gateway's log.",
            status=500,
            type_="server_error",
            code="internal_error",
        )
    )


def _too_large(max_bytes: int) -> GatewayError:
    return GatewayError(
        f"The request body is over the admin API's limit of {max_bytes} bytes.",
        status=413,
        type_="invalid_request_error",
        code="request_too_large",
    )


class BodyLimit:
    """Pure ASGI: a declared length past `max_bytes` is answered 413 at once; a streamed body that grows
    past it fails its read with a 413, and one that has not all arrived `timeout_s` after the request
    reached the app fails its read with a 408 (rendered by the handlers above)."""

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float = 60.0) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for k, v in scope["headers"]:
            if k == b"content-length" and (not v.isdigit() or int(v) > self.max_bytes):
                await _render(_too_large(self.max_bytes))(scope, receive, send)
                return
        seen = 0
        body_done = False
        deadline = asyncio.get_running_loop().time() + self.timeout_s

        async def limited() -> Message:
            nonlocal seen, body_done
            if body_done:  # what follows the body (a disconnect) is waited for as long as the route wants
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    msg = await receive()
            except TimeoutError:
                raise HTTPException(408, f"The request body did not arrive within {self.timeout_s:g}s.") from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413)
                body_done = not msg.get("more_body", False)
            return msg

        await self.app(scope, limited, send)


def install(app: FastAPI) -> None:
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected)  # Starlette's outermost: it still logs the traceback
