"""Ollama's NDJSON answer stream, translated into OpenAI SSE chunks as it arrives.

Shape of what the client sees, as OpenAI sends it: a role chunk first, content (and reasoning,
and tool-call) deltas, then a separate finish chunk with an empty delta, then the usage chunk when
the client asked for it (built from `prompt_eval_count` / `eval_count`), then `[DONE]`.
A line `{"error": "..."}` becomes one error event; a stream that stops without a `done: true` line
(Ollama aborts a generation after repeated identical tokens) ends with a clear error event, and so does
one whose `done` line says it did not finish, or that reads as a cut prompt (the adapter's `verdict`,
with the usage kept for billing). Ollama's per-line `logprobs` (ollama/ollama api/types.go
`ChatResponse.Logprobs`, `Logprob`, `TokenLogprob` @fb3076099) become OpenAI's on the next delta.
`output_started` is set with the first content, reasoning or tool-call delta. The usage object is
built in one place (`openai_usage`) for both the stream and the whole answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.ollama_prompt import PromptFacts
from llm_gateway.adapters.relay_base import RelayBase
from llm_gateway.errors import EngineErrorAnswer, GatewayError, StreamInterrupted, UpstreamProtocolError
from llm_gateway.types import CallContext, Usage

#: the `done_reason`s of a generation that ended as asked (ollama/ollama llm/server.go `DoneReason.String`
#: @fb3076099; 0.5.4's llm/server.go `Completion` gives the same two)
FINISHED = ("stop", "length")


def unfinished(obj: dict[str, Any]) -> str | None:
    """Why a final answer object says the generation did not finish, or None when it did."""
    if obj.get("done") is not True:
        return "Ollama answered with done: false (it aborts a generation after about 30 repeated identical tokens)"
    reason = obj.get("done_reason")
    if reason not in FINISHED:
        return f"Ollama ended it with done_reason {reason!r}"
    return None


def token_logprob(e: Any) -> dict[str, Any]:
    """One of Ollama's `{token, logprob, bytes?}` as OpenAI's `{token, logprob, bytes}`."""
    e = e if isinstance(e, dict) else {}
    token = str(e.get("token", ""))
    raw = e.get("bytes")
    return {
        "token": token,
        "logprob": float(e.get("logprob") or 0.0),
        "bytes": raw if isinstance(raw, list) else list(token.encode()),
    }


def chat_logprobs(entries: list[Any]) -> dict[str, Any]:
    """Ollama's `logprobs` list as OpenAI's chat `logprobs` object."""
    content = []
    for e in entries:
        item = token_logprob(e)
        top = e.get("top_logprobs") if isinstance(e, dict) else None
        item["top_logprobs"] = [token_logprob(t) for t in top] if isinstance(top, list) else []
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[Any], offset: int) -> tuple[dict[str, Any], int]:
    """Ollama's `logprobs` list as OpenAI's legacy completions `logprobs` (text offsets from `offset`), and
    the offset after them."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in entries:
        item = token_logprob(e)
        top = e.get("top_logprobs") if isinstance(e, dict) else None
        out["tokens"].append(item["token"])
        out["token_logprobs"].append(item["logprob"])
        out["top_logprobs"].append(
            {t["token"]: t["logprob"] for t in map(token_logprob, top)} if isinstance(top, list) else {}
        )
        out["text_offset"].append(offset)
        offset += len(item["token"])
    return out, offset


def finish_reason(obj: dict[str, Any], tool_calls: bool) -> str:
    if tool_calls:
        return "tool_calls"
    reason = obj.get("done_reason")
    return "length" if reason == "length" else "stop"


def openai_usage(u: Usage) -> dict[str, int]:
    """Ollama's counts as OpenAI's `usage` object."""
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens, "total_tokens": u.total_tokens}


def _nbytes(text: Any) -> int:
    """UTF-8 bytes of generated text (anything but a string counts nothing)."""
    return len(text.encode()) if isinstance(text, str) else 0


