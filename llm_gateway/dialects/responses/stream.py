"""The gateway's OpenAI chat SSE stream (what the service writes) as the Responses API's typed events.

OpenAI's order: `response.created`, `response.in_progress`; per output item
`response.output_item.added`, then for reasoning `response.content_part.added` (a `reasoning_text`
part), `response.reasoning_text.delta`s, `.done`, `response.content_part.done`; for text the same
with an `output_text` part and `response.output_text.delta`s (with their logprobs); for a tool call
`response.function_call_arguments.delta`s and `.done`; then `response.output_item.done` with the
whole item. An item ends when output of another kind starts. At the end `response.completed` (or
`response.incomplete` when the engine stopped at the token limit, whose last item is then `incomplete`
in its `output_item.done` and in the Response) carries the whole Response, equal
to what a whole answer would have been, usage included; an error event in the chat stream (the
engine failed after the first byte) becomes `response.failed` with the error, and nothing follows.
Every event has a `sequence_number`. Frames are `event: TYPE\\ndata: JSON\\n\\n`.
Fragments of a tool call whose item has closed (an engine interleaving two calls) cannot be put
back into a closed item: they are dropped from the stream, as Anthropic's translation does.
The stream relay drives it (`wire/chat_events.ChatTranslation`): the engine's events as it passes them
(`feed`: bytes, each event parsed once here), the chunks it parsed or made itself (`event`), its end
(`end`) or its failure (`fail`: the gateway's error), and an ordinary token whose shape it has learnt
(`token`): once a text item is open, its text becomes the item's `response.output_text.delta`, copied as
the engine escaped it, unparsed.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.responses.echo import Echo, echo_json
from llm_gateway.dialects.responses.items import new_id
from llm_gateway.dialects.responses.request import ResponsesRequest
from llm_gateway.dialects.responses.response import (
    REASONING_KEYS,
    call_item,
    message_item,
    reasoning_item,
    skeleton,
    status_of,
    text_part,
    token_logprobs,
    usage,
)
from llm_gateway.errors import GatewayError
from llm_gateway.wire.chat_events import ChatEvents, parse_event

#: the codes a Response's `error` may carry (openai-python types/responses/response_error.py)
_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded"})


_TEXT_DELTA_HEAD = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","sequence_number":'
_TEXT_DELTA_END = b'","logprobs":[]}\n\n'  # what `_frame` writes after a text delta without logprobs
#: the frames that carry the whole Response, up to their sequence number (`_whole`)
_WHOLE = {
    k: b'event: %b\ndata: {"type":"%b","sequence_number":' % (k.encode(), k.encode())
    for k in (
        "response.created",
        "response.in_progress",
        "response.completed",
        "response.incomplete",
        "response.failed",
    )
}
_STARTS = (_WHOLE["response.created"], _WHOLE["response.in_progress"])
#: sequence numbers as `_frame` writes them, for a token's delta (a lookup: cheaper than formatting one)
_SEQ = tuple(b"%d" % n for n in range(4096))


class ResponsesStream:
    """One stream's translation (a `ChatTranslation`). Once `terminal` is set, `response` is the final
    Response object and `turn` the assistant's chat message (the stored conversation's next turn)."""

    __slots__ = (
        "_calls",
        "_deltas",
        "_echo",
        "_events",
        "_finish",
        "_item",
        "_kind",
        "_seq",
        "_started",
        "_text",
        "_tool",
        "_usage",
        "_where",
        "estimate",
        "response",
        "terminal",
        "turn",
    )

    def __init__(self, req: ResponsesRequest, response_id: str) -> None:
        self.response = skeleton(req, response_id)
        #: the echoed tools and instructions, their JSON kept across turns: written beside each whole-Response frame
        self._echo = Echo(self.response, echo_json(req))
        self.turn: dict[str, Any] = {"role": "assistant", "content": None}
        self.estimate = req.prompt_estimate
        self.terminal: str | None = None  # the last event's type, once sent: nothing follows it
        self._events = ChatEvents()
        self._seq = 0
        self._started = False
        self._kind: str | None = None  # the open item's kind: "reasoning", "text" or "call"
        self._item: dict[str, Any] = {}
        self._text: list[str] = []  # the open item's text so far
        self._tool: int | None = None  # the chat tool-call index whose item is open
        self._calls: set[int] = set()
        self._deltas = 0
        self._finish: Any = None
        self._usage: Any = None
        #: the open text item's delta frame between its sequence number and its text (made when it opens)
        self._where = b""

    @property
    def done(self) -> bool:
        return self.terminal is not None

    def feed(self, data: bytes) -> bytes:
        """OpenAI SSE events (a partial one is held until the rest comes), each parsed once."""
        if self.terminal is not None:
            return b""
        out: list[bytes] = []  # joined once: a whole-Response frame is tens of KB (its echo), copied once here
        for raw in self._events.feed(data):
            if self.terminal is not None:
                break
            ev = parse_event(raw)
            if ev is None:
                continue
            if isinstance(ev, dict):
                self._event(ev, out)
            else:
                self._end(out)
        return b"".join(out)

    def event(self, obj: dict[str, Any]) -> bytes:
        """One chat chunk the relay parsed or made."""
        if self.terminal is not None:
            return b""
        out: list[bytes] = []
        self._event(obj, out)
        return b"".join(out)

    def token(self, text: bytes) -> bytes | None:
        """An ordinary token (`wire.chat_events.plain_text`), its text as sent: the open text item's
        `output_text.delta`, copied as the engine escaped it; None where it must be parsed (no text item
        open, or a text that is not a valid JSON string's inside)."""
        if self._kind != "text":
            return None
        if not text:
            return b""  # no text: no delta, as parsing says
        try:
            decoded = orjson.loads(b'"' + text + b'"')
        except orjson.JSONDecodeError:
            return None
        self._text.append(decoded)
        self._deltas += 1
        seq = self._seq
        self._seq = seq + 1
        return b"".join(
            (_TEXT_DELTA_HEAD, _SEQ[seq] if seq < 4096 else b"%d" % seq, self._where, text, _TEXT_DELTA_END)
        )

    def end(self) -> bytes:
        """The chat stream's `[DONE]`: the last items' ends and `response.completed` (or `.incomplete`)."""
        if self.terminal is not None:
            return b""
        out: list[bytes] = []
        self._end(out)
        return b"".join(out)

    def fail(self, err: GatewayError) -> bytes:
        """The stream failed after its first byte: `response.failed`, and nothing after it."""
        if self.terminal is not None:
            return b""
        out: list[bytes] = []
        self._error(err.code, err.message, out)
        return b"".join(out)

    def finish(self) -> bytes:
        """At the end of the service's stream: the end, or a failure if the stream never said it ended."""
        if self.terminal is not None:
            return b""
        out: list[bytes] = []
        self._failed("server_error", "the engine's stream ended before its end marker", out)
        return b"".join(out)

    # -- frames --------------------------------------------------------------------------------------
    def _frame(self, kind: str, fields: dict[str, Any]) -> bytes:
        obj = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return b"".join((b"event: " + kind.encode() + b"\ndata: ", orjson.dumps(obj), b"\n\n"))

    def _whole(self, kinds: tuple[bytes, ...], out: list[bytes]) -> None:
        """A frame of each kind (`_WHOLE`'s) with the Response as it stands, appended to `out` as pieces: the
        Response is encoded once for them all (`{"type":...,"sequence_number":N,"response":` + it + `}`, as
        orjson writes that object), its echoed tools and instructions (tens of KB for an agent) their kept JSON,
        beside the rest, not copied into it (echo.py): the caller's one join is their one copy (issue 36 item 2)."""
        pieces: list[bytes] = []
        echo = self._echo
        echo.pieces(orjson.dumps({**self.response, **echo.marks}), pieces)
        for kind in kinds:
            out.append(b'%b%d,"response":' % (kind, self._seq))
            out += pieces
            out.append(b"}\n\n")
            self._seq += 1

    def _start(self, obj: dict[str, Any], out: list[bytes]) -> None:
        self._started = True
        model = obj.get("model")
        if isinstance(model, str) and model:
            self.response["model"] = model
        self._whole(_STARTS, out)

    # -- events --------------------------------------------------------------------------------------
    def _event(self, obj: dict[str, Any], out: list[bytes]) -> None:
        """One chat chunk's events, appended to `out`."""
        err = obj.get("error")
        if err is not None and "choices" not in obj:
            e = err if isinstance(err, dict) else {"message": str(err)}
            self._error(e.get("code"), str(e.get("message") or "the stream failed"), out)
            return
        if not self._started:
            self._start(obj, out)
        if obj.get("usage") is not None:
            self._usage = obj["usage"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return
        ch = choices[0]
        delta = ch.get("delta")
        if isinstance(delta, dict):
            for key in REASONING_KEYS:
                r = delta.get(key)
                if isinstance(r, str) and r:
                    out.append(self._reasoning(r))
                    break
            text = delta.get("content")
            if isinstance(text, str) and text:
                out.append(self._output_text(text, ch.get("logprobs")))
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for tc in calls:
                    if isinstance(tc, dict):
                        out.append(self._call(tc))
        fr = ch.get("finish_reason")
        if fr is not None:
            self._finish = fr

    def _error(self, code: Any, message: str, out: list[bytes]) -> None:
        """`response.failed` for an error of the gateway's: the Response's error codes are OpenAI's fixed
        set, so any other code goes in the text."""
        if isinstance(code, str) and code and code not in _ERROR_CODES:
            message, code = f"{message} ({code})", "server_error"
        self._failed(code if isinstance(code, str) and code else "server_error", message, out)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self._item["id"], "output_index": len(self.response["output"])}

    def _open(self, kind: str, item: dict[str, Any], part: dict[str, Any] | None) -> bytes:
        out = self._close()
        self._kind, self._item, self._text = kind, item, []
        out += self._frame("response.output_item.added", {"output_index": len(self.response["output"]), "item": item})
        if part is not None:
            out += self._frame("response.content_part.added", {**self._at(), "content_index": 0, "part": part})
        return out

    def _reasoning(self, r: str) -> bytes:
        out = b""
        if self._kind != "reasoning":
            item = {"id": new_id("rs_"), "type": "reasoning", "summary": [], "content": [], "status": "in_progress"}
            out = self._open("reasoning", item, {"type": "reasoning_text", "text": ""})
        self._text.append(r)
        self._deltas += 1
        return out + self._frame("response.reasoning_text.delta", {**self._at(), "content_index": 0, "delta": r})

    def _output_text(self, text: str, logprobs: Any) -> bytes:
        out = b""
        if self._kind != "text":
            out = self._open("text", message_item([], status="in_progress"), text_part(""))
            self._where = b',"item_id":%b,"output_index":%d,"content_index":0,"delta":"' % (
                orjson.dumps(self._item["id"]),
                len(self.response["output"]),
            )
        self._text.append(text)
        self._deltas += 1
        lp = token_logprobs(logprobs.get("content") if isinstance(logprobs, dict) else None)
        if lp:
            self._item.setdefault("_logprobs", []).extend(lp)
        return out + self._frame(
            "response.output_text.delta", {**self._at(), "content_index": 0, "delta": text, "logprobs": lp}
        )

    def _call(self, tc: dict[str, Any]) -> bytes:
        i = tc.get("index", 0)
        fn = tc.get("function")
        fn = fn if isinstance(fn, dict) else {}
        out = b""
        if i not in self._calls:
            self._calls.add(i)
            cid = tc.get("id")
            cid = cid if isinstance(cid, str) and cid else new_id("call_")
            out = self._open("call", call_item(cid, str(fn.get("name") or ""), "", status="in_progress"), None)
            self._tool = i
        elif self._tool != i or self._kind != "call":
            return b""
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._text.append(args)
            self._deltas += 1
            out += self._frame("response.function_call_arguments.delta", {**self._at(), "delta": args})
        return out

    def _close(self, status: str = "completed") -> bytes:
        """End the open item: its done events, and the item (with this status) in the final output."""
        kind = self._kind
        if kind is None:
            return b""
        text = "".join(self._text)
        where = self._at()
        item = self._item
        out = b""
        if kind == "reasoning":
            done = reasoning_item(text, item["id"], status)
            part = done["content"][0]
            out += self._frame("response.reasoning_text.done", {**where, "content_index": 0, "text": text})
            out += self._frame("response.content_part.done", {**where, "content_index": 0, "part": part})
            self.turn["reasoning_content"] = (self.turn.get("reasoning_content") or "") + text
        elif kind == "text":
            lp = item.get("_logprobs") or []
            part = text_part(text, lp)
            done = message_item([part], item["id"], status)
            out += self._frame("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": lp})
            out += self._frame("response.content_part.done", {**where, "content_index": 0, "part": part})
            self.turn["content"] = (self.turn.get("content") or "") + text
        else:
            done = call_item(item["call_id"], item["name"], text, item["id"], status)
            out += self._frame(
                "response.function_call_arguments.done", {**where, "name": item["name"], "arguments": text}
            )
            self.turn.setdefault("tool_calls", []).append(
                {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": text}}
            )
        out += self._frame("response.output_item.done", {"output_index": where["output_index"], "item": done})
        self.response["output"].append(done)
        self._kind, self._item, self._text, self._tool = None, {}, [], None
        return out

    def _end(self, out: list[bytes]) -> None:
        if not self._started:
            self._start({}, out)
        if not self.response["output"] and self._kind is None:  # nothing generated: an empty message
            out.append(self._open("text", message_item([], status="in_progress"), text_part("")))
        resp = self.response
        resp["status"], resp["incomplete_details"] = status_of(self._finish)
        out.append(self._close(resp["status"]))  # the item the limit cut is incomplete too
        u = usage(self._usage)
        if u is None:  # the engine sent no count: the estimates
            u = usage({"prompt_tokens": self.estimate, "completion_tokens": self._deltas})
        resp["usage"] = u
        kind = "response.completed" if resp["status"] == "completed" else "response.incomplete"
        self.terminal = kind
        self._whole((_WHOLE[kind],), out)

    def _failed(self, code: str, message: str, out: list[bytes]) -> None:
        if not self._started:
            self._start({}, out)
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": message}
        self.terminal = "response.failed"
        self._whole((_WHOLE["response.failed"],), out)
