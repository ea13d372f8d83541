"""llama.cpp stream and usage shapes: chunk key order, ``timings``, the usage chunk.

As captured in ``06_chat_stream`` (include_usage: finish chunk without timings, then a
usage chunk with ``choices: []``, usage and timings), ``07_chat_stream_no_usage`` (timings
on the finish chunk) and ``09_completions_stream`` (usage and timings on the final chunk).
A mid-stream error is ``data: {"error": ...}`` and the stream ends without ``[DONE]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.engines import llama_info
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import Result, StreamFormat

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.llama_server import LlamaServer


def timings(res: Result) -> dict[str, Any]:
    prompt_ms = max(0.001, (res.t_first - res.t_slot) * 1000.0)
    pred_ms = max(0.001, (res.t_end - res.t_first) * 1000.0)
    pn, gn = max(1, res.prompt_tokens), res.completion_tokens
    return {
        "cache_n": 0,
        "prompt_n": res.prompt_tokens,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_token_ms": prompt_ms / pn,
        "prompt_per_second": 1000.0 * pn / prompt_ms,
        "predicted_n": gn,
        "predicted_ms": round(pred_ms, 3),
        "predicted_per_token_ms": pred_ms / max(1, gn),
        "predicted_per_second": 1000.0 * gn / pred_ms,
    }


def usage(res: Result) -> dict[str, Any]:
    return {
        "completion_tokens": res.completion_tokens,
        "prompt_tokens": res.prompt_tokens,
        "total_tokens": res.completion_tokens + res.prompt_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


class LlamaStream(StreamFormat):
    def __init__(self, eng: LlamaServer, req: Request, chat: bool, include_usage: bool) -> None:
        self.eng, self.req, self.chat, self.include_usage = eng, req, chat, include_usage
        self.id = "chatcmpl-" + textgen.rand_alnum(32)
        self.created = eng.now()
        obj = "chat.completion.chunk" if chat else "text_completion"
        if chat:
            self.tail = orjson.dumps(
                {
                    "created": self.created,
                    "id": self.id,
                    "model": eng.cfg.model,
                    "system_fingerprint": llama_info.BUILD,
                    "object": obj,
                }
            )[1:-1]
        else:
            self.tail = orjson.dumps(
                {"created": self.created, "model": eng.cfg.model, "system_fingerprint": llama_info.BUILD, "object": obj}
            )[1:-1]

    def headers(self) -> wire.Headers:
        return self.eng.heads(self.req, "text/event-stream", None, sse=True)

    def _ev(self, obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    def first(self) -> bytes:
        if not self.chat:
            return b""
        return (
            b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant",'
            b'"content":null}}],' + self.tail + b"}\n\n"
        )

    def reasoning(self, delta: str) -> bytes:
        return (
            b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"reasoning_content":'
            + orjson.dumps(delta)
            + b"}}],"
            + self.tail
            + b"}\n\n"
        )

    def token(self, delta: str) -> bytes:
        if self.chat:
            return (
                b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":'
                + orjson.dumps(delta)
                + b"}}],"
                + self.tail
                + b"}\n\n"
            )
        return (
            b'data: {"choices":[{"text":'
            + orjson.dumps(delta)
            + b',"index":0,"logprobs":null,"finish_reason":null}],'
            + self.tail
            + b',"id":'
            + orjson.dumps(self.id)
            + b"}\n\n"
        )

    def final(self, delta: str, res: Result) -> bytes:
        out = self.token(delta) if delta else b""
        head = {
            "created": self.created,
            "id": self.id,
            "model": self.eng.cfg.model,
            "system_fingerprint": llama_info.BUILD,
        }
        if self.chat:
            fin: dict[str, Any] = {
                "choices": [{"finish_reason": res.finish, "index": 0, "delta": {}}],
                **head,
                "object": "chat.completion.chunk",
            }
            if self.include_usage:
                out += self._ev(fin)
                out += self._ev(
                    {
                        "choices": [],
                        **head,
                        "object": "chat.completion.chunk",
                        "usage": usage(res),
                        "timings": timings(res),
                    }
                )
            else:
                out += self._ev({**fin, "timings": timings(res)})
        else:
            fin = {
                "choices": [{"text": "", "index": 0, "logprobs": None, "finish_reason": res.finish}],
                "created": self.created,
                "model": self.eng.cfg.model,
                "system_fingerprint": llama_info.BUILD,
                "object": "text_completion",
            }
            if self.include_usage:
                fin["usage"] = usage(res)
            fin["id"] = self.id
            fin["timings"] = timings(res)
            out += self._ev(fin)
        return out + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        return self._ev(
            {"error": {"code": 500, "message": "Generation failed (emulated engine fault)", "type": "server_error"}}
        )
