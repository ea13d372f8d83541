"""Reading the gateway's own OpenAI SSE stream (what the service writes) event by event.

The stream translations (Anthropic's events, the Responses API's events) get the service's writes
as they come; `ChatEvents.feed` returns the JSON events completed so far, parsed once, holding a
partial event until the rest arrives. `[DONE]` comes back as the `DONE` marker; what is not JSON
(nothing the relays pass) is skipped.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

DONE: Final = "[DONE]"


def data_of(raw: bytes) -> bytes | None:
    """The data of one SSE event (its `data:` lines joined), or None where it has none."""
    raw = raw.strip(b"\n")
    if raw.startswith(b"data: ") and b"\n" not in raw:
        return raw[6:]
    parts = [line[5:].removeprefix(b" ") for line in raw.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(parts) if parts else None


class ChatEvents:
    """Splits the service's writes into whole events."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[dict[str, Any] | str]:
        buf = self._buf + data if self._buf else data
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return []
        self._buf = buf[end + 2 :]
        out: list[dict[str, Any] | str] = []
        for raw in buf[: end + 2].split(b"\n\n"):
            payload = data_of(raw)
            if payload is None:
                continue
            if payload == b"[DONE]":
                out.append(DONE)
                continue
            try:
                obj = orjson.loads(payload)
            except orjson.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out
