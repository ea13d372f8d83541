"""llama.cpp ``llama-server``: cpp-httplib heads, nlohmann JSON, OpenAI routes + natives.

Middleware order as in server-http.cpp: loading state (503 "Loading model", except model
listings) before API-key check (Bearer or X-Api-Key; public: health, model listings, /)
before routing (unknown routes and wrong methods: 404 "File Not Found"). Errors close the
connection (``Connection: close``). Streams start only once the first token exists; an
error after that is ``data: {"error":...}`` with no ``[DONE]``. Default behaviour is the
captured newer build; ``llama_legacy`` switches to @aa6192d (chat-body parse errors 500).
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from llm_gateway_emulators import textgen
from llm_gateway_emulators.engine import Engine
from llm_gateway_emulators.engines import llama_info
from llm_gateway_emulators.engines.llama_stream import LlamaStream, timings, usage
from llm_gateway_emulators.httpserver import Request, reason
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}
#: Paths open without a key. The captured build (41_emb_models_no_key) protects the model
#: listings; @aa6192d (``llama_legacy``) left /models, /v1/models and /api/tags open.
PUBLIC = frozenset({"/health", "/v1/health", "/"})
PUBLIC_LEGACY = PUBLIC | {"/models", "/v1/models", "/api/tags"}
LOADING_PAGE = b"<html><body>Loading model</body></html>"
J = "application/json; charset=utf-8"


class LlamaServer(Engine):
    name = "llama-server"
    headers_after_first_token = True

    def setup(self) -> None:
        self.n_tokens_max = 0
        for p in ("/health", "/v1/health"):
            self.route("GET", p, self.health)
        for p in ("/v1/models", "/models", "/api/tags"):
            self.route("GET", p, self.models)
        self.route("GET,POST", "/props", self.props)
        self.route("GET", "/slots", self.slots)
        self.route("GET", "/metrics", self.metrics)
        for p in ("/v1/chat/completions", "/chat/completions", "/api/chat"):
            self.route("POST", p, self.chat, inference=True)
        self.route("POST", "/v1/completions", self.completions, inference=True)
        self.route("POST", "/v1/embeddings", self.embeddings, inference=True)
        self.route("POST", "/tokenize", self.tokenize)

    def heads(
        self,
        req: Request,
        ctype: str,
        length: int | None,
        sse: bool = False,
        close: bool = False,
        extra: list[tuple[str, str]] | None = None,
    ) -> list[tuple[str, str]]:
        h = [("Server", "llama.cpp"), ("Access-Control-Allow-Origin", req.headers.get("origin", "")), *(extra or [])]
        if sse:
            h.append(("X-Accel-Buffering", "no"))
        h.append(("Content-Type", ctype))
        h.append(("Content-Length", str(length)) if length is not None else ("Transfer-Encoding", "chunked"))
        remaining = 100 - req.conn.requests_served
        if close or remaining <= 1 or not req.keep_alive:
            h.append(("Connection", "close"))
        else:
            timeout = self.cfg.keepalive_timeout_s or 5
            h.append(("Keep-Alive", f"timeout={int(timeout)}, max={remaining}"))
        return h

    def json_reply(self, req: Request, status: int, obj: Any, extra: list[tuple[str, str]] | None = None) -> Reply:
        body = obj if isinstance(obj, bytes) else orjson.dumps(obj)
        return status, self.heads(req, J, len(body), close=status >= 400, extra=extra), body

    def err(self, req: Request, status: int, message: str, etype: str | None = None, **more: Any) -> Reply:
        e = {"code": status, "message": message, "type": etype or ERROR_TYPES.get(status, "server_error"), **more}
        return self.json_reply(req, status, {"error": e})

    def status_error(self, req: Request, code: int) -> Reply:
        msg = {503: "Loading model", 401: "Invalid API Key", 404: "File Not Found"}.get(code)
        return self.err(req, code, msg or reason(code))

    # ---- middleware ------------------------------------------------------------------
    async def handle(self, req: Request) -> None:
        if self.rt.loading() and req.method != "OPTIONS":
            if req.path in ("/models", "/v1/models", "/api/tags"):
                pass
            elif req.path == "/" or req.path.endswith(".html"):
                await req.send(
                    503, self.heads(req, "text/html; charset=utf-8", len(LOADING_PAGE), close=True), LOADING_PAGE
                )
                return
            else:
                body = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
                await self.reply(req, self.json_reply(req, 503, body))
                return
        public = PUBLIC_LEGACY if self.cfg.llama_legacy else PUBLIC
        if self.cfg.api_key and req.method != "OPTIONS" and req.path not in public:
            key = self.bearer(req) or req.headers.get("x-api-key")
            if key != self.cfg.api_key:
                body = b'{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
                await self.reply(req, self.json_reply(req, 401, body))
                return
        entry = self.lookup(req)
        if isinstance(entry, str):
            body = b'{"error":{"message":"File Not Found","type":"not_found_error","code":404}}'
            await self.reply(req, self.json_reply(req, 404, body))
            return
        await self.call(req, entry)

    # ---- informational routes ---------------------------------------------------------
    async def health(self, req: Request) -> None:
        if self.cfg.health == "unhealthy":
            body = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
            await self.reply(req, self.json_reply(req, 503, body))
            return
        await self.reply(req, self.json_reply(req, 200, b'{"status":"ok"}'))

    async def models(self, req: Request) -> None:
        obj = llama_info.models(self.cfg.model, self.now(), self.cfg.ctx_len, self.rt.loading())
        await self.reply(req, self.json_reply(req, 200, obj))

    async def props(self, req: Request) -> None:
        obj = llama_info.props(self.cfg.model, self.cfg.slots, self.cfg.ctx_len, self.cfg.metrics)
        await self.reply(req, self.json_reply(req, 200, obj))

    async def slots(self, req: Request) -> None:
        if req.query.get("fail_on_no_slot") not in (None, "", "0", "false") and self.pool.running >= self.cfg.slots:
            await self.reply(req, self.err(req, 503, "no slot available"))
            return
        obj = llama_info.slots(self.cfg.slots, self.cfg.ctx_len, self.pool.busy)
        await self.reply(req, self.json_reply(req, 200, obj))

    async def metrics(self, req: Request) -> None:
        if not self.cfg.metrics:
            msg = "This server does not support metrics endpoint. Start it with `--metrics`"
            await self.reply(req, self.err(req, 501, msg))
            return
        h, s = self.rt.hist, self.stats
        prompt_s, gen_s = h["ttft"].sum, max(0.0, h["e2e"].sum - h["ttft"].sum)
        values: dict[str, float] = {
            "prompt_tokens_total": s.prompt_tokens_total,
            "prompt_tokens_cached_total": 0,
            "prompt_seconds_total": prompt_s,
            "tokens_predicted_total": s.tokens_generated_total,
            "tokens_predicted_seconds_total": gen_s,
            "n_decode_total": s.tokens_generated_total,
            "n_tokens_max": self.n_tokens_max,
            "prompt_tokens_seconds": s.prompt_tokens_total / prompt_s if prompt_s > 0 else 0,
            "predicted_tokens_seconds": s.tokens_generated_total / gen_s if gen_s > 0 else 0,
            "requests_processing": self.pool.running,
            "requests_deferred": self.pool.reported_waiting(),
            "n_busy_slots_per_decode": float(self.pool.running),
        }
        body = llama_info.metrics_text(values)
        extra = [("Process-Start-Time-Unix", str(int(self.rt.started_wall)))]
        await req.send(200, self.heads(req, "text/plain; version=0.0.4", len(body), extra=extra), body)

    async def tokenize(self, req: Request) -> None:
        body, _ = self.parse_json(req)
        content = body.get("content", "") if isinstance(body, dict) else ""
        n = textgen.text_tokens(content if isinstance(content, str) else "")
        await self.reply(req, self.json_reply(req, 200, {"tokens": [textgen.token_id(i) for i in range(n)]}))

    # ---- inference -------------------------------------------------------------------
    def _parse_error(self, req: Request, exc: json.JSONDecodeError) -> Reply:
        what = "unexpected end of input" if exc.pos >= len(exc.doc) - 1 else "syntax error"
        msg = (
            f"[json.exception.parse_error.101] parse error at line {exc.lineno}, column {exc.colno}: "
            f"syntax error while parsing value - {what}"
        )
        return self.err(req, 500 if self.cfg.llama_legacy else 400, msg)

    def _body_error(self, req: Request, msg: str) -> Reply:
        """Chat-body rejections: 400, or 500 server_error in the legacy build."""
        return self.err(req, 500 if self.cfg.llama_legacy else 400, msg)

    def _job(self, req: Request, body: dict[str, Any], chat: bool, prompt_tokens: int) -> InferenceJob | Reply:
        if prompt_tokens > self.cfg.ctx_len:
            msg = (
                f"request ({prompt_tokens} tokens) exceeds the available context size "
                f"({self.cfg.ctx_len} tokens), try increasing it"
            )
            return self.err(
                req, 400, msg, "exceed_context_size_error", n_prompt_tokens=prompt_tokens, n_ctx=self.cfg.ctx_len
            )
        requested = body.get("n_predict")
        if requested is None or requested == -1:
            requested = None if self.cfg.llama_legacy else body.get("max_completion_tokens")
            requested = body.get("max_tokens") if requested is None else requested
        limit, finish = self.limit_for(requested)
        room = self.cfg.ctx_len - prompt_tokens
        if limit > room:
            limit, finish = room, "length"
        self.n_tokens_max = max(self.n_tokens_max, prompt_tokens + limit)
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage") is True
        fmt = LlamaStream(self, req, chat, include_usage) if stream else None
        return InferenceJob(
            stream=stream,
            limit=limit,
            finish_at_limit=finish,
            stops=textgen.stop_list(body.get("stop")),
            prompt_tokens=prompt_tokens,
            fmt=fmt,
            reasoning=chat,
            body=(lambda res: self._chat_body(req, res)) if chat else (lambda res: self._cmpl_body(req, res)),
            error_reply=lambda: self.err(req, 500, "Generation failed (emulated engine fault)"),
            effective={
                "max_tokens": limit,
                "natural_stop": finish == "stop" and requested is None,
                "stream": stream,
                "include_usage": include_usage,
                "stop": body.get("stop"),
            },
        )

    async def chat(self, req: Request) -> None:
        body, exc = self.parse_json(req)
        if exc is not None:
            await self.reply(req, self._parse_error(req, exc))
            return
        if not isinstance(body, dict) or "messages" not in body:
            await self.reply(req, self._body_error(req, "'messages' is required"))
            return
        if not isinstance(body["messages"], list):
            await self.reply(req, self._body_error(req, "Expected 'messages' to be an array"))
            return
        if self.cfg.llama_legacy and body.get("n", 1) != 1:
            await self.reply(req, self._body_error(req, "Only one completion choice is allowed"))
            return
        job = self._job(req, body, True, textgen.chat_prompt_tokens(body["messages"]))
        await (self.reply(req, job) if isinstance(job, tuple) else self.generate(req, job))

    async def completions(self, req: Request) -> None:
        body, exc = self.parse_json(req)
        if exc is not None:
            await self.reply(req, self._parse_error(req, exc))
            return
        if not isinstance(body, dict) or "prompt" not in body:
            await self.reply(req, self.err(req, 400, '"prompt" must be provided'))
            return
        for key, msg in (
            ("echo", "Only no echo is supported"),
            ("best_of", "Only one completion choice is allowed"),
            ("suffix", "Suffix is not supported"),
        ):
            if body.get(key) not in (None, False) and not (key == "best_of" and body.get(key) == 1):
                await self.reply(req, self.err(req, 400, msg))
                return
        job = self._job(req, body, False, textgen.prompt_tokens(body["prompt"]))
        await (self.reply(req, job) if isinstance(job, tuple) else self.generate(req, job))

    def _chat_body(self, req: Request, res: Result) -> Reply:
        n = self.parse_json(req)[0].get("n", 1)
        message: dict[str, Any] = {"role": "assistant", "content": res.text}
        if res.reasoning:
            message["reasoning_content"] = res.reasoning
        choices = [
            {"finish_reason": res.finish, "index": i, "message": message}
            for i in range(n if isinstance(n, int) and n > 1 else 1)
        ]
        obj = {
            "choices": choices,
            "created": self.now(),
            "model": self.cfg.model,
            "system_fingerprint": llama_info.BUILD,
            "object": "chat.completion",
            "usage": usage(res),
            "id": "chatcmpl-" + textgen.rand_alnum(32),
            "timings": timings(res),
        }
        return self.json_reply(req, 200, obj)

    def _cmpl_body(self, req: Request, res: Result) -> Reply:
        obj = {
            "choices": [{"text": res.text, "index": 0, "logprobs": None, "finish_reason": res.finish}],
            "created": self.now(),
            "model": self.cfg.model,
            "system_fingerprint": llama_info.BUILD,
            "object": "text_completion",
            "usage": usage(res),
            "id": "chatcmpl-" + textgen.rand_alnum(32),
            "timings": timings(res),
        }
        return self.json_reply(req, 200, obj)

    async def embeddings(self, req: Request) -> None:
        if not self.cfg.embeddings:
            msg = "This server does not support embeddings. Start it with `--embeddings`"
            await self.reply(req, self.err(req, 501, msg))
            return
        body, exc = self.parse_json(req)
        if exc is not None or not isinstance(body, dict) or "input" not in body:
            await self.reply(req, self.err(req, 400, '"input" must be provided'))
            return
        texts = textgen.embed_inputs(body["input"])
        b64 = body.get("encoding_format") == "base64"
        tokens = sum(textgen.text_tokens(t) + 3 for t in texts)

        def build(res: Result) -> Reply:
            data = []
            for i, t in enumerate(texts):
                vec = textgen.embedding(t)
                item: dict[str, Any] = {
                    "embedding": textgen.embedding_b64(vec) if b64 else vec,
                    "index": i,
                    "object": "embedding",
                }
                if b64:
                    item["encoding_format"] = "base64"
                data.append(item)
            obj = {
                "model": self.cfg.model,
                "object": "list",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
                "data": data,
            }
            return self.json_reply(req, 200, obj)

        await self.generate(req, InferenceJob.embedding(tokens, build, lambda: self.err(req, 500, "Embedding failed")))
