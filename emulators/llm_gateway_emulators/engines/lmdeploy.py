"""LMDeploy (``lmdeploy serve api_server``): flat errors with an int ``code``.

Follows InternLM/lmdeploy at 1263d5cd889b7ad500e85b8eb20401327a4516ab (HEAD, after v0.16.0; the
default): ``lmdeploy/serve/openai/api_server.py``, ``endpoints/management.py`` (/health),
``lmdeploy/serve/openai/errors.py`` and ``lmdeploy/serve/core/exceptions.py`` (error types and
messages), ``lmdeploy/serve/utils/server_utils.py`` (``AuthenticationMiddleware``); with the
``version`` knob, the older releases as their tags have them (below).

/health: ``{"status","message"}``, 200 for healthy/sleeping, 503 for initializing (during
``load_delay_s``) and unhealthy. Auth: Bearer on everything except the /health, /docs,
/redoc and /nodes prefixes (and OPTIONS), 401 ``{"message":"Unauthorized.","type":
"authentication_error","code":401,"param":null,"object":"error"}``. ``model`` must be the
served name (404). /v1/embeddings always 400 "Unsupported by turbomind.". Metrics on by
default (labels model_name, engine). Streams: ``json.dumps`` chunks, every delta with the
role, finish on the last token's chunk, ``"usage": null`` on each chunk when usage was
asked for, then a compact usage chunk and ``[DONE]``; a stream error is
``data: {"error": {flat}}`` followed by ``[DONE]``. While sleeping, inference routes
answer 503 engine_unavailable.

Older releases (``version="0.12.1"`` and the like; None = HEAD), where the answers a gateway probes
differ:

- before 0.14.0 (v0.13.0 @e6948c110e56 and earlier) /health is ``Response(status_code=200)``: a bare
  200 with an empty body, whatever the engine's state, and the port opens only once the model is
  loaded (``uvicorn.run`` comes after the engine is built).
- before 0.12.2 (v0.12.1 @e5df4e8336cd) the key is checked by the ``check_api_key`` dependency of
  the inference and model routes only (not /metrics, /health or /v1/embeddings); a wrong or missing
  key raises FastAPI's ``HTTPException``, so the 401 body is ``{"detail": {"error": {"message":
  "Please request with valid api key!", "type": "invalid_request_error", "param": null, "code":
  "invalid_api_key"}}}``.
- from 0.12.2 to 0.15.x (v0.12.2 @9a50f1f4eaf1 to v0.15.0 @f4b8140ba19c) ``AuthenticationMiddleware``
  already guards every path but the skipped prefixes, answering 401 ``{"error": "Unauthorized"}``.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engines import pymetrics
from llm_gateway_emulators.engines.fastapi_base import FastApiEngine, Problem
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result, StreamFormat
from llm_gateway_emulators.prom_text import PROM_CONTENT_TYPE

SKIP = ("/health", "/docs", "/redoc", "/nodes")
TYPES = {401: "authentication_error", 404: "not_found_error", 503: "server_error"}
MESSAGES = {
    401: "Unauthorized.",
    404: "The requested model does not exist.",
    409: "The request conflicts with existing server state.",
    499: "The request was cancelled.",
    503: "The inference engine is unavailable.",
    500: "An internal server error occurred.",
}
SLEEPING = "Engine is sleeping; call POST /wakeup before inference (e.g. tags=weights&tags=kv_cache)."
INFERENCE = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/generate")

#: Releases where behaviour changed (the first release with the new behaviour).
AUTH_MIDDLEWARE = (0, 12, 2)  # AuthenticationMiddleware replaces the check_api_key dependency
FLAT_401 = (0, 16, 0)  # the middleware answers with the protocol's flat error
HEALTH_STATE = (0, 14, 0)  # /health reports the health monitor's state
#: Before AUTH_MIDDLEWARE: the routes with ``dependencies=[Depends(check_api_key)]`` that this emulator serves.
KEYED_ROUTES = frozenset({"/v1/models", "/v1/chat/completions", "/v1/completions", "/is_sleeping", "/generate"})
LEGACY_401 = {
    "detail": {
        "error": {
            "message": "Please request with valid api key!",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
}


def release(version: str | None) -> tuple[int, int, int] | None:
    """``"0.12.1"`` -> (0, 12, 1); None (or a string that names no release) -> None, i.e. HEAD."""
    m = re.match(r"v?(\d+)\.(\d+)(?:\.(\d+))?", version or "")
    return (int(m[1]), int(m[2]), int(m[3] or 0)) if m else None


def flat(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    etype = TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"message": message, "type": etype, "code": status, "param": param, "object": "error"}


class LmStream(StreamFormat):
    def __init__(self, eng: LmDeploy, chat: bool, include_usage: bool) -> None:
        self.eng, self.chat, self.include_usage = eng, chat, include_usage
        self.rid = ("chatcmpl-" if chat else "cmpl-") + textgen.rand_alnum(22)
        self.base = {
            "id": self.rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": eng.now(),
            "model": eng.cfg.model,
        }

    def headers(self) -> wire.Headers:
        return self.eng.sse_headers()

    def _ev(self, delta: str, finish: str | None) -> bytes:
        choice: dict[str, Any] = (
            {"index": 0, "delta": {"role": "assistant", "content": delta}} if self.chat else {"index": 0, "text": delta}
        )
        if finish is not None:
            choice["finish_reason"] = finish
        d: dict[str, Any] = {**self.base, "choices": [choice]}
        if self.include_usage:
            d["usage"] = None
        return b"data: " + wire.pyjson(d) + b"\n\n"

    def token(self, delta: str) -> bytes:
        return self._ev(delta, None)

    def reasoning(self, delta: str) -> bytes:
        choice = {"index": 0, "delta": {"role": "assistant", "reasoning_content": delta}}
        d: dict[str, Any] = {**self.base, "choices": [choice]}
        if self.include_usage:
            d["usage"] = None
        return b"data: " + wire.pyjson(d) + b"\n\n"

    def final(self, delta: str, res: Result) -> bytes:
        out = self._ev(delta, res.finish)
        if self.include_usage:
            out += b"data: " + orjson.dumps({**self.base, "choices": [], "usage": self.eng.usage(res, False)}) + b"\n\n"
        return out + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        return b"data: " + wire.pyjson({"error": flat(500, MESSAGES[500])}) + b"\n\ndata: [DONE]\n\n"


class LmDeploy(FastApiEngine):
    name = "lmdeploy"
    abort_reason = "abort"  # a cancelled session (ResponseType.CANCEL, lmdeploy/serve/core/async_engine.py)

    def setup(self) -> None:
        self.route("GET", "/health", self.health)
        self.route("GET", "/is_sleeping", self.is_sleeping)
        self.route("GET", "/metrics", self.metrics)
        self.route("GET", "/v1/models", self.models)
        self.route("POST", "/v1/chat/completions", self.chat, inference=True)
        self.route("POST", "/v1/completions", self.completions, inference=True)
        self.route("POST", "/v1/embeddings", self.embeddings, inference=True)

    def err(self, status: int, message: str | None = None, param: str | None = None) -> Reply:
        return self.uv_json(status, flat(status, message or MESSAGES.get(status, "The request is invalid."), param))

    def status_error(self, req: Request, code: int) -> Reply:
        return self.err(code)

    def problem(self, p: Problem) -> Reply:
        loc = ".".join(str(x) for x in p.loc if x != "body")
        return self.err(400, f"{loc}: {p.msg}" if loc else p.msg)

    def usage(self, res: Result, nulls: bool) -> dict[str, Any]:
        u: dict[str, Any] = {
            "prompt_tokens": res.prompt_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens,
            "completion_tokens": res.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        if nulls:
            u["completion_tokens_details"] = None
        return u

    def before(self, first: tuple[int, int, int]) -> bool:
        """Whether the emulated release predates ``first``."""
        rel = release(self.cfg.version)
        return rel is not None and rel < first

    def on_start(self) -> None:
        # before /health had states, the port opened only once the model was loaded
        self.listen_after_load = self.before(HEALTH_STATE)

    def needs_key(self, req: Request) -> bool:
        if not self.cfg.api_key:
            return False
        if self.before(AUTH_MIDDLEWARE):
            return req.path in KEYED_ROUTES
        return req.method != "OPTIONS" and not req.path.startswith(SKIP)

    def unauthorized(self) -> Reply:
        if self.before(AUTH_MIDDLEWARE):
            return self.uv_json(401, LEGACY_401)  # FastAPI's HTTPException handler: {"detail": ...}
        if self.before(FLAT_401):
            return self.uv_json(401, {"error": "Unauthorized"})
        return self.err(401)

    async def handle(self, req: Request) -> None:
        if self.needs_key(req) and self.bearer(req) != self.cfg.api_key:
            await self.reply(req, self.unauthorized())
            return
        if self.cfg.health == "sleeping" and req.method == "POST" and req.path in INFERENCE:
            await self.reply(req, self.err(503, SLEEPING))
            return
        if req.path == "/metrics" and not self.cfg.metrics:
            await self.no_route(req, "not_found")
            return
        entry = self.lookup(req)
        if isinstance(entry, str):
            await self.no_route(req, entry)
            return
        await self.call(req, entry)

    # ---- info routes ------------------------------------------------------------------
    async def health(self, req: Request) -> None:
        if self.before(HEALTH_STATE):
            await self.reply(req, self.uv_empty(200))  # Response(status_code=200)
            return
        if self.rt.loading():
            data = {"status": "initializing", "message": "Engine health monitor is starting."}
        elif self.cfg.health == "unhealthy":
            data = {"status": "unhealthy", "message": "Backend reported unhealthy."}
        elif self.cfg.health == "sleeping":
            data = {"status": "sleeping", "message": "Engine is sleeping."}
        else:
            data = {"status": "healthy", "message": "Engine is healthy."}
        await self.reply(req, self.uv_json(200 if data["status"] in ("healthy", "sleeping") else 503, data))

    async def is_sleeping(self, req: Request) -> None:
        await self.reply(req, self.uv_json(200, {"is_sleeping": self.cfg.health == "sleeping"}))

    async def models(self, req: Request) -> None:
        now = self.now()
        perm = {
            "id": "modelperm-" + textgen.rand_alnum(22),
            "object": "model_permission",
            "created": now,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": True,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        card = {
            "id": self.cfg.model,
            "object": "model",
            "created": now,
            "owned_by": "lmdeploy",
            "root": self.cfg.model,
            "parent": None,
            "permission": [perm],
        }
        await self.reply(req, self.uv_json(200, {"object": "list", "data": [card]}))

    async def metrics(self, req: Request) -> None:
        body = pymetrics.lmdeploy(self.cfg.model, self.rt.started_wall, self.pool, self.stats, self.rt.hist)
        pairs = [("content-length", str(len(body))), ("content-type", PROM_CONTENT_TYPE)]
        await req.send(200, wire.uvicorn(self.dates.now(), pairs), body)

    # ---- inference -------------------------------------------------------------------
    async def _run(self, req: Request, chat: bool) -> None:
        required = ("model", "messages") if chat else ("model", "prompt")
        body, prob = self.body_problem(req, required)
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        model = body["model"]
        if model != self.cfg.model:
            await self.reply(req, self.err(404, f"The model {model!r} does not exist."))
            return
        if self.rt.loading() or self.cfg.health == "unhealthy":
            await self.reply(req, self.err(503))
            return
        temp = body.get("temperature")
        if isinstance(temp, (int, float)) and not 0 <= temp <= 2:
            await self.reply(req, self.err(400, f"The temperature `{temp}` is invalid, must be in [0, 2]."))
            return
        requested = body.get("max_completion_tokens")
        requested = body.get("max_tokens") if requested is None else requested
        limit, finish = self.limit_for(requested)
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage") is True
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body["prompt"])
        n = body.get("n", 1)
        n = n if isinstance(n, int) and n > 1 else 1
        job = InferenceJob(
            stream=stream,
            limit=limit,
            finish_at_limit=finish,
            stops=textgen.stop_list(body.get("stop")),
            prompt_tokens=pt,
            fmt=LmStream(self, chat, include_usage) if stream else None,
            reasoning=chat,
            body=lambda res: self._body(res, chat, n),
            error_reply=lambda: self.err(500),
            effective={
                "max_tokens": limit,
                "stream": stream,
                "include_usage": include_usage,
                "stop": body.get("stop"),
                "model": model,
            },
        )
        await self.generate(req, job)

    async def chat(self, req: Request) -> None:
        await self._run(req, True)

    async def completions(self, req: Request) -> None:
        await self._run(req, False)

    def _body(self, res: Result, chat: bool, n: int) -> Reply:
        if chat:
            choices: list[dict[str, Any]] = [
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": res.text,
                        "reasoning_content": res.reasoning or None,
                        "tool_calls": None,
                    },
                    "logprobs": None,
                    "output_token_logprobs": None,
                    "finish_reason": res.finish,
                    "output_ids": None,
                    "routed_experts": None,
                }
                for i in range(n)
            ]
            obj: dict[str, Any] = {
                "id": "chatcmpl-" + textgen.rand_alnum(22),
                "object": "chat.completion",
                "created": self.now(),
                "model": self.cfg.model,
                "choices": choices,
                "usage": self.usage(res, True),
                "service_tier": None,
            }
        else:
            choices = [{"index": i, "text": res.text, "logprobs": None, "finish_reason": res.finish} for i in range(n)]
            obj = {
                "id": "cmpl-" + textgen.rand_alnum(22),
                "object": "text_completion",
                "created": self.now(),
                "model": self.cfg.model,
                "choices": choices,
                "usage": self.usage(res, True),
            }
        return self.uv_json(200, obj)

    async def embeddings(self, req: Request) -> None:
        _, prob = self.body_problem(req, ("input",))
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        await self.reply(req, self.err(400, "Unsupported by turbomind."))
