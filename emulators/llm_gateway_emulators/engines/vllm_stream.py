"""vLLM stream shapes (captured 0.32.0): role chunk, token chunks with ``token_ids``,
the finish on the last token's chunk with ``stop_reason``, ``system_fingerprint`` on the
last chunk, the usage chunk with ``choices: []`` and ``continuous_usage_stats``.
A mid-stream error is ``data: {"error": ...}`` (``json.dumps`` spacing) then ``[DONE]``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.jobs import Result, StreamFormat

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.vllm import Vllm

DEAD = "EngineCore encountered an issue. See stack trace (above) for the root cause."


class VllmStream(StreamFormat):
    def __init__(self, eng: Vllm, chat: bool, include_usage: bool, continuous: bool, prompt_tokens: int) -> None:
        self.eng, self.chat, self.include_usage, self.continuous = eng, chat, include_usage, continuous
        self.prompt_tokens = prompt_tokens
        self.n = 0
        self.id = ("chatcmpl-" if chat else "cmpl-") + textgen.rand_hex(16)
        obj = "chat.completion.chunk" if chat else "text_completion"
        self.head = orjson.dumps({"id": self.id, "object": obj, "created": eng.now(), "model": eng.cfg.model})[:-1]

    def headers(self) -> wire.Headers:
        return self.eng.sse_headers()

    def _usage(self, n: int, details: bool = True) -> bytes:
        u: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + n,
            "completion_tokens": n,
        }
        if details:
            u["completion_tokens_details"] = None
        return orjson.dumps(u)

    def first(self) -> bytes:
        if not self.chat:
            return b""
        usage = b',"usage":' + self._usage(0) if self.continuous else b""
        return (
            b"data: " + self.head + b',"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            b'"logprobs":null,"finish_reason":null}]' + usage + b',"prompt_token_ids":null,"prompt_text":null}\n\n'
        )

    def _choice(self, delta: str, finish: bytes, stop_reason: bytes | None) -> bytes:
        tail = b',"stop_reason":' + stop_reason if stop_reason is not None else b""
        if self.chat:
            return (
                b'[{"index":0,"delta":{"content":' + orjson.dumps(delta) + b'},"logprobs":null,'
                b'"finish_reason":' + finish + tail + b',"token_ids":null}]'
            )
        return (
            b'[{"index":0,"text":'
            + orjson.dumps(delta)
            + b',"logprobs":null,"finish_reason":'
            + finish
            + (tail or b',"stop_reason":null')
            + b"}]"
        )

    def reasoning(self, delta: str) -> bytes:
        self.n += 1
        choice = b'[{"index":0,"delta":{"reasoning":' + orjson.dumps(delta) + b'},"logprobs":null,"finish_reason":null'
        usage = b',"usage":' + self._usage(self.n) if self.continuous else b""
        return b"data: " + self.head + b',"choices":' + choice + b',"token_ids":null}]' + usage + b"}\n\n"

    def token(self, delta: str) -> bytes:
        self.n += 1
        usage = b',"usage":' + self._usage(self.n) if self.continuous else b""
        return b"data: " + self.head + b',"choices":' + self._choice(delta, b"null", None) + usage + b"}\n\n"

    def final(self, delta: str, res: Result) -> bytes:
        n = res.completion_tokens
        usage = b',"usage":' + self._usage(n) if self.continuous else b""
        fp = b',"system_fingerprint":' + orjson.dumps(self.eng.fingerprint)
        stop = orjson.dumps(res.matched)
        last = (
            b"data: "
            + self.head
            + b',"choices":'
            + self._choice(delta, orjson.dumps(res.finish), stop)
            + usage
            + (b"" if self.include_usage else fp)
            + b"}\n\n"
        )
        if self.include_usage:
            last += b"data: " + self.head + b',"choices":[],"usage":' + self._usage(n, details=False) + fp + b"}\n\n"
        return last + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        err = {"error": {"message": DEAD, "type": "InternalServerError", "param": None, "code": 500}}
        return b"data: " + wire.pyjson(err) + b"\n\ndata: [DONE]\n\n"
