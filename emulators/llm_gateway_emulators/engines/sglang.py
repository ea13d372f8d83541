"""SGLang (``python -m sglang.launch_server``).

Follows sgl-project/sglang: ``python/sglang/srt/entrypoints/http_server.py``
@0025436eab0556737d615b36a4dd3e1e26e82f3d (/health and /health_generate: 503 while the server is
``Starting`` or shutting down; ``RequestValidationError`` -> 400 ``ErrorResponse`` with type "Bad
Request"; ``HTTPException`` -> flat ``ErrorResponse``), ``add_api_key_middleware`` in
``python/sglang/srt/utils.py`` @0094528c435a44bbcb5c8d755626d15a702b1423 (OPTIONS, /health* and
/metrics pass; otherwise ``Authorization`` must equal ``"Bearer " + key``; 401
``{"error": "Unauthorized"}``), and the shapes of ``python/sglang/srt/entrypoints/openai/protocol.py``
@9b116df. Newer releases moved the key check to ``python/sglang/srt/utils/auth.py``
(@0ce3659c2b55b6fb88c7b8ddf7401c61f8762c90: case-insensitive scheme, ``x-api-key`` accepted, /ready
exempt, admin-key levels, 403 "Forbidden"); the emulator does not play that version.

/health and /health_generate answer 503 (empty) while starting (``load_delay_s``) and 200
(empty) after; /ping is always 200. Auth: ``Authorization`` must equal ``Bearer <key>``
exactly; /health* and /metrics are exempt; 401 ``{"error":"Unauthorized"}``. Errors are
flat ``{"object":"error","message","type","param","code"}``; validation errors are 400
"Bad Request". ``model`` is required but not checked in chat/completions (the response
echoes it); only /v1/models/{model} checks it. Streams: role chunk, pydantic chunks with
null fields, a separate finish chunk with ``matched_stop``, optional usage chunk,
``[DONE]``; a stream error is ``data: {"error": {flat}}`` then ``[DONE]``. /metrics only
with metrics on; ``max_queue`` acts as --max-queued-requests (503 "The request queue is
full."; in-band on streams).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engines import pymetrics
from llm_gateway_emulators.engines.fastapi_base import FastApiEngine, Problem
from llm_gateway_emulators.engines.sglang_stream import FULL, SglangStream, flat
from llm_gateway_emulators.httpserver import Request, reason
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result
from llm_gateway_emulators.prom_text import PROM_CONTENT_TYPE

VERSION = "0.5.23"
EOS_TOKEN_ID = 2


class Sglang(FastApiEngine):
    name = "sglang"
    abort_reason = "abort"  # an aborted request's finish_reason (srt/entrypoints/openai/protocol.py)

    def setup(self) -> None:
        for p in ("/health", "/health_generate"):
            self.route("GET", p, self.health)
        self.route("GET", "/ping", self.ping)
        self.route("GET", "/get_model_info", self.model_info)
        self.route("GET", "/get_server_info", self.server_info)
        self.route("GET", "/get_load", self.get_load)
        self.route("GET", "/v1/models", self.models)
        self.route("POST", "/v1/chat/completions", self.chat, inference=True)
        self.route("POST", "/v1/completions", self.completions, inference=True)
        self.route("POST", "/v1/embeddings", self.embeddings, inference=True)
        self.route("GET", "/metrics", self.metrics)

    def err(self, status: int, message: str, etype: str | None = None, param: str | None = None) -> Reply:
        return self.uv_json(status, flat(status, message, etype or str(status), param))

    def status_error(self, req: Request, code: int) -> Reply:
        if code == 401:
            return self.uv_json(401, b'{"error":"Unauthorized"}')
        if code == 503:
            return self.err(503, FULL)
        return self.err(code, f"{reason(code)} (emulated)", "BadRequestError" if code == 400 else str(code))

    def problem(self, p: Problem) -> Reply:
        text = p.fastapi_str()
        return self.err(400, f"{text} [{p.as_dict(p.loc)!r}]", reason(400))

    def matched(self, res: Result) -> Any:
        if res.finish == "stop":
            return res.matched if res.matched is not None else EOS_TOKEN_ID
        return None

    def usage(self, res: Result) -> dict[str, Any]:
        return {
            "prompt_tokens": res.prompt_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens,
            "completion_tokens": res.completion_tokens,
            "prompt_tokens_details": None,
        }

    async def handle(self, req: Request) -> None:
        exempt = req.method == "OPTIONS" or req.path.startswith(("/health", "/metrics"))
        if self.cfg.api_key and not exempt and req.headers.get("authorization") != f"Bearer {self.cfg.api_key}":
            await self.reply(req, self.uv_json(401, b'{"error":"Unauthorized"}'))
            return
        if req.path == "/metrics" and not self.cfg.metrics:
            await self.no_route(req, "not_found")
            return
        if req.path.startswith("/v1/models/") and req.method in ("GET", "HEAD"):
            await self.model_card(req, req.path[len("/v1/models/") :])
            return
        entry = self.lookup(req)
        if isinstance(entry, str):
            await self.no_route(req, entry)
            return
        await self.call(req, entry)

    # ---- info routes ------------------------------------------------------------------
    async def health(self, req: Request) -> None:
        if self.rt.loading() or self.cfg.health == "unhealthy":
            await self.reply(req, (503, wire.uvicorn(self.dates.now(), [("content-length", "0")]), b""))
            return
        if self.cfg.sglang_health_delay_s > 0:
            await asyncio.sleep(self.cfg.sglang_health_delay_s)
        await self.reply(req, (200, wire.uvicorn(self.dates.now(), [("content-length", "0")]), b""))

    async def ping(self, req: Request) -> None:
        await self.reply(req, (200, wire.uvicorn(self.dates.now(), [("content-length", "0")]), b""))

    def _card(self, model: str) -> dict[str, Any]:
        return {
            "id": model,
            "object": "model",
            "created": self.now(),
            "owned_by": "sglang",
            "root": model,
            "max_model_len": self.cfg.ctx_len,
        }

    async def models(self, req: Request) -> None:
        await self.reply(req, self.uv_json(200, {"object": "list", "data": [self._card(self.cfg.model)]}))

    async def model_card(self, req: Request, model: str) -> None:
        if model != self.cfg.model:
            e = {
                "message": f"The model '{model}' does not exist",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
            await self.reply(req, self.uv_json(404, {"error": e}))
            return
        await self.reply(req, self.uv_json(200, self._card(model)))

    async def model_info(self, req: Request) -> None:
        obj = {
            "model_path": self.cfg.model,
            "tokenizer_path": self.cfg.model,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
        }
        await self.reply(req, self.uv_json(200, obj))

    async def server_info(self, req: Request) -> None:
        c = self.cfg
        obj = {
            "model_path": c.model,
            "tokenizer_path": c.model,
            "served_model_name": c.model,
            "host": self.rt.bind_host,
            "context_length": c.ctx_len,
            "max_running_requests": c.slots,
            "max_queued_requests": c.max_queue,
            "enable_metrics": c.metrics,
            "api_key": c.api_key,
            "is_embedding": c.embeddings,
            "dp_size": 1,
            "tp_size": 1,
            "dtype": "auto",
            "quantization": None,
            "max_total_num_tokens": c.slots * c.ctx_len,
            "internal_states": [{"last_gen_throughput": 0.0, "load": self.pool.running + self.pool.waiting}],
            "version": c.version or VERSION,
        }
        await self.reply(req, self.uv_json(200, obj))

    async def get_load(self, req: Request) -> None:
        w = self.pool.reported_waiting()
        obj = [
            {
                "dp_rank": 0,
                "num_reqs": self.pool.running + w,
                "num_waiting_reqs": w,
                "num_tokens": self.pool.tokens_in_use(),
            }
        ]
        await self.reply(req, self.uv_json(200, obj))

    async def metrics(self, req: Request) -> None:
        body = pymetrics.sglang(self.cfg.model, self.rt.started_wall, self.pool, self.stats, self.rt.hist)
        pairs = [("content-length", str(len(body))), ("content-type", PROM_CONTENT_TYPE)]
        await req.send(200, wire.uvicorn(self.dates.now(), pairs), body)

    # ---- inference -------------------------------------------------------------------
    async def _run(self, req: Request, chat: bool) -> None:
        required = ("messages", "model") if chat else ("model", "prompt")
        body, prob = self.body_problem(req, required, ("messages",) if chat else ())
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        model = str(body["model"])
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body["prompt"])
        if chat:
            requested = body.get("max_completion_tokens")
            requested = body.get("max_tokens") if requested is None else requested
        else:
            requested = body.get("max_tokens", 16)
        if isinstance(requested, int) and requested <= 0 and not chat:
            await self.reply(
                req,
                self.problem(
                    Problem(
                        "value_error", ("body", "max_tokens"), "Value error, max_tokens must be positive", requested
                    )
                ),
            )
            return
        limit, finish = self.limit_for(requested)
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage") is True
        fmt = SglangStream(self, model, chat, include_usage) if stream else None
        n = body.get("n", 1)
        n = n if isinstance(n, int) and n > 1 else 1

        async def queue_full(r: Request) -> None:
            if r.started and fmt is not None:
                await r.write(fmt.queue_full())
                await r.end()
            else:
                await self.reply(r, self.err(503, FULL))

        job = InferenceJob(
            stream=stream,
            limit=limit,
            finish_at_limit=finish,
            stops=textgen.stop_list(body.get("stop")),
            prompt_tokens=pt,
            fmt=fmt,
            reasoning=chat,
            body=lambda res: self._body(res, model, chat, n),
            error_reply=lambda: self.err(
                500, "Internal server error: generation failed (emulated)", "InternalServerError"
            ),
            queue_bound=self.cfg.max_queue,
            queue_full=queue_full,
            effective={
                "max_tokens": limit,
                "stream": stream,
                "include_usage": include_usage,
                "stop": body.get("stop"),
                "model": model,
                "temperature": body.get("temperature", 0.7 if chat else 1.0),
            },
        )
        await self.generate(req, job)

    async def chat(self, req: Request) -> None:
        await self._run(req, True)

    async def completions(self, req: Request) -> None:
        await self._run(req, False)

    def _body(self, res: Result, model: str, chat: bool, n: int) -> Reply:
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
                    "finish_reason": res.finish,
                    "matched_stop": self.matched(res),
                }
                for i in range(n)
            ]
            obj = {
                "id": "chatcmpl-" + uuid.uuid4().hex,
                "object": "chat.completion",
                "created": self.now(),
                "model": model,
                "choices": choices,
                "usage": self.usage(res),
            }
        else:
            choices = [
                {
                    "index": i,
                    "text": res.text,
                    "logprobs": None,
                    "finish_reason": res.finish,
                    "matched_stop": self.matched(res),
                }
                for i in range(n)
            ]
            obj = {
                "id": "cmpl-" + uuid.uuid4().hex,
                "object": "text_completion",
                "created": self.now(),
                "model": model,
                "choices": choices,
                "usage": self.usage(res),
            }
        return self.uv_json(200, obj)

    async def embeddings(self, req: Request) -> None:
        body, prob = self.body_problem(req, ("input",))
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        if not self.cfg.embeddings:
            await self.reply(req, self.err(400, "This model does not support embeddings.", "BadRequestError"))
            return
        texts = textgen.embed_inputs(body["input"])
        tokens = sum(textgen.text_tokens(t) for t in texts)
        model = str(body.get("model", self.cfg.model))

        def build(res: Result) -> Reply:
            data = [{"embedding": textgen.embedding(t), "index": i, "object": "embedding"} for i, t in enumerate(texts)]
            obj = {
                "data": data,
                "model": model,
                "object": "list",
                "usage": {
                    "prompt_tokens": tokens,
                    "total_tokens": tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            }
            return self.uv_json(200, obj)

        await self.generate(req, InferenceJob.embedding(tokens, build, lambda: self.err(500, "Embedding failed")))
