"""What the engines of issue 39 without captures of their own share: an OpenAI server with a few knobs.

trtllm-serve, TGI, MLC LLM, LM Studio and Dynamo's frontend each answer OpenAI's chat and completions
routes with the same chunk shapes (role chunk, one chunk per token, the finish on the last token's
chunk, an optional usage chunk with `choices: []`, `data: [DONE]`) and differ in what this base leaves
to them: their error envelope (`err`), how they check the model and the body (`check`), their health,
model and metrics routes, auth, and the id of the usage chunk. Each engine's module cites the source
every difference is read from. The text, timing and faults are the shared driver's (`Engine.generate`).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engines.fastapi_base import FastApiEngine, Problem
from llm_gateway_emulators.httpserver import Request, reason
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result, StreamFormat


class FamilyStream(StreamFormat):
    """The chunks of one streamed answer (see the module docstring)."""

    def __init__(self, eng: OpenAIFamily, chat: bool, include_usage: bool, prompt_tokens: int) -> None:
        self.eng, self.chat, self.include_usage, self.prompt_tokens = eng, chat, include_usage, prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + textgen.rand_hex(16)
        self.base = {
            "id": self.id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": eng.now(),
            "model": eng.cfg.model,
        }

    def headers(self) -> wire.Headers:
        return self.eng.stream_headers()

    def _ev(self, obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def _choice(self, delta: str, finish: str | None, key: str = "content") -> dict[str, Any]:
        if self.chat:
            return {"index": 0, "delta": {key: delta}, "logprobs": None, "finish_reason": finish}
        return {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}

    def first(self) -> bytes:
        if not self.chat:
            return b""
        return self._ev({**self.base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})

    def token(self, delta: str) -> bytes:
        return self._ev({**self.base, "choices": [self._choice(delta, None)]})

    def reasoning(self, delta: str) -> bytes:
        return self._ev({**self.base, "choices": [self._choice(delta, None, "reasoning_content")]})

    def final(self, delta: str, res: Result) -> bytes:
        out = self._ev({**self.base, "choices": [self._choice(delta, res.finish)]})
        if self.include_usage:
            usage = self.eng.usage(res)
            out += self._ev({**self.base, "id": self.eng.usage_chunk_id(self.id), "choices": [], "usage": usage})
        return out + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        return self.eng.stream_error()


class OpenAIFamily(FastApiEngine):
    """An OpenAI-speaking engine; subclasses set the class attributes and override what differs."""

    owned_by = ""
    #: paths answered by `health` (GET)
    health_paths: tuple[str, ...] = ("/health",)
    #: paths that need the API key when one is set (None: every path but the health ones)
    keyed_paths: frozenset[str] | None = None
    #: does `include_usage` default to true once `stream_options` is sent (trtllm-serve, vLLM)?
    usage_by_default = False
    #: does the engine serve any `model` name (TGI, trtllm-serve)? Else another name is `refuse_model`'s answer
    any_model = False
    #: an axum/hyper server (TGI, Dynamo): `content-type`, `content-length`, `date` heads; empty 404/405 bodies
    hyper = False

    def setup(self) -> None:
        for path in self.health_paths:
            self.route("GET", path, self.health)
        self.route("GET", "/v1/models", self.models)
        self.route("GET", "/metrics", self.metrics)
        self.route("POST", "/v1/chat/completions", self.chat, inference=True)
        self.route("POST", "/v1/completions", self.completions, inference=True)
        self.extra_routes()

    def extra_routes(self) -> None:
        """More routes of the engine's own."""

    # ---- what each engine says its own way --------------------------------------------------
    def err(self, status: int, message: str) -> Reply:
        """The engine's error envelope."""
        raise NotImplementedError

    def stream_error(self) -> bytes:
        """The engine's in-band stream error (and terminator, where it sends one)."""
        raise NotImplementedError

    def card(self) -> dict[str, Any]:
        return {"id": self.cfg.model, "object": "model", "created": self.now(), "owned_by": self.owned_by}

    def metrics_reply(self) -> Reply | None:
        """The `/metrics` answer, or None where the engine has none (its unknown-route answer)."""
        return None

    def serves(self, model: Any) -> bool:
        """Is `model` one this engine answers now (else `refuse_model`'s answer)?"""
        return bool(model == self.cfg.model)

    def refuse_model(self, model: Any) -> Reply:
        return self.err(404, f"The model `{model}` does not exist.")

    def uv_json(self, status: int, obj: Any, vary: bool | None = None) -> Reply:
        if not self.hyper:
            return super().uv_json(status, obj, vary)
        body = obj if isinstance(obj, bytes) else orjson.dumps(obj)
        heads = [("content-type", "application/json"), ("content-length", str(len(body))), ("date", self.dates.now())]
        return status, heads, body

    def uv_empty(self, status: int) -> Reply:
        if not self.hyper:
            return super().uv_empty(status)
        return status, [("content-length", "0"), ("date", self.dates.now())], b""

    async def no_route(self, req: Request, kind: str) -> None:
        if self.hyper:
            await self.reply(req, self.uv_empty(405 if kind == "method" else 404))
        else:
            await super().no_route(req, kind)

    def unauthorized(self) -> Reply:
        return self.err(401, "Unauthorized")

    def usage_chunk_id(self, stream_id: str) -> str:
        return stream_id

    def check(self, body: dict[str, Any], chat: bool) -> Reply | None:
        """The engine's refusal of a body its request model rejects, or None."""
        return None

    def usage(self, res: Result) -> dict[str, Any]:
        return {
            "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens,
        }

    def status_error(self, req: Request, code: int) -> Reply:
        return self.err(code, f"{reason(code)} (emulated)")

    def problem(self, p: Problem) -> Reply:
        loc = ".".join(str(x) for x in p.loc if x != "body")
        return self.err(400, f"{loc}: {p.msg}" if loc else p.msg)

    def stream_headers(self) -> wire.Headers:
        if self.hyper:
            return [
                ("content-type", "text/event-stream"),
                ("cache-control", "no-cache"),
                ("date", self.dates.now()),
                ("transfer-encoding", "chunked"),
            ]
        return self.sse_headers()

    # ---- routing -----------------------------------------------------------------------------
    def needs_key(self, req: Request) -> bool:
        if not self.cfg.api_key or req.method == "OPTIONS":
            return False
        if self.keyed_paths is not None:
            return req.path in self.keyed_paths
        return req.path not in self.health_paths

    async def handle(self, req: Request) -> None:
        if self.needs_key(req) and self.bearer(req) != self.cfg.api_key:
            await self.reply(req, self.unauthorized())
            return
        entry = self.lookup(req)
        if isinstance(entry, str):
            await self.no_route(req, entry)
            return
        await self.call(req, entry)

    async def health(self, req: Request) -> None:
        if self.cfg.health == "unhealthy":
            await self.reply(req, self.err(503, "unhealthy"))
        else:
            await self.reply(req, self.uv_empty(200))

    async def models(self, req: Request) -> None:
        await self.reply(req, self.uv_json(200, {"object": "list", "data": [self.card()]}))

    async def metrics(self, req: Request) -> None:
        r = self.metrics_reply() if self.cfg.metrics else None
        if r is None:
            await self.no_route(req, "not_found")
        else:
            await self.reply(req, r)

    # ---- inference ---------------------------------------------------------------------------
    async def _run(self, req: Request, chat: bool) -> None:
        body, prob = self.body_problem(req, ("messages",) if chat else ("prompt",), ("messages",) if chat else ())
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        refusal = self.check(body, chat)
        if refusal is None and not self.any_model and not self.serves(body.get("model")):
            refusal = self.refuse_model(body.get("model"))
        if refusal is not None:
            await self.reply(req, refusal)
            return
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body["prompt"])
        requested = body.get("max_completion_tokens") if chat else None
        requested = body.get("max_tokens") if requested is None else requested
        limit, finish = self.limit_for(requested)
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage", self.usage_by_default) is True
        job = InferenceJob(
            stream=stream,
            limit=limit,
            finish_at_limit=finish,
            stops=textgen.stop_list(body.get("stop")),
            prompt_tokens=pt,
            fmt=FamilyStream(self, chat, include_usage, pt) if stream else None,
            reasoning=chat,
            body=lambda res: self._body(res, chat),
            error_reply=lambda: self.err(500, "Internal server error"),
            effective={
                "max_tokens": limit,
                "stream": stream,
                "include_usage": include_usage,
                "model": body.get("model"),
            },
        )
        await self.generate(req, job)

    async def chat(self, req: Request) -> None:
        await self._run(req, True)

    async def completions(self, req: Request) -> None:
        await self._run(req, False)

    def _body(self, res: Result, chat: bool) -> Reply:
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": res.text}
            if res.reasoning:
                message["reasoning_content"] = res.reasoning
            choice: dict[str, Any] = {"index": 0, "message": message, "logprobs": None, "finish_reason": res.finish}
        else:
            choice = {"index": 0, "text": res.text, "logprobs": None, "finish_reason": res.finish}
        obj = {
            "id": ("chatcmpl-" if chat else "cmpl-") + textgen.rand_hex(16),
            "object": "chat.completion" if chat else "text_completion",
            "created": self.now(),
            "model": self.cfg.model,
            "choices": [choice],
            "usage": self.usage(res),
        }
        return self.uv_json(200, obj)
