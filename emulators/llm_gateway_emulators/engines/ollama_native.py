"""Ollama's native inference routes: ``/api/chat``, ``/api/generate`` (a load or unload when the prompt
is empty) and ``/api/embed``/``/api/embeddings``, on the engine of ollama.py (its replies, jobs and
runners). Kept apart from the engine's model bookkeeping and informational routes because this is
where the two builds' request handling differs.

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
returns ``logprobs`` on each stream line and, concatenated, in a whole answer (ollama_logprobs.py);
``top_logprobs`` outside 0..20 is a 400 (server/routes.go ``ChatHandler``/``GenerateHandler``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from llm_gateway_emulators import textgen
from llm_gateway_emulators.engines.ollama_logprobs import LogprobStream
from llm_gateway_emulators.engines.ollama_names import full_name
from llm_gateway_emulators.engines.ollama_stream import NativeStream, go_json
from llm_gateway_emulators.engines.ollama_v1 import BUSY, RUN_ERROR, go_json_error
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import Reply, Result

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.ollama import Ollama

NUM_KEEP = 4  # api.DefaultOptions NumKeep


def kept_prompt(prompt_tokens: int, num_ctx: int, legacy: bool) -> int:
    """The prompt tokens Ollama evaluates of a prompt that may not fit ``num_ctx`` (when it truncates)."""
    if legacy:
        return min(prompt_tokens, num_ctx)  # 0.5.4: ``len(inputs) > numCtx`` keeps exactly numCtx
    if num_ctx <= 1 or prompt_tokens <= num_ctx - 1:
        return prompt_tokens
    keep = max(0, min(NUM_KEEP + 1, num_ctx - 1))  # + BOS
    return num_ctx - max((num_ctx - keep) // 2, 1)  # HEAD: contextShiftPromptLimit


class OllamaNative:
    """The native /api inference handlers of one Ollama engine."""

    def __init__(self, eng: Ollama) -> None:
        self.eng = eng

    async def model(self, req: Request, body: dict[str, Any]) -> str | None:
        """The request's model, or None once the refusal went out (400 when missing, 404 when unknown)."""
        eng = self.eng
        model = body.get("model")
        if not model:
            await eng.reply(req, eng.err(400, "model is required"))
            return None
        if not eng.known(model):
            await eng.reply(req, eng.err(404, eng.not_found_model(str(model))))
            return None
        return str(model)

    async def native(self, req: Request, chat: bool) -> None:
        eng = self.eng
        body, exc = eng.parse_json(req)
        if exc is not None:
            await eng.reply(req, eng.err(400, go_json_error(exc)))
            return
        if not isinstance(body, dict):
            await eng.reply(req, eng.err(400, "json: cannot unmarshal value into Go value"))
            return
        model = await self.model(req, body)
        if model is None:
            return
        raw_opts = body.get("options")
        opts: dict[str, Any] = raw_opts if isinstance(raw_opts, dict) else {}
        prompt_empty = not body.get("messages") if chat else not body.get("prompt")
        if prompt_empty:  # load / unload
            ka = body.get("keep_alive")
            unload = ka in (0, "0", "0s", "0m")
            if unload:
                eng.sched.unload(full_name(model))
            else:
                eng.sched.release((await eng.sched.acquire(full_name(model)))[0])
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
            await eng.reply(req, eng.jr(200, obj))
            return
        legacy = eng.cfg.ollama_legacy
        top: int | None = None
        if not legacy and body.get("logprobs") is True:
            top = body.get("top_logprobs") or 0
            if not isinstance(top, int) or not 0 <= top <= 20:
                await eng.reply(req, eng.err(400, "top_logprobs must be between 0 and 20"))
                return
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body.get("prompt"))
        num_ctx = opts.get("num_ctx")
        num_ctx = num_ctx if isinstance(num_ctx, int) and num_ctx > 0 else eng.cfg.ctx_len
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
            await eng.reply(req, eng.err(400, go_json(lcpp).decode()))
            return
        pt = kept_prompt(pt, num_ctx, legacy)
        stream = body.get("stream", True) is not False
        fmt: NativeStream | None = None
        if stream:
            fmt = NativeStream(eng, model, chat) if top is None else LogprobStream(eng, model, chat, top)

        def build(res: Result) -> Reply:
            if res.finish is None:  # repeat abort
                obj: dict[str, Any] = {"model": model, "created_at": textgen.go_time()}
                obj.update({"message": {"role": "assistant", "content": res.text}} if chat else {"response": res.text})
                obj["done"] = False
                return eng.jr(200, obj)
            return eng.jr(200, eng.done_object(model, chat, res.text, res, top=top))

        job = eng.job(
            req,
            model=model,
            stream=stream,
            limit=opts.get("num_predict"),
            stops=textgen.stop_list(opts.get("stop")),
            prompt_tokens=pt,
            fmt=fmt,
            body=build,
            error_reply=lambda: eng.err(500, RUN_ERROR),
            busy=eng.err(503, BUSY),
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
        await eng.run_on(model, job, req)

    async def chat(self, req: Request) -> None:
        await self.native(req, True)

    async def generate(self, req: Request) -> None:
        await self.native(req, False)

    async def embed(self, req: Request) -> None:
        eng = self.eng
        body, exc = eng.parse_json(req)
        if exc is not None:
            await eng.reply(req, eng.err(400, go_json_error(exc)))
            return
        body = body if isinstance(body, dict) else {}
        model = await self.model(req, body)
        if model is None:
            return
        legacy = req.path == "/api/embeddings"
        texts = textgen.embed_inputs(body.get("prompt", "") if legacy else body.get("input", ""))
        ctx = eng.cfg.ctx_len
        if not legacy and body.get("truncate") is False and any(textgen.text_tokens(t) > ctx for t in texts):
            msg = "input length exceeds maximum context length"
            await eng.reply(
                req, eng.err(400, msg if eng.cfg.ollama_legacy else "the input length exceeds the context length")
            )
            return
        tokens = sum(min(textgen.text_tokens(t), ctx) for t in texts)

        def build(res: Result) -> Reply:
            if legacy:
                return eng.jr(200, {"embedding": textgen.embedding(texts[0]) if texts else []})
            d = eng.durations(res)
            return eng.jr(
                200,
                {
                    "model": model,
                    "embeddings": [textgen.embedding(t) for t in texts],
                    "total_duration": d["total_duration"],
                    "load_duration": d["load_duration"],
                    "prompt_eval_count": tokens,
                },
            )

        await eng.run_on(
            model,
            eng.job(
                req,
                model=model,
                stream=False,
                limit=0,
                stops=[],
                prompt_tokens=tokens,
                fmt=None,
                body=build,
                error_reply=lambda: eng.err(500, "embedding failed"),
                busy=eng.err(503, BUSY),
                effective={},
            ),
            req,
        )