def tool_calls_to_openai(calls: Any, request_id: str, start: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not isinstance(calls, list):
        return out
    for i, tc in enumerate(calls, start):
        fn = (tc or {}).get("function") or {}
        args = fn.get("arguments", {})
        out.append(
            {
                "index": i,
                "id": f"call_{request_id[:12]}_{i}",
                "type": "function",
                "function": {
                    "name": fn.get("name", ""),
                    "arguments": args if isinstance(args, str) else orjson.dumps(args).decode(),
                },
            }
        )
    return out


#: the adapter's reading of a final answer object: an error (a generation not finished, a cut prompt,
#: logprobs asked for and not given) or None; arguments: the object, the call's facts, whether logprobs
#: came, the usage
Verdict = Callable[[dict[str, Any], PromptFacts, bool, Usage], GatewayError | None]


class OllamaRelay(RelayBase):
    __slots__ = (
        "_chat",
        "_facts",
        "_head",
        "_head_obj",
        "_lp",
        "_lp_offset",
        "_lp_seen",
        "_on_error",
        "_sent_role",
        "_tools",
        "_verdict",
    )

    oversized: ClassVar[str] = "Ollama sent a line"

    def __init__(
        self,
        ctx: CallContext,
        on_error: Callable[[str], EngineErrorAnswer],
        facts: PromptFacts | None = None,
        verdict: Verdict | None = None,
    ) -> None:
        super().__init__(ctx)
        self._on_error = on_error
        self._facts = facts or PromptFacts()
        self._verdict = verdict
        self._lp: list[Any] = []  # Ollama's logprobs not yet passed on
        self._lp_seen = False
        self._lp_offset = 0  # completions: the text offset of the next token
        self._chat = ctx.endpoint == "chat"
        obj = "chat.completion.chunk" if self._chat else "text_completion"
        pre = "chatcmpl-" if self._chat else "cmpl-"
        self._head_obj = {
            "id": pre + ctx.request_id,
            "object": obj,
            "created": int(time.time()),
            "model": ctx.public_model,
        }
        self._head = b"data: " + orjson.dumps(self._head_obj)[:-1] + b',"choices":['
        self._sent_role = False
        self._tools = 0

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        if self._tr is not None:  # translated: the chunk as an object, never written as OpenAI SSE
            return self._tr.event({**self._head_obj, "choices": [choice]})
        return self._head + orjson.dumps(choice) + b"]}\n\n"

    def _delta(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        lp = self._logprobs()
        if self._chat:
            return self._chunk({"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish})
        return self._chunk({"index": 0, "text": delta.get("content", ""), "logprobs": lp, "finish_reason": finish})

    def _logprobs(self) -> dict[str, Any] | None:
        """The logprobs not yet passed on, in OpenAI's shape, for the chunk being made (None when there are
        none: not asked, or a role chunk)."""
        if not self._lp:
            return None
        entries, self._lp = self._lp, []
        if self._chat:
            return chat_logprobs(entries)
        out, self._lp_offset = completion_logprobs(entries, self._lp_offset)
        return out

    def feed(self, data: bytes) -> bytes:
        if self._closed:
            return b""
        buf = self._buf + data if self._buf else data
        if buf.find(b"\n") < 0:  # `find`, not `in`: see sse_relay.py
            return self._hold(buf)
        *lines, self._buf = buf.split(b"\n")
        out = []
        for line in lines:
            if self._closed:
                break
            if line.strip():
                out.append(self._line(line))
        return b"".join(out)

    def _line(self, line: bytes) -> bytes:
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            return self._fail(UpstreamProtocolError("Ollama sent a stream line that is not valid JSON"))
        if not isinstance(obj, dict):
            return self._fail(UpstreamProtocolError("Ollama sent a stream line that is not a JSON object"))
        if "error" in obj:
            return self._fail(self._on_error(str(obj["error"])))
        parts: list[bytes] = []
        if self._chat:
            msg = obj.get("message") or {}
            content, thinking, calls = msg.get("content"), msg.get("thinking"), msg.get("tool_calls")
        else:
            content, thinking, calls = obj.get("response"), obj.get("thinking"), None
        if not self._sent_role and self._chat:
            parts.append(self._delta({"role": "assistant", "content": ""}))
        self._sent_role = True
        lp = obj.get("logprobs")
        if isinstance(lp, list) and lp:
            self._lp_seen = True
            self._lp.extend(lp)
        if thinking and self._chat:
            self.output_started = True
            self.text_bytes += _nbytes(thinking)
            parts.append(self._delta({self._ctx.reasoning_field: thinking}))
        if content:
            self.output_started = True
            self.content_events += 1
            self.text_bytes += _nbytes(content)
            parts.append(self._delta({"content": content}))
        if calls:
            oa = tool_calls_to_openai(calls, self._ctx.request_id, self._tools)
            self._tools += len(oa)
            self.text_bytes += sum(_nbytes(tc["function"]["arguments"]) for tc in oa)
            self.output_started = self.output_started or bool(oa)
            parts.append(self._delta({"tool_calls": oa}))
        if obj.get("done"):
            usage = Usage(int(obj.get("prompt_eval_count") or 0), int(obj.get("eval_count") or 0))
            err = self._verdict(obj, self._facts, self._lp_seen, usage) if self._verdict else None
            if err is not None:  # what was generated is still billed: the engine's own counts
                self.usage = usage
                return b"".join(parts) + self._fail(err)
            parts.append(self._delta({}, finish_reason(obj, self._tools > 0)))
            self.usage = usage
            if self._ctx.client_wants_usage:
                parts.append(self._chunk_out({**self._head_obj, "choices": [], "usage": openai_usage(self.usage)}))
            parts.append(self._done_out())
            self.done = True
            self._closed = True
        return b"".join(parts)

    def _last(self, rest: bytes) -> bytes:
        return self._line(rest)

    def _end(self) -> bytes:
        # a clean stream closes the relay at its `done: true` line: this one never sent it
        return self._fail(
            StreamInterrupted(
                "Ollama ended the stream without finishing it (it aborts a generation after many repeated tokens)"
            )
        )
