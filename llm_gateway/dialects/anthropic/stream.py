"""The gateway's OpenAI SSE stream (what the service writes) as Anthropic's stream of events.

Anthropic's order: `message_start` (usage: the input estimate until the engine's count arrives),
`ping`, then per content block `content_block_start`, `content_block_delta`s (`thinking_delta` for
the engine's reasoning, `text_delta`, `input_json_delta` for a tool call's arguments) and
`content_block_stop`; at the end `message_delta` (stop_reason, stop_sequence, and usage with the
engine's real input and output counts) and `message_stop`. A block ends when output of another kind
starts. An error event in the OpenAI stream (the engine failed after the first byte) becomes
Anthropic's `event: error` with its envelope, and nothing follows it. Frames are
`event: NAME\\ndata: JSON\\n\\n`. Each OpenAI event is parsed once; the service writes whole events
(a partial one is held until the rest comes). Once a text block is open, a token event shaped like the
last one parsed (chat_events.text_in) becomes its `text_delta` without being parsed: the text as the
engine escaped it, between the frame's own bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.anthropic.response import (
    REASONING_KEYS,
    envelope,
    error_type_of,
    matched_stop,
    message_id,
    stop_reason,
    usage,
)
from llm_gateway.wire.chat_events import ChatEvents, parse_event, text_in, token_envelope

PING = b'event: ping\ndata: {"type":"ping"}\n\n'
STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_TEXT_DELTA_END = b'"}}\n\n'  # what `frame` writes after a text_delta's text
_MAX_LEARNS = 16  # token envelopes learnt per stream (again when one changes, as `created` does each second)


def frame(name: bytes, obj: dict[str, Any]) -> bytes:
    return b"event: " + name + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


class StreamTranslator:
    """One stream's translation: `feed()` each write of the service, `finish()` at its end."""

    __slots__ = (
        "_blocks",
        "_deltas",
        "_done",
        "_env",
        "_events",
        "_finish",
        "_index",
        "_learns",
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
        #: a token event's bytes before and after its text, the frame's bytes before it, and the block index
        self._env: tuple[bytes, bytes, bytes, int] | None = None
        self._learns = 0

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, data: bytes) -> bytes:
        if self._done:
            return b""
        out: list[bytes] = []
        env = self._env
        for raw in self._events.feed(data):
            if self._done:
                break
            if env is not None and self._index == env[3]:  # that text block is still the open one
                got = text_in(raw, env[0], env[1])
                if got is not None:  # a token like the last one parsed: its text_delta, unparsed
                    self._deltas += 1
                    out.append(env[2] + got[0] + _TEXT_DELTA_END)
                    continue
            ev = parse_event(raw)  # the relay passes only JSON events: nothing else can be told to the client
            if ev is None:
                continue
            if not isinstance(ev, dict):  # DONE
                out.append(self._end())
                continue
            out.append(self._event(ev))
            if self._open == "text" and self._learns < _MAX_LEARNS and self._learn(raw, ev):
                env = self._env
        return b"".join(out)

    def _learn(self, event: bytes, obj: dict[str, Any]) -> bool:
        """Learn the shape of `event` if it is a plain token (its text now in the open text block)."""
        found = token_envelope(event, obj)
        env = self._env
        if found is None or (env is not None and env[3] == self._index and env[:2] == found):
            return False  # not a token, or the shape already known (a token parsed for its text: a quote)
        self._learns += 1
        head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":%d' % self._index
        self._env = (*found, head + b',"delta":{"type":"text_delta","text":"', self._index)
        return True

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
            "usage": {
                "input_tokens": self.estimate,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
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
                    "id": tid if isinstance(tid, str) and tid else message_id(None).replace("msg_", "toolu_", 1),
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
            u: dict[str, int] = usage(self._usage)
        else:  # the engine sent no count: the estimates
            u = {"input_tokens": self.estimate, "output_tokens": self._deltas}
        md = {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": u}
        return out + frame(b"message_delta", md) + STOP


_THINKING_BLOCK = {"type": "thinking", "thinking": "", "signature": ""}
