"""Ollama's OpenAI layer (``/v1/*``), HEAD fb30760 by default, 0.5.4 with ``ollama_legacy``.

Reads only what Ollama maps: ``max_tokens`` (``max_completion_tokens`` is ignored),
``temperature``/``top_p`` forced to 1.0 when absent, ``stop``, ``stream_options``. Ids are
``chatcmpl-<0..998>``, ``system_fingerprint`` is ``fp_ollama``. HEAD streams: the first
chunk carries the role, later chunks only content, then a separate empty-delta finish
chunk, the usage chunk (``include_usage``) and ``[DONE]``; the 0.5.4 build puts the role
on every chunk and finishes with a ``{"role":"assistant","content":""}`` delta. A native
error mid-stream just ends the stream. Errors: ``{"error":{"message","type","param":null,
"code":null}}``.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import Reply, Result, StreamFormat

BUSY = "server busy, please try again.  maximum pending requests exceeded"  # OLLAMA_MAX_QUEUE reached
RUN_ERROR = "an error was encountered while running the model"  # a generation that failed, on either API

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.ollama import Ollama

FP = b'"system_fingerprint":"fp_ollama"'


def _go(obj: Any) -> bytes:
    return orjson.dumps(obj).replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")


def go_json_error(exc: json.JSONDecodeError) -> str:
    rest = exc.doc[exc.pos :].strip() if exc.doc else ""
    if not rest:
        return "unexpected EOF"
    return f"invalid character {rest[0]!r} looking for beginning of value"


class V1Stream(StreamFormat):
    def __init__(self, eng: Ollama, model: str, chat: bool, include_usage: bool) -> None:
        self.eng, self.chat, self.include_usage = eng, chat, include_usage
        self.legacy = eng.cfg.ollama_legacy
        rid = ("chatcmpl-" if chat else "cmpl-") + str(textgen.RNG.randrange(999))
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.rid, self.obj, self.model, self.created = rid, obj, model, eng.now()
        if chat:
            self.head = (
                b'data: {"id":'
                + orjson.dumps(rid)
                + b',"object":"chat.completion.chunk","created":'
                + str(self.created).encode()
                + b',"model":'
                + _go(model)
                + b","
                + FP
                + b',"choices":'
            )
        else:
            self.head = (
                b'data: {"id":'
                + orjson.dumps(rid)
                + b',"object":"text_completion","created":'
                + str(self.created).encode()
                + b',"choices":'
            )
            self.tail = b',"model":' + _go(model) + b"," + FP
        self.sent_role = False

    def headers(self) -> wire.Headers:
        return wire.go(self.eng.dates.now(), [("Content-Type", "text/event-stream")], None)

    def _chat(self, delta: bytes, finish: bytes) -> bytes:
        return self.head + b'[{"index":0,"delta":' + delta + b',"finish_reason":' + finish + b"}]}\n\n"

    def token(self, delta: str) -> bytes:
        if not self.chat:
            return self.head + b'[{"text":' + _go(delta) + b',"index":0,"finish_reason":null}]' + self.tail + b"}\n\n"
        if self.legacy or not self.sent_role:
            self.sent_role = True
            return self._chat(b'{"role":"assistant","content":' + _go(delta) + b"}", b"null")
        return self._chat(b'{"content":' + _go(delta) + b"}", b"null")

    def reasoning(self, delta: str) -> bytes:
        if self.legacy or not self.sent_role:
            self.sent_role = True
            return self._chat(b'{"role":"assistant","reasoning":' + _go(delta) + b"}", b"null")
        return self._chat(b'{"reasoning":' + _go(delta) + b"}", b"null")

    def final(self, delta: str, res: Result) -> bytes:
        out = self.token(delta) if delta else b""
        fin = orjson.dumps(res.finish)
        usage = orjson.dumps(self.eng.v1.usage(res))
        if self.chat:
            if self.legacy:
                out += self._chat(b'{"role":"assistant","content":""}', fin)
            else:
                if not self.sent_role:  # an empty completion still opens with a role chunk
                    out += self.token("")
                out += self._chat(b"{}", fin)
            if self.include_usage:
                out += self.head + b'[],"usage":' + usage + b"}\n\n"
        else:
            out += self.head + b'[{"text":"","index":0,"finish_reason":' + fin + b"}]" + self.tail + b"}\n\n"
            if self.include_usage:
                out += self.head + b"[]" + self.tail + b',"usage":' + usage + b"}\n\n"
        return out + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        return b""  # the native error line is swallowed; the stream just ends

    def huge(self, size: int) -> bytes:
        return self.token("x" * size)


class OllamaV1:
    def __init__(self, eng: Ollama) -> None:
        self.eng = eng

    def setup(self) -> None:
        e = self.eng
        e.route("POST", "/v1/chat/completions", self.chat, inference=True)
        e.route("POST", "/v1/completions", self.completions, inference=True)
        e.route("POST", "/v1/embeddings", self.embeddings, inference=True)
        e.route("GET", "/v1/models", self.models)

    def err(self, status: int, message: str, charset: bool = False) -> Reply:
        legacy = self.eng.cfg.ollama_legacy
        etype = {400: "invalid_request_error", 404: "api_error" if legacy else "not_found_error"}.get(
            status, "api_error"
        )
        body = _go({"error": {"message": message, "type": etype, "param": None, "code": None}})
        ctype = "application/json; charset=utf-8" if charset else "application/json"
        return self.eng.jr(status, body, ctype, newline=not charset)

    @staticmethod
    def usage(res: Result) -> dict[str, int]:
        return {
            "prompt_tokens": res.prompt_tokens,
            "completion_tokens": res.completion_tokens,
            "total_tokens": res.prompt_tokens + res.completion_tokens,
        }

    def _card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(self.eng.rt.started_wall), "owned_by": "library"}

    async def models(self, req: Request) -> None:
        obj = {"object": "list", "data": [self._card(name) for name in self.eng.served]}
        await self.eng.reply(req, self.eng.jr(200, obj, "application/json", newline=True))

    async def model_card(self, req: Request, name: str) -> None:
        if not self.eng.known(name):
            await self.eng.reply(req, self.err(404, self.eng.not_found_model(name)))
            return
        await self.eng.reply(req, self.eng.jr(200, self._card(name), "application/json", newline=True))

    def _check(self, req: Request, chat: bool) -> tuple[dict[str, Any], Reply | None]:
        body, exc = self.eng.parse_json(req)
        if exc is not None:
            return {}, self.err(400, go_json_error(exc), charset=True)
        if not isinstance(body, dict):
            return {}, self.err(400, "invalid request body", charset=True)
        if chat and not body.get("messages"):
            return body, self.err(400, "[] is too short - 'messages'", charset=True)
        if not chat and not isinstance(body.get("prompt"), str):
            return body, self.err(400, "prompt must be a string", charset=True)
        if not self.eng.known(body.get("model")):
            return body, self.err(404, self.eng.not_found_model(str(body.get("model"))))
        return body, None

    async def _run(self, req: Request, chat: bool) -> None:
        body, problem = self._check(req, chat)
        if problem is not None:
            await self.eng.reply(req, problem)
            return
        model = str(body["model"])
        stream = bool(body.get("stream"))
        so = body.get("stream_options")
        include_usage = isinstance(so, dict) and so.get("include_usage") is True
        pt = textgen.chat_prompt_tokens(body["messages"]) if chat else textgen.prompt_tokens(body["prompt"])
        fmt = V1Stream(self.eng, model, chat, include_usage) if stream else None

        def build(res: Result) -> Reply:
            aborted = res.finish is None
            rid = ("chatcmpl-" if chat else "cmpl-") + str(textgen.RNG.randrange(999))
            usage = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0} if aborted else self.usage(res)
            if chat:
                message: dict[str, Any] = {"role": "assistant", "content": res.text}
                if res.reasoning:
                    message["reasoning"] = res.reasoning
                choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": res.finish}
                obj: dict[str, Any] = {
                    "id": rid,
                    "object": "chat.completion",
                    "created": self.eng.now(),
                    "model": model,
                    "system_fingerprint": "fp_ollama",
                    "choices": [choice],
                    "usage": usage,
                }
            else:
                obj = {
                    "id": rid,
                    "object": "text_completion",
                    "created": self.eng.now(),
                    "model": model,
                    "system_fingerprint": "fp_ollama",
                    "choices": [{"text": res.text, "index": 0, "finish_reason": res.finish}],
                    "usage": usage,
                }
            return self.eng.jr(200, obj, "application/json", newline=True)

        temperature = body.get("temperature", 1.0)
        top_p = body.get("top_p", 1.0)
        job = self.eng.job(
            req,
            model=model,
            stream=stream,
            limit=body.get("max_tokens"),
            stops=textgen.stop_list(body.get("stop")),
            prompt_tokens=pt,
            fmt=fmt,
            body=build,
            error_reply=lambda: self.err(500, RUN_ERROR),
            busy=self.err(503, BUSY),
            reasoning=chat,
            effective={
                "temperature": 1.0 if temperature is None else temperature,
                "top_p": 1.0 if top_p is None else top_p,
                "stop": body.get("stop"),
                "include_usage": include_usage,
                "max_completion_tokens_ignored": body.get("max_completion_tokens"),
            },
        )
        await self.eng.run_on(model, job, req)

    async def chat(self, req: Request) -> None:
        await self._run(req, True)

    async def completions(self, req: Request) -> None:
        await self._run(req, False)

    async def embeddings(self, req: Request) -> None:
        body, exc = self.eng.parse_json(req)
        if exc is not None or not isinstance(body, dict) or "input" not in body:
            await self.eng.reply(req, self.err(400, "invalid input", charset=True))
            return
        model = body.get("model")
        if not self.eng.known(model):
            await self.eng.reply(req, self.err(404, self.eng.not_found_model(str(model))))
            return
        texts = textgen.embed_inputs(body["input"])
        tokens = sum(textgen.text_tokens(t) for t in texts)
        b64 = body.get("encoding_format") == "base64" and not self.eng.cfg.ollama_legacy

        def build(res: Result) -> Reply:
            data = [
                {
                    "object": "embedding",
                    "embedding": textgen.embedding_b64(textgen.embedding(t)) if b64 else textgen.embedding(t),
                    "index": i,
                }
                for i, t in enumerate(texts)
            ]
            obj = {
                "object": "list",
                "data": data,
                "model": str(model),
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
            return self.eng.jr(200, obj, "application/json", newline=True)

        job = self.eng.job(
            req,
            model=str(model),
            stream=False,
            limit=0,
            stops=[],
            prompt_tokens=tokens,
            fmt=None,
            body=build,
            error_reply=lambda: self.err(500, "embedding failed"),
            busy=self.err(503, BUSY),
            effective={},
        )
        await self.eng.run_on(str(model), job, req)
