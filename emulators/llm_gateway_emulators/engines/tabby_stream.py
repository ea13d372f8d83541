"""TabbyAPI stream shapes (endpoints/OAI/utils/*.py, sse-starlette): ``json.dumps``
chunks with spaces, CRLF separators, ``: ping - <utc time>`` comments, no role chunk,
``eos_reason`` on the finish, the finish moved into the usage chunk when usage was asked
for, completions chunks keyed ``model_name``, errors ``{"error":{"message","trace"}}``
with no ``[DONE]``; also the usage object with Tabby's timing fields.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway_emulators import wire
from llm_gateway_emulators.jobs import Result, StreamFormat

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.tabbyapi import TabbyApi


def _dumps(obj: Any) -> bytes:
    return wire.pyjson(obj, ensure_ascii=False)


def usage_of(res: Result) -> dict[str, Any]:
    pt = round(max(0.0, res.t_first - res.t_slot), 2)
    ct = round(max(0.0, res.t_end - res.t_first), 2)
    return {
        "prompt_tokens": res.prompt_tokens,
        "prompt_time": pt,
        "prompt_tokens_per_sec": round(res.prompt_tokens / pt, 2) if pt else "Indeterminate",
        "completion_tokens": res.completion_tokens,
        "completion_time": ct,
        "completion_tokens_per_sec": round(res.completion_tokens / ct, 2) if ct else "Indeterminate",
        "total_tokens": res.prompt_tokens + res.completion_tokens,
        "total_time": round(pt + ct, 2),
    }


def eos_reason(res: Result) -> str:
    if res.finish == "length":
        return "max_new_tokens"
    return "stop_string" if res.matched is not None else "stop_token"


class TabbyStream(StreamFormat):
    def __init__(self, eng: TabbyApi, chat: bool, include_usage: bool) -> None:
        self.eng, self.chat, self.include_usage = eng, chat, include_usage
        self.rid = "chatcmpl-" + uuid.uuid4().hex

    def headers(self) -> wire.Headers:
        return self.eng.sse_headers(
            [("cache-control", "no-cache"), ("connection", "keep-alive"), ("x-accel-buffering", "no")]
        )

    @staticmethod
    def _ev(data: bytes) -> bytes:
        return b"data: " + data + b"\r\n\r\n"

    def _chunk(self, choice: dict[str, Any], usage: dict[str, Any] | None = None) -> bytes:
        m = self.eng.cfg.model
        if self.chat:
            d: dict[str, Any] = {
                "id": self.rid,
                "object": "chat.completion.chunk",
                "created": self.eng.now(),
                "choices": [choice],
            }
            if usage is not None:
                d["usage"] = usage
            d["model"] = m
        else:
            d = {"id": self.rid, "object": "text_completion", "choices": [choice], "created": self.eng.now()}
            if usage is not None:
                d["usage"] = usage
            d["model_name"] = m
        return self._ev(_dumps(d))

    def _choice(self, delta: str, finish: str | None, res: Result | None = None) -> dict[str, Any]:
        c: dict[str, Any] = (
            {"index": 0, "delta": {"content": delta} if delta else {}, "finish_reason": finish}
            if self.chat
            else {"index": 0, "text": delta, "finish_reason": finish}
        )
        if finish is not None and res is not None:
            c["eos_reason"] = eos_reason(res)
        return c

    def token(self, delta: str) -> bytes:
        return self._chunk(self._choice(delta, None))

    def reasoning(self, delta: str) -> bytes:
        return self._chunk({"index": 0, "delta": {"reasoning_content": delta}, "finish_reason": None})

    def final(self, delta: str, res: Result) -> bytes:
        out = self.token(delta) if delta else b""
        if self.include_usage:
            choice = (
                {"index": 0, "delta": {}, "finish_reason": res.finish}
                if self.chat
                else {"index": 0, "text": "", "finish_reason": res.finish}
            )
            out += self._chunk(choice, usage_of(res))
        else:
            out += self._chunk(self._choice("", res.finish, res))
        return out + self._ev(b"[DONE]")

    def error(self) -> bytes:
        what = "Chat completion" if self.chat else "Completion"
        msg = {"error": {"message": f"{what} aborted. Please check the server console.", "trace": None}}
        return self._ev(orjson.dumps(msg))

    def ping(self) -> bytes:
        return b": ping - " + str(datetime.now(UTC).replace(tzinfo=None)).encode() + b"\r\n\r\n"
