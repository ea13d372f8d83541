"""Ollama (HEAD fb30760 by default; ``ollama_legacy`` = the captured 0.5.4 build): native API.

Go net/http + gin heads; no auth; the Host guard (a loopback-bound server answers 403
with an empty body unless Host is loopback/private/unspecified, ``localhost``, the
machine's hostname or ends ``.localhost``/``.local``/``.internal``). It serves ``model`` and
``extra_models``. No loading state: a model loads lazily on its first inference request, which
waits ``load_delay_s`` and reports it as ``load_duration``; /api/ps lists the models loaded; with
``max_loaded_models`` (OLLAMA_MAX_LOADED_MODELS) loaded, a request for another unloads one first
(server/sched.go's rules, in ``ollama_sched``). Native
endpoints stream NDJSON by default; the final object has ``done: true``, ``done_reason``
and nanosecond durations; a mid-stream error is an ``{"error": ...}`` line with status 200.
``max_queue`` is OLLAMA_MAX_QUEUE (503 "server busy" beyond it). The ``/v1`` layer lives
in ``ollama_v1``.

The native inference routes (``/api/chat``, ``/api/generate``, ``/api/embed``: prompt truncation,
``logprobs``) live in ``ollama_native``, HEAD's logprobs in ``ollama_logprobs``; this module owns
the engine: its routes table, replies, model bookkeeping (names, digests, runners) and the
informational routes (``/``, ``/api/version``, ``/api/tags``, ``/api/ps``, ``/api/show``).
"""

from __future__ import annotations

from typing import Any

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engine import Engine
from llm_gateway_emulators.engines.ollama_logprobs import split_tokens, token_logprobs
from llm_gateway_emulators.engines.ollama_names import DETAILS, digest_of, full_name
from llm_gateway_emulators.engines.ollama_native import OllamaNative
from llm_gateway_emulators.engines.ollama_sched import Runner, Scheduler
from llm_gateway_emulators.engines.ollama_stream import allowed_host, go_json
from llm_gateway_emulators.engines.ollama_v1 import BUSY, OllamaV1, go_json_error
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result, StreamFormat

JSON_UTF8 = "application/json; charset=utf-8"


