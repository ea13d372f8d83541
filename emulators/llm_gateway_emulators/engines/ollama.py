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

A prompt longer than the context window (``options.num_ctx``, else ``ctx_len``) is cut
and answered 200, its ``prompt_eval_count`` what was kept: 0.5.4 keeps exactly ``num_ctx``
tokens (llama/runner/runner.go ``NewSequence`` @2ddc32d5c5386b28062a46ac6cfea5160cd9f600, and
ignores ``truncate``, ``logprobs``, ``top_logprobs``: its ``ChatRequest`` has none of them); HEAD
keeps ``contextShiftPromptLimit`` of them (llm/llama_server.go ``completionPromptForRequest``
@fb3076099) unless ``truncate: false``, which makes a prompt of ``num_ctx`` tokens or more
(llama-server's own limit) a 400 whose message is llama-server's ``exceed_context_size_error``
body (the same file, ``Completion``: ``api.StatusError`` of the raw body). The emulator
cuts tokens, not whole older messages as ``chatPrompt`` does first.
``/api/embed`` with ``truncate: false`` refuses an input past the window in both (0.5.4
server/routes.go ``EmbedHandler``; HEAD llm/llama_server.go ``normalizeEmbeddingError``). HEAD
returns ``logprobs`` (``[{token, logprob, bytes, top_logprobs?}]``, api/types.go ``Logprob``;
server/logprob.go ``toAPILogprobs``) on each stream line and, concatenated, in a whole answer;
``top_logprobs`` outside 0..20 is a 400 (server/routes.go ``ChatHandler``/``GenerateHandler``).
"""

from __future__ import annotations

import hashlib
from typing import Any

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engine import Engine
from llm_gateway_emulators.engines.ollama_sched import Runner, Scheduler
from llm_gateway_emulators.engines.ollama_stream import NativeStream, allowed_host, go_json
from llm_gateway_emulators.engines.ollama_v1 import BUSY, OllamaV1, go_json_error
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import InferenceJob, Reply, Result, StreamFormat

DIGEST = "df23d3d75cc3d6cc62dc5b936ff8e1862e93a0b3471d8ebc1bcd5fbc55b0d914"
DETAILS = {
    "parent_model": "",
    "format": "gguf",
    "family": "llama",
    "families": ["llama"],
    "parameter_size": "138K",
    "quantization_level": "unknown",
}
JSON_UTF8 = "application/json; charset=utf-8"
NUM_KEEP = 4  # api.DefaultOptions NumKeep


def full_name(name: str) -> str:
    """A model name with its tag (``tiny`` -> ``tiny:latest``)."""
    return name if ":" in name else f"{name}:latest"


def digest_of(name: str, primary: str) -> str:
    """The blob digest: the captured one for the primary model, a stable made-up one for the others."""
    return DIGEST if name == primary else hashlib.sha256(name.encode()).hexdigest()


def kept_prompt(prompt_tokens: int, num_ctx: int, legacy: bool) -> int:
    """The prompt tokens Ollama evaluates of a prompt that may not fit ``num_ctx`` (when it truncates)."""
    if legacy:
        return min(prompt_tokens, num_ctx)  # 0.5.4: ``len(inputs) > numCtx`` keeps exactly numCtx
    if num_ctx <= 1 or prompt_tokens <= num_ctx - 1:
        return prompt_tokens
    keep = max(0, min(NUM_KEEP + 1, num_ctx - 1))  # + BOS
    return num_ctx - max((num_ctx - keep) // 2, 1)  # HEAD: contextShiftPromptLimit


def token_logprobs(tokens: list[str], top: int) -> list[dict[str, Any]]:
    """HEAD's ``logprobs`` entries for ``tokens`` (emulated values: the chosen token is the likeliest)."""
    out: list[dict[str, Any]] = []
    for t in tokens:
        i = textgen.VOCAB.index(t) if t in textgen.VOCAB else 0
        entry: dict[str, Any] = {"token": t, "logprob": -0.25 - (i % 5) * 0.5}
        if t:
            entry["bytes"] = list(t.encode())
        if top > 0:
            alts = [t] + [textgen.VOCAB[(i + k) % len(textgen.VOCAB)] for k in range(1, top)]
            entry["top_logprobs"] = [
                {"token": a, "logprob": entry["logprob"] - k, "bytes": list(a.encode())} for k, a in enumerate(alts)
            ]
        out.append(entry)
    return out


def split_tokens(text: str) -> list[str]:
    """The emulated tokens of generated ``text`` (VOCAB in order from the first; a stop-cut rest as one)."""
    out: list[str] = []
    pos = i = 0
    while pos < len(text):
        t = textgen.token_text(i)
        if not t or not text.startswith(t, pos):
            out.append(text[pos:])
            break
        out.append(t)
        pos += len(t)
        i += 1
    return out


class LogprobStream(NativeStream):
    """HEAD's stream lines with ``logprobs`` (after ``done``, as api.ChatResponse orders its fields)."""

    def __init__(self, eng: Ollama, model: str, chat: bool, top: int) -> None:
        super().__init__(eng, model, chat)
        self.top = top

    def token(self, delta: str) -> bytes:
        line = super().token(delta)
        if not delta:
            return line
        return line[:-2] + b',"logprobs":' + go_json(token_logprobs([delta], self.top)) + b"}\n"


class Ollama(Engine):
    name = "ollama"
    headers_after_first_token = True
    default_keepalive_s = None

    def setup(self) -> None:
        self.v1 = OllamaV1(self)
        self.sched = Scheduler(self.cfg)
        self.route("GET,HEAD", "/", self.root)
        self.route("GET,HEAD", "/api/version", self.version)
        self.route("GET,HEAD", "/api/tags", self.tags)
        self.route("GET", "/api/ps", self.ps)
        self.route("POST", "/api/show", self.show)
        self.route("POST", "/api/chat", self.chat, inference=True)
        self.route("POST", "/api/generate", self.generate_route, inference=True)
        self.route("POST", "/api/embed", self.embed, inference=True)
        self.route("POST", "/api/embeddings", self.embed, inference=True)
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

    # ---- native inference -------------------------------------------------------------
    async def _model(self, req: Request, body: dict[str, Any]) -> str | None:
        """The request's model, or None once the refusal went out (400 when missing, 404 when unknown)."""
        model = body.get("model")
        if not model:
            await self.reply(req, self.err(400, "model is required"))
            return None
        if not self.known(model):
            await self.reply(req, self.err(404, self.not_found_model(str(model))))
            return None
        return str(model)

    async def _native(self, req: Request, chat: bool) -> None:
        body, exc = self.parse_json(req)
        if exc is not None:
            await self.reply(req, self.err(400, go_json_error(exc)))
            return
        if not isinstance(body, dict):
            await self.reply(req, self.err(400, "json: cannot unmarshal value into Go value"))
            return
        model = await self._model(req, body)
        if model is None:
            return
        raw_opts = body.get("options")
        opts: dict[str, Any] = raw_opts if isinstance(raw_opts, dict) else {}
        prompt_empty = not body.get("messages") if chat else not body.get("prompt")
        if prompt_empty:  # load / unload
            ka = body.get("keep_alive")
            unload = ka in (0, "0", "0s", "0m")
            if unload:
                self.sched.unload(full_name(model))
            else:
                self.sched.release((await self.sched.acquire(full_name(model)))[0])
            obj: dict[str, Any] = {"model": model, "created_at": textgen.go_time()}
            if chat:
                obj.update(
                    {
                        "message": {"role": "assistant", "content": ""},
                        "done_reason": "unload" if unload else "load",
                        "done": True,
                    }
                )
            else:
                obj.update({"response": "", "done": True, "done_reason": "unload" if unload else "load"})
            await self.reply(req, self.jr(200, obj))
            return
        legacy = self.cfg.ollama_legacy
        top: int | None = None
        if not legacy and body.get("logprobs") is True:
            top = body.get("top_logprobs") or 0
            if not isinstance(top, int) or not 0 <= top <= 20:
                await self.reply(req, self.err(400, "top_logprobs must be between 0 and 20"))
                return
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body.get("prompt"))
        num_ctx = opts.get("num_ctx")
        num_ctx = num_ctx if isinstance(num_ctx, int) and num_ctx > 0 else self.cfg.ctx_len
        if not legacy and body.get("truncate") is False and pt >= num_ctx:
            lcpp = {
                "error": {
                    "code": 400,
                    "message": f"request ({pt} tokens) exceeds the available context size ({num_ctx} tokens), "
                    "try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": pt,
                    "n_ctx": num_ctx,
                }
            }
            await self.reply(req, self.err(400, go_json(lcpp).decode()))
            return
        pt = kept_prompt(pt, num_ctx, legacy)
        stream = body.get("stream", True) is not False
        fmt: NativeStream | None = None
        if stream:
            fmt = NativeStream(self, model, chat) if top is None else LogprobStream(self, model, chat, top)

        def build(res: Result) -> Reply:
            if res.finish is None:  # repeat abort
                obj: dict[str, Any] = {"model": model, "created_at": textgen.go_time()}
                obj.update({"message": {"role": "assistant", "content": res.text}} if chat else {"response": res.text})
                obj["done"] = False
                return self.jr(200, obj)
            return self.jr(200, self.done_object(model, chat, res.text, res, top=top))

        job = self.job(
            req,
            model=model,
            stream=stream,
            limit=opts.get("num_predict"),
            stops=textgen.stop_list(opts.get("stop")),
            prompt_tokens=pt,
            fmt=fmt,
            body=build,
            error_reply=lambda: self.err(500, "an error was encountered while running the model"),
            busy=self.err(503, BUSY),
            reasoning=chat,
            effective={
                "options": opts,
                "temperature": opts.get("temperature"),
                "stop": opts.get("stop"),
                "keep_alive": body.get("keep_alive"),
                "truncate": None if legacy else body.get("truncate"),
                "logprobs": top,
            },
        )
        await self.run_on(model, job, req)

    async def chat(self, req: Request) -> None:
        await self._native(req, True)

    async def generate_route(self, req: Request) -> None:
        await self._native(req, False)

    async def embed(self, req: Request) -> None:
        body, exc = self.parse_json(req)
        if exc is not None:
            await self.reply(req, self.err(400, go_json_error(exc)))
            return
        body = body if isinstance(body, dict) else {}
        model = await self._model(req, body)
        if model is None:
            return
        legacy = req.path == "/api/embeddings"
        texts = textgen.embed_inputs(body.get("prompt", "") if legacy else body.get("input", ""))
        ctx = self.cfg.ctx_len
        if not legacy and body.get("truncate") is False and any(textgen.text_tokens(t) > ctx for t in texts):
            msg = "input length exceeds maximum context length"
            await self.reply(
                req, self.err(400, msg if self.cfg.ollama_legacy else "the input length exceeds the context length")
            )
            return
        tokens = sum(min(textgen.text_tokens(t), ctx) for t in texts)

        def build(res: Result) -> Reply:
            if legacy:
                return self.jr(200, {"embedding": textgen.embedding(texts[0]) if texts else []})
            d = self.durations(res)
            return self.jr(
                200,
                {
                    "model": model,
                    "embeddings": [textgen.embedding(t) for t in texts],
                    "total_duration": d["total_duration"],
                    "load_duration": d["load_duration"],
                    "prompt_eval_count": tokens,
                },
            )

        await self.run_on(
            model,
            self.job(
                req,
                model=model,
                stream=False,
                limit=0,
                stops=[],
                prompt_tokens=tokens,
                fmt=None,
                body=build,
                error_reply=lambda: self.err(500, "embedding failed"),
                busy=self.err(503, BUSY),
                effective={},
            ),
            req,
        )
