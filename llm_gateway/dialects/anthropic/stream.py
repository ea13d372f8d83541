"""The gateway's OpenAI SSE stream (what the service writes) as Anthropic's stream of events.

Anthropic's order: `message_start` (usage: the input estimate until the engine's count arrives),
`ping`, then per content block `content_block_start`, `content_block_delta`s (`thinking_delta` for
the engine's reasoning, `text_delta`, `input_json_delta` for a tool call's arguments) and
`content_block_stop`; at the end `message_delta` (stop_reason, stop_sequence, and usage with the
engine's real input and output counts) and `message_stop`. A block ends when output of another kind
starts. An error event in the OpenAI stream (the engine failed after the first byte) becomes
Anthropic's `event: error` with its envelope, and nothing follows it. Frames are
`event: NAME\\ndata: JSON\\n\\n`.

The stream relay drives it (`wire/chat_events.ChatTranslation`): the engine's events as it passes them
(`feed`: bytes, each event parsed once here), the chunks it parsed or made itself (`event`), its end
(`end`) or its failure (`fail`: the gateway's error, typed by wire/anthropic.py), and an ordinary token
whose shape it has learnt (`token`): its text as the engine escaped it, which becomes the open text
block's `text_delta` between the frame's own bytes, unparsed. Nothing reaches it as OpenAI SSE that was
written only to be read back here.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.anthropic.response import REASONING_KEYS, matched_stop, stop_reason
from llm_gateway.errors import GatewayError
from llm_gateway.wire.anthropic import (
    PING,
    STOP,
    anthropic_usage,
    envelope,
    error_frame,
    error_type_of,
    frame,
    message_id,
    tool_use_id,
)
from llm_gateway.wire.chat_events import ChatEvents, parse_event

#: what `frame` writes before and after a text_delta's text (the block's index in the head)
_TEXT_DELTA_HEAD = (
    b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":"'
)
_TEXT_DELTA_END = b'"}}\n\n'


class StreamTranslator:
    """One stream's translation (a `ChatTranslation`): the relay's events in, Anthropic's frames out."""

    __slots__ = (
        "_blocks",
        "_deltas",
        "_done",
        "_events",
        "_finish",
        "_head",
        "_index",
        "_matched",
        "_open",
        "_started",
        "_stops",
        "_tool",
        "_tools",
        "_usage",
        "estimate",
    )

    def __init__(self, stops: tuple[str, ...], prompt_estimate: int) -> None:
        self._stops = stops
        self.estimate = prompt_estimate
        self._events = ChatEvents()
        self._started = False  # message_start sent
        self._done = False  # message_stop or an error sent: nothing more
        self._index = -1  # the index of the last block started
        self._open: str | None = None  # the kind of the open block: "thinking", "text" or "tool_use"
        self._tool: int | None = None  # the OpenAI index of the tool call whose block is open
        self._tools: set[int] = set()  # OpenAI tool call indices seen
        self._blocks = 0
        self._deltas = 0  # content deltas: the output estimate when the engine sends no usage
        self._finish: Any = None
        self._matched: Any = None
        self._usage: Any = None
        #: the open text block's `text_delta` frame up to its text (made when the block starts)
        self._head = b""

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, data: bytes) -> bytes:
        """OpenAI SSE events (a partial one is held until the rest comes), each parsed once."""
        if self._done:
            return b""
        out: list[bytes] = []
        for raw in self._events.feed(data):
            if self._done:
                break
            ev = parse_event(raw)  # the relay passes only JSON events: nothing else can be told to the client
            if ev is None:
                continue
            out.append(self._event(ev) if isinstance(ev, dict) else self._end())
        return b"".join(out)

    def event(self, obj: dict[str, Any]) -> bytes:
        """One chat chunk the relay parsed or made."""
        return b"" if self._done else self._event(obj)

    def token(self, text: bytes) -> bytes | None:
        """An ordinary token (`wire.chat_events.plain_text`), its text as sent: the open text block's
        `text_delta`, copied as the engine escaped it; None where it must be parsed (no text block open,
        or a text that is not a valid JSON string's inside)."""
        if self._open != "text":
            return None
        if not text:
            return b""  # no text: no delta, as parsing says
        try:  # escapes, control characters, UTF-8: what parsing the whole event would have refused
            orjson.loads(b'"' + text + b'"')
        except orjson.JSONDecodeError:
            return None
        self._deltas += 1
        return self._head + text + _TEXT_DELTA_END

    def end(self) -> bytes:
        """The chat stream's `[DONE]`: the closing events."""
        return b"" if self._done else self._end()

    def fail(self, err: GatewayError) -> bytes:
        """The stream failed after its first byte: Anthropic's error event, and nothing after it."""
        if self._done:
            return b""
        self._done = True
        return error_frame(err)

    def finish(self) -> bytes:
        """At the end of the service's stream: the closing events, unless they (or an error) went out."""
        if self._done:
            return b""
        return self._end()

    # -- events --------------------------------------------------------------------------------------
    def _event(self, obj: dict[str, Any]) -> bytes:
        err = obj.get("error")
        if err is not None and "choices" not in obj:
            self._done = True
            e = err if isinstance(err, dict) else {"message": str(err)}
            return frame(b"error", envelope(error_type_of(e), str(e.get("message") or "the stream failed")))
        out = b"" if self._started else self._start(obj)
        if obj.get("usage") is not None:
            self._usage = obj["usage"]
        choices = obj.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return out
        ch = choices[0]
        delta = ch.get("delta")
        if isinstance(delta, dict):
            for key in REASONING_KEYS:
                r = delta.get(key)
                if isinstance(r, str) and r:
                    out += self._delta("thinking", {"type": "thinking_delta", "thinking": r})
                    break
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._delta("text", {"type": "text_delta", "text": text})
            calls = delta.get("tool_calls")
            if isinstance(calls, list):
                for tc in calls:
                    if isinstance(tc, dict):
                        out += self._tool_delta(tc)
        fr = ch.get("finish_reason")
        if fr is not None:
            self._finish = fr
            self._matched = matched_stop(ch)
        return out

    def _start(self, obj: dict[str, Any]) -> bytes:
        self._started = True
        message: dict[str, Any] = {
            "id": message_id(obj.get("id")),
            "type": "message",
            "role": "assistant",
            "model": obj.get("model"),
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": anthropic_usage({"prompt_tokens": self.estimate, "completion_tokens": 0}),  # the estimate
        }
        return frame(b"message_start", {"type": "message_start", "message": message}) + PING

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        self._open, self._tool = None, None
        return frame(b"content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _begin(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close()
        self._index += 1
        self._blocks += 1
        self._open = kind
        return out + frame(
            b"content_block_start", {"type": "content_block_start", "index": self._index, "content_block": block}
        )

    def _delta(self, kind: str, delta: dict[str, Any]) -> bytes:
        out = b""
        if self._open != kind:
            out = self._begin(kind, {"type": "text", "text": ""} if kind == "text" else _THINKING_BLOCK)
            if kind == "text":
                self._head = _TEXT_DELTA_HEAD % self._index
        self._deltas += 1
        return out + self._block_delta(delta)

    def _block_delta(self, delta: dict[str, Any]) -> bytes:
        return frame(b"content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta})

    def _tool_delta(self, tc: dict[str, Any]) -> bytes:
        i = tc.get("index", 0)
        fn = tc.get("function")
        fn = fn if isinstance(fn, dict) else {}
        out = b""
        if i not in self._tools:  # a new tool call: its id and name come with its first fragment
            self._tools.add(i)
            tid = tc.get("id")
            out = self._begin(
                "tool_use",
                {
                    "type": "tool_use",
                    "id": tid if isinstance(tid, str) and tid else tool_use_id(),
                    "name": str(fn.get("name") or ""),
                    "input": {},
                },
            )
            self._tool = i
        elif self._tool != i:
            return b""  # a fragment of a call whose block has closed: Anthropic's stream cannot reopen it
        args = fn.get("arguments")
        if isinstance(args, str) and args:
            self._deltas += 1
            out += self._block_delta({"type": "input_json_delta", "partial_json": args})
        return out

    def _end(self) -> bytes:
        out = b"" if self._started else self._start({})
        out += self._close()
        self._done = True
        reason, seq = stop_reason(self._finish, bool(self._tools), self._matched, self._stops)
        if self._usage is not None:
            u: dict[str, int] = anthropic_usage(self._usage)
        else:  # the engine sent no count: the estimates
            u = {"input_tokens": self.estimate, "output_tokens": self._deltas}
        md = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": u}
        return out + frame(b"message_delta", md) + STOP


_THINKING_BLOCK = {"type": "thinking", "thinking": "", "signature": ""}
