"""vLLM (``vllm serve``, captured 0.32.0): OpenAI routes, /health, /ping, /version, /load; rerank, score and
speech to text in engines/vllm_pooling.py.

The port does not accept connections until the model is loaded (no HTTP loading state).
Auth: Bearer only, on paths starting ``/v1``; 401 ``{"error":"Unauthorized"}``. Errors are
nested with class-like types; validation errors are 400. ``model`` must be the served name
(404 NotFoundError). Streams: role chunk, one chunk per token with ``token_ids``, finish on
the last token's chunk, ``include_usage`` on by default once ``stream_options`` is present,
and a mid-stream error is ``data: {"error": ...}`` followed by ``data: [DONE]``.

Sleep mode (knob ``sleep_mode``), as vllm/entrypoints/serve/dev/sleep/api_router.py at v0.32.0 serves it:
``POST /sleep?level=N`` (0..2, default 1) answers ``{"status":"sleeping","level":N}`` once asleep (what
runs then is not aborted here, unlike vLLM's default ``mode=abort``); ``POST /wake_up`` answers
``{"status":"awake","tags":null}`` after ``wake_delay_s``; ``GET /is_sleeping`` answers
``{"is_sleeping": bool}``. Asleep, the scheduler is paused (vllm/v1/engine/core.py ``sleep``: requests are
accepted but not processed), so inference waits for the wake-up.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engines import pymetrics
from llm_gateway_emulators.engines import vllm_pooling as pooling
from llm_gateway_emulators.engines.fastapi_base import FastApiEngine, Problem
from llm_gateway_emulators.engines.vllm_stream import DEAD, VllmStream
from llm_gateway_emulators.httpserver import Request, reason
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result
from llm_gateway_emulators.prom_text import PROM_CONTENT_TYPE

VERSION = "0.32.0"
INFERENCE_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/embeddings"})
CLASS_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 501: "NotImplementedError"}


def _summary(value: Any) -> Any:
    return f"<dict of {len(value)} items>" if isinstance(value, dict) else value


class Vllm(FastApiEngine):
    name = "vllm"
    abort_reason = "abort"  # FINISH_REASON_STRINGS, vllm/v1/engine/__init__.py
    listen_after_load = True
    vary_origin = True
    #: a fork's own names (Aphrodite): the model card's owner and the metric prefix
    owned_by = "vllm"
    metric_prefix = b"vllm:"

    def setup(self) -> None:
        self.fingerprint = ""
        self.on_start()
        self.route("GET", "/health", self.health)
        self.route("GET,POST", "/ping", self.health)
        self.route("GET", "/version", self.version)
        self.route("GET", "/load", self.load)
        self.route("GET", "/metrics", self.metrics)
        self.route("GET", "/v1/models", self.models)
        self.route("POST", "/v1/chat/completions", self.chat, inference=True)
        self.route("POST", "/v1/completions", self.completions, inference=True)
        self.route("POST", "/v1/embeddings", self.embeddings, inference=True)
        self.route("POST", "/tokenize", self.tokenize)
        self.awake = asyncio.Event()
        self.awake.set()
        self.sleep_level = 0
        if self.cfg.sleep_mode:
            self.route("POST", "/sleep", self.sleep)
            self.route("POST", "/wake_up", self.wake_up)
            self.route("GET", "/is_sleeping", self.is_sleeping)
        # engines/vllm_pooling.py: routes vLLM registers only for a model that serves them
        for path in pooling.RERANK_PATHS if self.cfg.scoring else ():
            self.route("POST", path, partial(pooling.rerank, self), inference=True)
        for path in pooling.SCORE_PATHS if self.cfg.scoring else ():
            self.route("POST", path, partial(pooling.score, self), inference=True)
        for task in ("transcriptions", "translations") if self.cfg.speech else ():
            self.route("POST", f"/v1/audio/{task}", partial(pooling.speech, self, task=task), inference=True)

    def on_start(self) -> None:
        self.fingerprint = f"vllm-{self.cfg.version or VERSION}-{textgen.rand_hex(8)}"

    def err(self, status: int, message: str, etype: str | None = None, param: str | None = None) -> Reply:
        e = {
            "message": message,
            "type": etype or CLASS_TYPES.get(status, reason(status)),
            "param": param,
            "code": status,
        }
        return self.uv_json(status, {"error": e})

    def status_error(self, req: Request, code: int) -> Reply:
        if code == 401:
            return self.uv_json(401, b'{"error":"Unauthorized"}', vary=False)
        return self.err(code, DEAD if code == 500 else f"{reason(code)} (emulated)")

    def problem(self, p: Problem) -> Reply:
        loc = ".".join(str(x) for x in p.loc)
        d = p.as_dict(loc)
        d["input"] = _summary(p.input)
        return self.err(400, f"1 validation error:\n  {d!r}", reason(400), loc)

    async def handle(self, req: Request) -> None:
        guarded = req.path.startswith("/v1") and req.method != "OPTIONS"
        if self.cfg.api_key and guarded and self.bearer(req) != self.cfg.api_key:
            await self.reply(req, self.uv_json(401, b'{"error":"Unauthorized"}', vary=False))
            return
        entry = self.lookup(req)
        if isinstance(entry, str):
            await self.no_route(req, entry)
            return
        if req.path in INFERENCE_PATHS:
            await self.awake.wait()  # asleep: accepted, not scheduled until the wake-up
        await self.call(req, entry)

    # ---- sleep mode -------------------------------------------------------------------
    async def sleep(self, req: Request) -> None:
        try:
            level = int(req.query.get("level", "1"))
        except ValueError:
            level = -1
        if not 0 <= level <= 2:
            await self.reply(req, self.err(400, "level: Input should be between 0 and 2"))
            return
        self.awake.clear()
        self.sleep_level = level
        await self.reply(req, self.uv_json(200, {"status": "sleeping", "level": level}))

    async def wake_up(self, req: Request) -> None:
        if not self.awake.is_set() and self.cfg.wake_delay_s:
            await asyncio.sleep(self.cfg.wake_delay_s)
        self.awake.set()
        await self.reply(req, self.uv_json(200, {"status": "awake", "tags": None}))

    async def is_sleeping(self, req: Request) -> None:
        await self.reply(req, self.uv_json(200, {"is_sleeping": not self.awake.is_set()}))

    # ---- info routes ------------------------------------------------------------------
    async def health(self, req: Request) -> None:
        await self.reply(req, self.uv_empty(503 if self.cfg.health == "unhealthy" else 200))

    async def version(self, req: Request) -> None:
        await self.reply(req, self.uv_json(200, {"version": self.cfg.version or VERSION}))

    async def load(self, req: Request) -> None:
        await self.reply(req, self.uv_json(200, {"server_load": self.pool.running + self.pool.waiting}))

    async def models(self, req: Request) -> None:
        now = self.now()
        card = {
            "id": self.cfg.model,
            "object": "model",
            "created": now,
            "owned_by": self.owned_by,
            "root": f"/models/{self.cfg.model}",
            "parent": None,
            "max_model_len": self.cfg.ctx_len,
            "permission": [
                {
                    "id": "modelperm-" + textgen.rand_hex(16),
                    "object": "model_permission",
                    "created": now,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        await self.reply(req, self.uv_json(200, {"object": "list", "data": [card]}))

    async def tokenize(self, req: Request) -> None:
        body, _ = self.parse_json(req)
        body = body if isinstance(body, dict) else {}
        n = (
            textgen.chat_prompt_tokens(body["messages"])
            if isinstance(body.get("messages"), list)
            else textgen.prompt_tokens(body.get("prompt", ""))
        )
        obj = {
            "count": n,
            "max_model_len": self.cfg.ctx_len,
            "tokens": [textgen.token_id(i) for i in range(n)],
            "token_strs": None,
        }
        await self.reply(req, self.uv_json(200, obj))

    async def metrics(self, req: Request) -> None:
        body = pymetrics.vllm(self.cfg.model, self.rt.started_wall, self.pool, self.stats, self.rt.hist)
        if self.metric_prefix != b"vllm:":
            body = body.replace(b"vllm:", self.metric_prefix)
        pairs = [("content-length", str(len(body))), ("content-type", PROM_CONTENT_TYPE), ("vary", "Origin")]
        await req.send(200, wire.uvicorn(self.dates.now(), pairs), body)

    # ---- inference -------------------------------------------------------------------
    def _common(self, req: Request, body: dict[str, Any], chat: bool, prompt_tokens: int) -> InferenceJob | Reply:
        model = body.get("model")
        if model is not None and model != self.cfg.model:
            return self.err(404, f"The model `{model}` does not exist. Valid aliases: {self.cfg.model}.", param="model")
        temp = body.get("temperature")
        if isinstance(temp, (int, float)) and temp < 0:
            return self.err(
                400,
                f"temperature must be non-negative, got {float(temp)}. (parameter=temperature, value={float(temp)})",
                param="temperature",
            )
        n = body.get("n", 1)
        if isinstance(n, int) and n > 1 and temp == 0:
            return self.err(400, f"n must be 1 when using greedy sampling, got {n}.")
        if self.cfg.health == "unhealthy":
            return self.err(500, DEAD)
        if prompt_tokens > self.cfg.ctx_len:
            return self.err(
                400,
                f"This model's maximum context length is {self.cfg.ctx_len} tokens. However, "
                f"your prompt contains at least {prompt_tokens} input tokens, which exceeds this limit "
                "even without any output tokens. Please reduce the length of the input prompt. "
                f"(parameter=input_tokens, value={prompt_tokens})",
                param="input_tokens",
            )
        requested = body.get("max_completion_tokens") if chat else None
        requested = body.get("max_tokens") if requested is None else requested
        if isinstance(requested, int) and requested > self.cfg.ctx_len:
            return self.err(
                400,
                f"max_tokens={requested} cannot be greater than max_model_len={self.cfg.ctx_len}. "
                f"Please request fewer output tokens. (parameter=max_tokens, value={requested})",
                param="max_tokens",
            )
        limit, finish = self.limit_for(requested)
        if limit > self.cfg.ctx_len - prompt_tokens:
            limit, finish = self.cfg.ctx_len - prompt_tokens, "length"
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage", True) is not False
        continuous = isinstance(so, dict) and bool(so.get("continuous_usage_stats"))
        n_choices = n if isinstance(n, int) and n > 1 else 1
        return InferenceJob(
            stream=stream,
            limit=limit,
            finish_at_limit=finish,
            stops=textgen.stop_list(body.get("stop")),
            prompt_tokens=prompt_tokens,
            fmt=VllmStream(self, chat, include_usage, continuous, prompt_tokens, n_choices) if stream else None,
            reasoning=chat,
            body=(lambda res: self._body(res, chat, n_choices)),
            error_reply=lambda: self.err(500, DEAD),
            effective={
                "max_tokens": limit,
                "stream": stream,
                "include_usage": include_usage,
                "continuous_usage_stats": continuous,
                "stop": body.get("stop"),
                "model": model,
            },
        )

    async def _run(self, req: Request, chat: bool) -> None:
        body, prob = self.body_problem(req, ("messages",) if chat else ("prompt",), ("messages",) if chat else ())
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body["prompt"])
        job = self._common(req, body, chat, pt)
        await (self.reply(req, job) if isinstance(job, tuple) else self.generate(req, job))

    async def chat(self, req: Request) -> None:
        await self._run(req, True)

    async def completions(self, req: Request) -> None:
        await self._run(req, False)

    def _body(self, res: Result, chat: bool, n: int) -> Reply:
        # the tokens of every choice: `num_generated_tokens = sum(len(output.token_ids) for output in
        # final_res.outputs)` (vllm/entrypoints/openai/chat_completion/serving.py at 006c49d4)
        completion = res.completion_tokens * n
        usage = {
            "prompt_tokens": res.prompt_tokens,
            "total_tokens": res.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        if chat:
            choices = [
                {
                    "index": i,
                    "message": {
                        "role": "assistant",
                        "content": res.text,
                        "refusal": None,
                        "annotations": None,
                        "audio": None,
                        "function_call": None,
                        "reasoning": res.reasoning or None,
                    },
                    "logprobs": None,
                    "finish_reason": res.finish,
                    "stop_reason": res.matched,
                    "token_ids": None,
                    "routed_experts": None,
                }
                for i in range(n)
            ]
            obj: dict[str, Any] = {
                "id": "chatcmpl-" + textgen.rand_hex(16),
                "object": "chat.completion",
                "created": self.now(),
                "model": self.cfg.model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        else:
            choices = [
                {
                    "index": i,
                    "text": res.text,
                    "logprobs": None,
                    "finish_reason": res.finish,
                    "stop_reason": res.matched,
                    "token_ids": None,
                    "prompt_logprobs": None,
                    "prompt_token_ids": None,
                    "routed_experts": None,
                }
                for i in range(n)
            ]
            obj = {
                "id": "cmpl-" + textgen.rand_hex(16),
                "object": "text_completion",
                "created": self.now(),
                "model": self.cfg.model,
                "choices": choices,
                "service_tier": None,
                "system_fingerprint": self.fingerprint,
                "usage": usage,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        return self.uv_json(200, obj)

    async def embeddings(self, req: Request) -> None:
        if not self.cfg.embeddings:
            await self.no_route(req, "not_found")
            return
        body, prob = self.body_problem(req, ("input",))
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        model = body.get("model")
        if model is not None and model != self.cfg.model:
            await self.reply(
                req,
                self.err(404, f"The model `{model}` does not exist. Valid aliases: {self.cfg.model}.", param="model"),
            )
            return
        texts = textgen.embed_inputs(body["input"])
        b64 = body.get("encoding_format") == "base64"
        tokens = sum(textgen.text_tokens(t) for t in texts)

        def build(res: Result) -> Reply:
            data = [
                {"index": i, "object": "embedding", "embedding": (textgen.embedding_b64(v) if b64 else v)}
                for i, v in enumerate(textgen.embedding(t) for t in texts)
            ]
            obj = {
                "id": "embd-" + textgen.rand_hex(32),
                "object": "list",
                "created": self.now(),
                "model": self.cfg.model,
                "data": data,
                "usage": {
                    "prompt_tokens": tokens,
                    "total_tokens": tokens,
                    "completion_tokens": 0,
                    "prompt_tokens_details": None,
                },
            }
            return self.uv_json(200, obj)

        await self.generate(req, InferenceJob.embedding(tokens, build, lambda: self.err(500, DEAD)))
