"""vLLM stream shapes (captured 0.32.0): role chunk, token chunks with ``token_ids``,
the finish on the last token's chunk with ``stop_reason``, ``system_fingerprint`` on the
last chunk, the usage chunk with ``choices: []`` and ``continuous_usage_stats``.
A mid-stream error is ``data: {"error": ...}`` (``json.dumps`` spacing) then ``[DONE]``.

With ``n`` > 1 every event goes out once per choice, one choice per chunk (``index`` 0..n-1), and the
usage counts the tokens of all choices together: vLLM's ``chat_completion_stream_generator`` sends "each
token for each request.n (index)" and its final usage is ``completion_tokens = sum(previous_num_tokens)``
(vllm-project/vllm ``vllm/entrypoints/openai/chat_completion/serving.py`` at 006c49d4). The emulated
choices are the same text, which is all a gateway needs to count them.
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
    def __init__(
        self, eng: Vllm, chat: bool, include_usage: bool, continuous: bool, prompt_tokens: int, choices: int = 1
    ) -> None:
        self.eng, self.chat, self.include_usage, self.continuous = eng, chat, include_usage, continuous
        self.prompt_tokens = prompt_tokens
        self.choices = choices
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
        return b"".join(
            b"data: " + self.head + b',"choices":[{"index":' + str(i).encode() + b',"delta":{"role":"assistant",'
            b'"content":""},"logprobs":null,"finish_reason":null}]' + usage + b',"prompt_token_ids":null,'
            b'"prompt_text":null}\n\n'
            for i in range(self.choices)
        )

    def _choice(self, delta: str, finish: bytes, stop_reason: bytes | None, i: int = 0) -> bytes:
        tail = b',"stop_reason":' + stop_reason if stop_reason is not None else b""
        index = str(i).encode()
        if self.chat:
            return (
                b'[{"index":' + index + b',"delta":{"content":' + orjson.dumps(delta) + b'},"logprobs":null,'
                b'"finish_reason":' + finish + tail + b',"token_ids":null}]'
            )
        return (
            b'[{"index":'
            + index
            + b',"text":'
            + orjson.dumps(delta)
            + b',"logprobs":null,"finish_reason":'
            + finish
            + (tail or b',"stop_reason":null')
            + b"}]"
        )

    def reasoning(self, delta: str) -> bytes:
        self.n += 1
        usage = b',"usage":' + self._usage(self.n) if self.continuous else b""
        return b"".join(
            b"data: "
            + self.head
            + b',"choices":[{"index":'
            + str(i).encode()
            + b',"delta":{"reasoning":'
            + orjson.dumps(delta)
            + b'},"logprobs":null,"finish_reason":null,"token_ids":null}]'
            + usage
            + b"}\n\n"
            for i in range(self.choices)
        )

    def token(self, delta: str) -> bytes:
        self.n += 1
        usage = b',"usage":' + self._usage(self.n) if self.continuous else b""
        return b"".join(
            b"data: " + self.head + b',"choices":' + self._choice(delta, b"null", None, i) + usage + b"}\n\n"
            for i in range(self.choices)
        )

    def final(self, delta: str, res: Result) -> bytes:
        n = res.completion_tokens
        usage = b',"usage":' + self._usage(n) if self.continuous else b""  # continuous: the choice's own count
        fp = b',"system_fingerprint":' + orjson.dumps(self.eng.fingerprint)
        stop = orjson.dumps(res.matched)
        last = b"".join(
            b"data: "
            + self.head
            + b',"choices":'
            + self._choice(delta, orjson.dumps(res.finish), stop, i)
            + usage
            + (b"" if self.include_usage else fp)
            + b"}\n\n"
            for i in range(self.choices)
        )
        if self.include_usage:  # the final usage: all choices together
            total = self._usage(n * self.choices, details=False)
            last += b"data: " + self.head + b',"choices":[],"usage":' + total + fp + b"}\n\n"
        return last + b"data: [DONE]\n\n"

    def error(self) -> bytes:
        err = {"error": {"message": DEAD, "type": "InternalServerError", "param": None, "code": 500}}
        return b"data: " + wire.pyjson(err) + b"\n\ndata: [DONE]\n\n"
