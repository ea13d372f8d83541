"""SGLang stream shapes (pydantic ``model_dump_json`` of sgl-project/sglang
``python/sglang/srt/entrypoints/openai/protocol.py`` @9b116df, written by ``serving_chat.py``): role chunk,
content chunks with null fields, a separate finish chunk carrying ``matched_stop``, the
optional usage chunk, ``[DONE]``; in-band errors are ``{"error": {flat}}`` then ``[DONE]``.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway_emulators import wire
from llm_gateway_emulators.jobs import Result, StreamFormat

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.sglang import Sglang

FULL = "The request queue is full."
NULL_DELTA = b'"reasoning_content":null,"tool_calls":null'


def flat(status: int, message: str, etype: str, param: str | None = None) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": etype, "param": param, "code": status}


class SglangStream(StreamFormat):
    def __init__(self, eng: Sglang, model: str, chat: bool, include_usage: bool) -> None:
        self.eng, self.chat, self.include_usage = eng, chat, include_usage
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = b"data: " + orjson.dumps({"id": rid, "object": obj, "created": eng.now(), "model": model})[:-1]

    def headers(self) -> wire.Headers:
        return self.eng.sse_headers()

    def first(self) -> bytes:
        if not self.chat:
            return b""
        return (
            self.head
            + b',"choices":[{"index":0,"delta":{"role":"assistant","content":"",'
            + NULL_DELTA
            + b'},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
        )

    def reasoning(self, delta: str) -> bytes:
        return (
            self.head
            + b',"choices":[{"index":0,"delta":{"role":null,"content":null,"reasoning_content":'
            + orjson.dumps(delta)
            + b',"tool_calls":null},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
        )

    def token(self, delta: str) -> bytes:
        d = orjson.dumps(delta)
        if self.chat:
            return (
                self.head
                + b',"choices":[{"index":0,"delta":{"role":null,"content":'
                + d
                + b","
                + NULL_DELTA
                + b'},"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
            )
        return (
            self.head
            + b',"choices":[{"index":0,"text":'
            + d
            + b',"logprobs":null,"finish_reason":null,"matched_stop":null}],"usage":null}\n\n'
        )

    def final(self, delta: str, res: Result) -> bytes:
        out = self.token(delta) if delta else b""
        fin, ms = orjson.dumps(res.finish), orjson.dumps(self.eng.matched(res))
        if self.chat:
            out += (
                self.head
                + b',"choices":[{"index":0,"delta":{"role":null,"content":null,'
                + NULL_DELTA
                + b'},"logprobs":null,"finish_reason":'
                + fin
                + b',"matched_stop":'
                + ms
                + b'}],"usage":null}\n\n'
            )
        else:
            out += (
                self.head
                + b',"choices":[{"index":0,"text":"","logprobs":null,"finish_reason":'
                + fin
                + b',"matched_stop":'
                + ms
                + b'}],"usage":null}\n\n'
            )
        if self.include_usage:
            out += self.head + b',"choices":[],"usage":' + orjson.dumps(self.eng.usage(res)) + b"}\n\n"
        return out + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        err = flat(400, "Generation failed (emulated engine fault)", "BadRequestError")
        return b"data: " + wire.pyjson({"error": err}) + b"\n\ndata: [DONE]\n\n"

    def queue_full(self) -> bytes:
        return b"data: " + wire.pyjson({"error": flat(503, FULL, "503")}) + b"\n\ndata: [DONE]\n\n"
