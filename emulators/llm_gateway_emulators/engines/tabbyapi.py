"""TabbyAPI (ExLlamaV3): FastAPI ``{"detail": ...}`` errors, sse-starlette streams.

Follows theroyallab/tabbyAPI at e632af41eba68abeadc3437c62674360f2f8cbf1 (HEAD): ``common/auth.py``
(``check_api_key``: ``x-api-key``, else ``Authorization: Bearer``; 401 "Invalid API key" / "Please
provide an API key"), ``endpoints/core/router.py`` (/health from ``HealthManager``,
/.well-known/serviceinfo), ``common/model.py`` (``check_model_container``: 503 "No models are
currently loaded."), ``common/networking.py`` (``{"error": {"message", "trace"}}``, the SSE ping
interval), ``endpoints/OAI/router.py`` and ``endpoints/OAI/utils/chat_completion.py`` /
``completion.py`` (streams, ``eos_reason``, the usage chunk).

/health is open and stays 200 ``{"status":"healthy","issues":[]}`` while the model loads;
/v1/model, /props and inference answer 503 "No models are currently loaded." until
``load_delay_s`` has passed. Auth: ``x-api-key`` or ``Authorization: Bearer`` (the admin
key passes too) on everything but /health and /.well-known/serviceinfo; 401 "Invalid API
key" / "Please provide an API key". Validation errors are FastAPI's 422. ``model`` is
ignored. Streams: ``json.dumps`` chunks (spaces after separators), CRLF event separators,
``: ping - <time>`` comments every ``ping_interval_s``, no role chunk; with include_usage
the finish rides the usage chunk; ``[DONE]`` at the end; a mid-stream error is
``data: {"error":{"message":...,"trace":null}}`` with no ``[DONE]``. Non-streamed
responses carry ``usage`` only when ``stream_options.include_usage`` was sent.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from llm_gateway_emulators import textgen
from llm_gateway_emulators.engines.fastapi_base import FastApiEngine, Problem, json_problem
from llm_gateway_emulators.engines.tabby_stream import TabbyStream, eos_reason, usage_of
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result

NOT_LOADED = "No models are currently loaded."
OPEN = ("/health", "/.well-known/serviceinfo")
EOS = {"length": "max_new_tokens"}


class TabbyApi(FastApiEngine):
    name = "tabbyapi"

    def setup(self) -> None:
        self.route("GET", "/health", self.health)
        self.route("GET", "/.well-known/serviceinfo", self.serviceinfo)
        self.route("GET", "/v1/model", self.current_model)
        self.route("GET", "/v1/models", self.model_list)
        self.route("GET", "/v1/model/list", self.model_list)
        self.route("GET", "/props", self.props)
        self.route("GET", "/v1/auth/permission", self.permission)
        self.route("POST", "/v1/chat/completions", self.chat, inference=True)
        self.route("POST", "/v1/completions", self.completions, inference=True)
        self.route("POST", "/v1/embeddings", self.embeddings, inference=True)

    def detail(self, status: int, detail: Any) -> Reply:
        return self.uv_json(status, {"detail": detail})

    def status_error(self, req: Request, code: int) -> Reply:
        if code == 422:
            return self.problem(Problem("missing", ("body", "messages"), "Field required", {}))
        return self.detail(code, {401: "Invalid API key", 503: NOT_LOADED}.get(code, f"Emulated error {code}"))

    def problem(self, p: Problem) -> Reply:
        return self.detail(422, [p.as_dict(list(p.loc))])

    def permission_of(self, req: Request) -> str | None:
        if not self.cfg.api_key and not self.cfg.admin_key:
            return "admin"
        key = req.headers.get("x-admin-key") or req.headers.get("x-api-key") or self.bearer(req)
        if key and key == self.cfg.admin_key:
            return "admin"
        if key and key == self.cfg.api_key:
            return "api"
        return None

    def _auth_error(self, req: Request) -> Reply | None:
        if not self.cfg.api_key and not self.cfg.admin_key:
            return None
        valid = {k for k in (self.cfg.api_key, self.cfg.admin_key) if k}
        if "x-api-key" in req.headers:
            return None if req.headers["x-api-key"] in valid else self.detail(401, "Invalid API key")
        auth = req.headers.get("authorization")
        if auth:
            parts = auth.split(" ")
            if len(parts) < 2 or parts[0].lower() != "bearer" or parts[1] not in valid:
                return self.detail(401, "Invalid API key")
            return None
        return self.detail(401, "Please provide an API key")

    async def handle(self, req: Request) -> None:
        entry = self.lookup(req)
        if isinstance(entry, str):
            await self.no_route(req, entry)
            return
        if req.method == "POST" and req.body:
            _, exc = self.parse_json(req)
            if exc is not None:  # FastAPI reads and decodes the body before running dependencies
                await self.reply(req, self.problem(json_problem(exc)))
                return
        if req.path not in OPEN and req.path != "/v1/auth/permission":
            err = self._auth_error(req)
            if err is not None:
                await self.reply(req, err)
                return
        await self.call(req, entry)

    def loaded(self) -> bool:
        return not self.rt.loading()

    # ---- info routes ------------------------------------------------------------------
    async def health(self, req: Request) -> None:
        if self.cfg.health == "unhealthy":
            issue = {
                "time": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "description": "RuntimeError: generation crashed (emulated)",
            }
            await self.reply(req, self.uv_json(503, {"status": "unhealthy", "issues": [issue]}))
            return
        await self.reply(req, self.uv_json(200, {"status": "healthy", "issues": []}))

    async def serviceinfo(self, req: Request) -> None:
        obj = {
            "version": 0.1,
            "software": {
                "name": "TabbyAPI",
                "repository": "https://github.com/theroyallab/tabbyAPI",
                "homepage": "https://github.com/theroyallab/tabbyAPI",
            },
            "api": {
                "openai": {
                    "name": "OpenAI API",
                    "relative_url": "/v1",
                    "documentation": "https://theroyallab.github.io/tabbyAPI",
                    "version": 1,
                }
            },
        }
        await self.reply(req, self.uv_json(200, obj))

    def card(self) -> dict[str, Any]:
        params = {
            "max_seq_len": self.cfg.ctx_len,
            "cache_size": self.cfg.ctx_len * max(1, self.cfg.slots),
            "cache_mode": "FP16",
            "rope_scale": 1.0,
            "rope_alpha": 1.0,
            "max_batch_size": self.cfg.slots,
            "chunk_size": 2048,
            "prompt_template": "chatml",
            "prompt_template_content": None,
            "use_vision": False,
            "draft": None,
        }
        return {
            "id": self.cfg.model,
            "object": "model",
            "created": int(self.rt.started_wall),
            "owned_by": "tabbyAPI",
            "logging": None,
            "parameters": params,
        }

    async def current_model(self, req: Request) -> None:
        if not self.loaded():
            await self.reply(req, self.detail(503, NOT_LOADED))
            return
        await self.reply(req, self.uv_json(200, self.card()))

    async def model_list(self, req: Request) -> None:
        data = [self.card()] if self.loaded() else []
        await self.reply(req, self.uv_json(200, {"object": "list", "data": data}))

    async def props(self, req: Request) -> None:
        if not self.loaded():
            await self.reply(req, self.detail(503, NOT_LOADED))
            return
        obj = {
            "total_slots": self.cfg.slots,
            "chat_template": "",
            "default_generation_settings": {"n_ctx": self.cfg.ctx_len},
        }
        await self.reply(req, self.uv_json(200, obj))

    async def permission(self, req: Request) -> None:
        perm = self.permission_of(req)
        if perm is None:
            has_key = any(h in req.headers for h in ("x-admin-key", "x-api-key", "authorization"))
            msg = (
                "The provided authentication key is invalid."
                if has_key
                else "The provided authentication key is missing."
            )
            await self.reply(req, self.detail(400, msg))
            return
        await self.reply(req, self.uv_json(200, {"permission": perm}))

    # ---- inference -------------------------------------------------------------------
    async def _run(self, req: Request, chat: bool) -> None:
        body, prob = self.body_problem(req, ("messages",) if chat else ("prompt",), ("messages",) if chat else ())
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        if not self.loaded():
            await self.reply(req, self.detail(503, NOT_LOADED))
            return
        requested = next((body[k] for k in ("max_tokens", "max_completion_tokens", "max_length") if k in body), None)
        limit, finish = self.limit_for(requested)
        stops = textgen.stop_list(body.get("stop", body.get("stop_sequence")))
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage") is True
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body["prompt"])
        n = body.get("n", 1)
        n = n if isinstance(n, int) and n > 1 else 1
        fmt = TabbyStream(self, chat, include_usage) if stream else None
        rid = uuid.uuid4().hex
        what = "Chat completion" if chat else "Completion"
        job = InferenceJob(
            stream=stream,
            limit=limit,
            finish_at_limit=finish,
            stops=stops,
            prompt_tokens=pt,
            reasoning=chat,
            fmt=fmt,
            body=lambda res: self._body(res, chat, include_usage, n),
            error_reply=lambda: self.detail(
                503, f"{what} {rid} aborted. Maybe the model was unloaded? Please check the server console."
            ),
            ping_interval=self.cfg.ping_interval_s if self.cfg.ping_interval_s > 0 else None,
            effective={
                "max_tokens": limit,
                "stream": stream,
                "include_usage": include_usage,
                "stop": stops,
                "model_ignored": body.get("model"),
            },
        )
        await self.generate(req, job)

    async def chat(self, req: Request) -> None:
        await self._run(req, True)

    async def completions(self, req: Request) -> None:
        await self._run(req, False)

    def _body(self, res: Result, chat: bool, include_usage: bool, n: int) -> Reply:
        usage = usage_of(res) if include_usage else None
        eos = eos_reason(res)
        stop_str = res.matched if res.matched is not None else ("</s>" if eos == "stop_token" else None)
        if chat:
            choices: list[dict[str, Any]] = [
                {
                    "index": i,
                    "finish_reason": res.finish,
                    "eos_reason": eos,
                    "stop_str": stop_str,
                    "message": {
                        "role": "assistant",
                        "content": res.text or None,
                        "reasoning_content": res.reasoning or None,
                        "tool_calls": None,
                        "tool_call_id": None,
                    },
                    "logprobs": None,
                }
                for i in range(n)
            ]
            obj: dict[str, Any] = {
                "id": "cmpl-" + uuid.uuid4().hex,
                "choices": choices,
                "created": self.now(),
                "model": self.cfg.model,
                "object": "chat.completion",
                "usage": usage,
            }
        else:
            choices = [
                {"index": i, "finish_reason": res.finish, "eos_reason": eos, "logprobs": None, "text": res.text}
                for i in range(n)
            ]
            obj = {
                "id": "cmpl-" + uuid.uuid4().hex,
                "choices": choices,
                "created": self.now(),
                "model": self.cfg.model,
                "object": "text_completion",
                "usage": usage,
            }
        return self.uv_json(200, obj)

    async def embeddings(self, req: Request) -> None:
        body, prob = self.body_problem(req, ("input",))
        if prob is not None:
            await self.reply(req, self.problem(prob))
            return
        assert body is not None
        if not self.cfg.embeddings or not self.loaded():
            await self.reply(req, self.detail(503, "No embedding models are currently loaded."))
            return
        texts = textgen.embed_inputs(body["input"])
        tokens = sum(textgen.text_tokens(t) for t in texts)
        b64 = body.get("encoding_format") == "base64"

        def build(res: Result) -> Reply:
            data = [
                {"object": "embedding", "embedding": textgen.embedding_b64(v) if b64 else v, "index": i}
                for i, v in enumerate(textgen.embedding(t) for t in texts)
            ]
            obj = {
                "object": "list",
                "data": data,
                "model": self.cfg.model,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
            return self.uv_json(200, obj)

        await self.generate(
            req, InferenceJob.embedding(tokens, build, lambda: self.detail(503, "Embeddings request failed"))
        )