class Ollama(Engine):
    name = "ollama"
    headers_after_first_token = True
    default_keepalive_s = None

    def setup(self) -> None:
        self.v1 = OllamaV1(self)
        self.native = OllamaNative(self)
        self.sched = Scheduler(self.cfg)
        self.route("GET,HEAD", "/", self.root)
        self.route("GET,HEAD", "/api/version", self.version)
        self.route("GET,HEAD", "/api/tags", self.tags)
        self.route("GET", "/api/ps", self.ps)
        self.route("POST", "/api/show", self.show)
        self.route("POST", "/api/chat", self.native.chat, inference=True)
        self.route("POST", "/api/generate", self.native.generate, inference=True)
        self.route("POST", "/api/embed", self.native.embed, inference=True)
        self.route("POST", "/api/embeddings", self.native.embed, inference=True)
        self.v1.setup()

    def on_start(self) -> None:
        self.sched.reset()

    @property
    def canonical(self) -> str:
        return full_name(self.cfg.model)

    @property
    def served(self) -> list[str]:
        """Every model it serves (``model`` first), by full name."""
        names = [self.canonical]
        names += [n for n in map(full_name, self.cfg.extra_models) if n not in names]
        return names

    def known(self, name: Any) -> bool:
        return isinstance(name, str) and full_name(name) in self.served

    def version_str(self) -> str:
        return self.cfg.version or ("0.5.4-ipexllm-20250407" if self.cfg.ollama_legacy else "0.13.5")

    # ---- replies -----------------------------------------------------------------------
    def jr(self, status: int, obj: Any, ctype: str = JSON_UTF8, newline: bool = False) -> Reply:
        body = obj if isinstance(obj, bytes) else go_json(obj)
        if newline:
            body += b"\n"
        return status, wire.go(self.dates.now(), [("Content-Type", ctype)], len(body)), body

    def err(self, status: int, message: str) -> Reply:
        return self.jr(status, {"error": message})

    def status_error(self, req: Request, code: int) -> Reply:
        if req.path.startswith("/v1/"):
            return self.v1.err(code, BUSY if code == 503 else f"emulated error {code}")
        return self.err(code, BUSY if code == 503 else f"emulated error {code}")

    def not_found_model(self, name: str) -> str:
        return f'model "{name}" not found, try pulling it first'

    async def handle(self, req: Request) -> None:
        if self.rt.is_loopback_bind() and not allowed_host(req.headers.get("host", "")):
            await self.reply(req, (403, wire.go(self.dates.now(), [], 0), b""))
            return
        entry = self.lookup(req)
        if isinstance(entry, str):
            if req.path.startswith("/v1/models/") and req.method == "GET":
                await self.v1.model_card(req, req.path[len("/v1/models/") :])
                return
            body = b"404 page not found"
            await self.reply(req, (404, wire.go(self.dates.now(), [("Content-Type", "text/plain")], len(body)), body))
            return
        await self.call(req, entry)

    # ---- model lifecycle ----------------------------------------------------------------
    async def run_on(self, model: str, job: InferenceJob, req: Request) -> None:
        """Run ``job`` on ``model``'s runner: loaded first (maybe evicting another), released after."""
        held: list[Runner] = []

        async def prepare() -> int:
            runner, load_ns = await self.sched.acquire(full_name(model))
            held.append(runner)
            return load_ns or 1_000_000 + textgen.RNG.randrange(200_000)

        job.prepare = prepare
        try:
            await self.generate(req, job)
        finally:
            for runner in held:
                self.sched.release(runner)

    def done_object(
        self, model: str, chat: bool, text: str, res: Result, reason: str | None = None, top: int | None = None
    ) -> dict[str, Any]:
        """The final object; ``top`` (logprobs asked, HEAD): the whole answer's ``logprobs``."""
        obj: dict[str, Any] = {"model": model, "created_at": textgen.go_time()}
        lp = token_logprobs(split_tokens(text), top) if top is not None and text else None
        if chat:
            obj["message"] = {"role": "assistant", "content": text}
            if res.reasoning:
                obj["message"]["thinking"] = res.reasoning
            obj["done_reason"] = reason or res.finish
            obj["done"] = True
            if lp:
                obj["logprobs"] = lp
        else:
            obj["response"] = text
            obj["done"] = True
            obj["done_reason"] = reason or res.finish
            obj["context"] = [textgen.token_id(i) for i in range(min(res.prompt_tokens + res.completion_tokens, 64))]
        obj.update(self.durations(res))
        if lp and not chat:
            obj["logprobs"] = lp
        return obj

    @staticmethod
    def durations(res: Result) -> dict[str, int]:
        return {
            "total_duration": max(1000, int((res.t_end - res.t_arrive) * 1e9) + res.load_ns),
            "load_duration": res.load_ns,
            "prompt_eval_count": res.prompt_tokens,
            "prompt_eval_duration": max(1000, int((res.t_first - res.t_slot) * 1e9)),
            "eval_count": res.completion_tokens,
            "eval_duration": max(1000, int((res.t_end - res.t_first) * 1e9)),
        }

    def job(
        self,
        req: Request,
        *,
        model: str,
        stream: bool,
        limit: Any,
        stops: list[str],
        prompt_tokens: int,
        fmt: StreamFormat | None,
        body: Any,
        error_reply: Any,
        busy: Reply,
        effective: dict[str, Any],
        reasoning: bool = False,
    ) -> InferenceJob:
        lim, finish = self.limit_for(limit if isinstance(limit, int) and limit >= 0 else None)
        lim = min(lim, max(0, self.cfg.ctx_len - prompt_tokens)) if lim > 0 else lim

        async def queue_full(r: Request) -> None:
            await self.reply(r, busy)

        return InferenceJob(
            stream=stream,
            limit=lim,
            finish_at_limit=finish,
            stops=stops,
            prompt_tokens=prompt_tokens,
            fmt=fmt,
            body=body,
            error_reply=error_reply,
            queue_bound=self.cfg.max_queue,
            queue_full=queue_full,
            reasoning=reasoning,
            effective={**effective, "max_tokens": lim, "stream": stream, "model": model},
        )

    # ---- informational routes ------------------------------------------------------------
    async def root(self, req: Request) -> None:
        body = b"Ollama is running"
        head = wire.go(self.dates.now(), [("Content-Type", "text/plain; charset=utf-8")], len(body))
        await req.send(200, head, b"" if req.method == "HEAD" else body)

    async def version(self, req: Request) -> None:
        await self.reply(req, self.jr(200, {"version": self.version_str()}))

    def _tag(self, name: str) -> dict[str, Any]:
        return {
            "name": name,
            "model": name,
            "modified_at": textgen.go_time(int(self.rt.started_wall * 1e9)),
            "size": 564212,
            "digest": digest_of(name, self.canonical),
            "details": DETAILS,
        }

    async def tags(self, req: Request) -> None:
        await self.reply(req, self.jr(200, {"models": [self._tag(n) for n in self.served]}))

    async def ps(self, req: Request) -> None:
        models = []
        for runner in self.sched.listed():
            m: dict[str, Any] = {
                "name": runner.name,
                "model": runner.name,
                "size": 6537216,
                "digest": digest_of(runner.name, self.canonical),
                "details": DETAILS,
                "expires_at": textgen.go_time(int(runner.expires * 1e9)),
                "size_vram": 0,
            }
            if not self.cfg.ollama_legacy:
                m["context_length"] = self.cfg.ctx_len
            models.append(m)
        await self.reply(req, self.jr(200, {"models": models}))

    async def show(self, req: Request) -> None:
        body, exc = self.parse_json(req)
        if exc is not None:
            await self.reply(req, self.err(400, go_json_error(exc)))
            return
        name = (body.get("model") or body.get("name")) if isinstance(body, dict) else None
        if not self.known(name):
            await self.reply(req, self.err(404, self.not_found_model(str(name))))
            return
        obj = {
            "modelfile": f'# Modelfile generated by "ollama show"\nFROM {self.canonical}\n',
            "parameters": f"num_ctx                        {self.cfg.ctx_len}",
            "template": "{{ .Prompt }}",
            "details": DETAILS,
            "model_info": {
                "general.architecture": "llama",
                "general.parameter_count": 137664,
                "llama.context_length": 4096,
                "llama.embedding_length": 64,
            },
            "capabilities": ["completion"],
            "modified_at": self._tag(self.canonical)["modified_at"],
        }
        await self.reply(req, self.jr(200, obj))
