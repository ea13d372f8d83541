"""Reading the gateway's own OpenAI SSE stream (what the service writes) event by event.

The stream translations (Anthropic's events, the Responses API's events) get the service's writes
as they come; `ChatEvents.feed` returns the events completed so far, holding a partial event until the
rest arrives, and `parse_event` parses one once: its JSON object, or `[DONE]` as the `DONE` marker;
what is not JSON (nothing the relays pass) says nothing.

The token events of a stream differ only in their text, so a translation may learn their bytes around
the text from one it parsed (`token_envelope`) and then take the next one's text without
parsing it (`text_in`): the text is copied as the engine escaped it, checked to be a valid JSON string.
"""

from __future__ import annotations

import re
from typing import Any, Final

import orjson

DONE: Final = "[DONE]"


def data_of(raw: bytes) -> bytes | None:
    """The data of one SSE event (its `data:` lines joined), or None where it has none."""
    raw = raw.strip(b"\n")
    if raw.startswith(b"data: ") and raw.find(b"\n") < 0:  # `find`: see adapters/sse_relay.py
        return raw[6:]
    parts = [line[5:].removeprefix(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


def parse_event(raw: bytes) -> dict[str, Any] | str | None:
    """One SSE event of the service's stream: its JSON object, `DONE`, or None (no data, not JSON)."""
    payload = data_of(raw)
    if payload is None:
        return None
    if payload == b"[DONE]":
        return DONE
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


class ChatEvents:
    """Splits the service's writes into whole events."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The whole events completed by `data` (their bytes, without the blank line that ends each); a
        partial one is held until the rest arrives."""
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 2 :]
        return buf[:end].split(b"\n\n")


# the `content` string of a chat chunk, and the text inside it (escapes included, as sent)
_CONTENT = re.compile(rb'"content": ?"((?:[^"\\]|\\.)*)"')
_CHOICE_KEYS = frozenset(("index", "delta", "logprobs", "finish_reason"))


def plain_text(obj: dict[str, Any]) -> str | None:
    """The text of an ordinary token chunk: one choice whose delta is a non-empty `content` and nothing
    else, no finish, no logprobs, no usage, no error; None for any other chunk."""
    if obj.get("usage") is not None or "error" in obj:
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    ch = choices[0]
    if ch.keys() - _CHOICE_KEYS or ch.get("finish_reason") is not None or ch.get("logprobs") is not None:
        return None
    delta = ch.get("delta")
    if not isinstance(delta, dict) or delta.keys() != {"content"}:
        return None
    text = delta["content"]
    return text if isinstance(text, str) and text else None


def text_envelope(event: bytes, text: str) -> tuple[bytes, bytes] | None:
    """The bytes of `event` (one whole SSE event, as `ChatEvents.feed` gives it) before and after its one
    `content` string's text, when that string is `text`; None when there is not exactly one such string."""
    spans = [m.span(1) for m in _CONTENT.finditer(event)]
    if len(spans) != 1:
        return None
    a, b = spans[0]
    try:
        same = orjson.loads(b'"' + event[a:b] + b'"') == text
    except orjson.JSONDecodeError:
        return None
    return (event[:a], event[b:]) if same else None


def token_envelope(event: bytes, obj: dict[str, Any]) -> tuple[bytes, bytes] | None:
    """`text_envelope` of `event` (parsed: `obj`) when it is a plain token (`plain_text`), else None."""
    text = plain_text(obj)
    return text_envelope(event, text) if text is not None else None


def text_in(data: bytes, before: bytes, after: bytes) -> tuple[bytes, str] | None:
    """The text of `data`, as sent (a valid JSON string's inside, escapes included) and decoded, when `data`
    is `before` + a non-empty text with no quote + `after`; None otherwise (parse it)."""
    if not (data.startswith(before) and data.endswith(after)):
        return None
    a, b = len(before), len(data) - len(after)
    if a >= b:
        return None
    text = data[a:b]
    if text.find(b'"') >= 0:
        return None
    try:  # escapes, control characters, UTF-8: what parsing the whole event would have refused
        decoded = orjson.loads(b'"' + text + b'"')
    except orjson.JSONDecodeError:
        return None
    return text, decoded
