"""What the four FastAPI/uvicorn engines (vLLM, SGLang, TabbyAPI, LMDeploy) share.

uvicorn response heads, Starlette's ``{"detail":"Not Found"}`` / ``{"detail":"Method Not
Allowed"}`` for unknown routes, and pydantic-style request validation: each engine
renders the same validation problems (invalid JSON, a missing field, a wrong type) in its
own envelope, from the ``Problem`` built here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import orjson

from llm_gateway_emulators import wire
from llm_gateway_emulators.engine import Engine
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import Reply


@dataclass
class Problem:
    """One pydantic validation error: type, location, message, input, ctx."""

    type: str
    loc: tuple[Any, ...]
    msg: str
    input: Any
    ctx: dict[str, Any] | None = None

    def as_dict(self, loc: Any) -> dict[str, Any]:
        d: dict[str, Any] = {"type": self.type, "loc": loc, "msg": self.msg, "input": self.input}
        if self.ctx is not None:
            d["ctx"] = self.ctx
        return d

    def fastapi_str(self) -> str:
        """str(RequestValidationError) of recent FastAPI."""
        return f"1 validation error:\n  {self.as_dict(self.loc)!r}"


class FastApiEngine(Engine):
    #: Whether the CORS setup adds ``vary: Origin`` to app responses (vLLM's captures).
    vary_origin = False

    def uv_json(self, status: int, obj: Any, vary: bool | None = None) -> Reply:
        body = obj if isinstance(obj, bytes) else orjson.dumps(obj)
        after = [("vary", "Origin")] if (self.vary_origin if vary is None else vary) else []
        return status, wire.uvicorn_json(self.dates.now(), len(body), after=after), body

    def uv_empty(self, status: int) -> Reply:
        after = [("vary", "Origin")] if self.vary_origin else []
        return status, wire.uvicorn(self.dates.now(), [("content-length", "0"), *after]), b""

    def sse_headers(self, extra: wire.Headers | None = None) -> wire.Headers:
        pairs: wire.Headers = [*(extra or []), ("content-type", "text/event-stream; charset=utf-8")]
        if self.vary_origin:
            pairs.append(("vary", "Origin"))
        return wire.uvicorn(self.dates.now(), pairs, chunked=True)

    async def no_route(self, req: Request, kind: str) -> None:
        if kind == "method":
            await self.reply(req, self.uv_json(405, b'{"detail":"Method Not Allowed"}'))
        else:
            await self.reply(req, self.uv_json(404, b'{"detail":"Not Found"}'))

    # ---- validation ---------------------------------------------------------------------
    def body_problem(
        self, req: Request, required: tuple[str, ...], lists: tuple[str, ...] = ()
    ) -> tuple[dict[str, Any], None] | tuple[None, Problem]:
        """The JSON object body, or the first validation problem pydantic would report."""
        body, exc = self.parse_json(req)
        if exc is not None:
            return None, json_problem(exc)
        if not isinstance(body, dict):
            return None, Problem(
                "model_attributes_type",
                ("body",),
                "Input should be a valid dictionary or object to extract fields from",
                body,
            )
        for name in required:
            if name not in body:
                return None, Problem("missing", ("body", name), "Field required", body)
        for name in lists:
            if name in body and not isinstance(body[name], list):
                return None, Problem("list_type", ("body", name), "Input should be a valid list", body[name])
        return body, None


def json_problem(exc: json.JSONDecodeError) -> Problem:
    return Problem("json_invalid", ("body", exc.pos), "JSON decode error", {}, {"error": exc.msg})
