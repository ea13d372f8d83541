"""The gateway's OpenAI chat stream as events, for the translations into other APIs' streams.

The gateway answers every generation in OpenAI's chat dialect (its hub: N engines and M client APIs
make N + M translators, not N x M), and a client of another API (Anthropic's Messages, the Responses
API) gets that stream translated. The translation is a `ChatTranslation` that the engine's stream relay
drives event by event, so nothing is written as OpenAI SSE only to be read back: the relay hands over
the engine's events as bytes once (`feed`, each parsed there once), the chunks it parsed or made itself
as objects (`event`), the end (`end`) and a failure as the gateway's error (`fail`), and, for the
commonest event, an ordinary token (`plain_text`) whose shape it has learnt (adapters/sse_relay.py,
the one envelope learner), only its text as the engine escaped it (`token`). Its output is the client's
bytes, which the service writes as they are.

`ChatEvents` splits OpenAI SSE bytes into whole events (holding a partial one until the rest arrives),
and `parse_event` parses one: its JSON object, or `[DONE]` as the `DONE` marker; what is not JSON says
nothing. Both are what a translation's `feed` uses, for the relay's bytes and for what the service
writes itself before a relay exists (a queued stream's comments and its failure: service/queue_progress).
"""

from __future__ import annotations

from typing import Any, Final, Protocol, runtime_checkable

import orjson

from llm_gateway.errors import GatewayError
from llm_gateway.wire.sse_bytes import DONE_DATA, data_of

DONE: Final = "[DONE]"  # `parse_event`'s marker for the end-of-stream event (whose bytes are errors.DONE)


class ChatTranslation(Protocol):
    """One stream's translation of the gateway's OpenAI chat stream into another API's events, each method
    returning the client's bytes for it (possibly none); nothing once it has ended or failed."""

    @property
    def done(self) -> bool:
        """The translation has sent its last event (the end, or an error)."""
        ...

    def feed(self, data: bytes) -> bytes:
        """OpenAI SSE events as the engine sent them (a partial one held until the rest comes)."""
        ...

    def event(self, obj: dict[str, Any]) -> bytes:
        """One chat chunk, parsed or made by the relay."""
        ...

    def token(self, text: bytes) -> bytes | None:
        """An ordinary token (one choice, its delta only a `content` string: `plain_text`), given as that
        string's inside as sent (no quote, no line break; escapes as the engine wrote them); None when the
        translation cannot take it so (then its event is `feed` whole)."""
        ...

    def end(self) -> bytes:
        """The chat stream's `[DONE]`."""
        ...

    def fail(self, err: GatewayError) -> bytes:
        """The stream failed after its first byte: the API's error event, and nothing after it."""
        ...

    def finish(self) -> bytes:
        """The service's end of the stream: the closing events, unless they (or an error) went out."""
        ...


@runtime_checkable
class Translating(Protocol):
    """A client exchange whose client speaks another API than OpenAI's: the stream relay translates for it."""

    def translation(self) -> ChatTranslation | None:
        """The stream's translation, for the relay to drive from its first chunk (None: no translation, the
        engine answers in the client's API itself); what the relay writes after is the client's bytes."""
        ...


def parse_event(raw: bytes) -> dict[str, Any] | str | None:
    """One SSE event of the service's stream: its JSON object, `DONE`, or None (no data, not JSON)."""
    payload = data_of(raw)
    if payload is None:
        return None
    if payload == DONE_DATA:
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
