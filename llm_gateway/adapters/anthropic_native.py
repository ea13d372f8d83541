"""Anthropic's Messages API passed through to an engine that serves it itself (`Adapter.native_apis`).

`MessagesNativeAdapter` (an OpenAI-compatible adapter that also speaks Messages) sends the client's own
body to the engine's `/v1/messages` or `/v1/messages/count_tokens`, with `model` rewritten to the
deployment's upstream model and the engine's own key; Anthropic's streams always carry their usage, so
nothing is added. The answer comes back as the engine wrote it, but for `model`, which is the gateway's
public model name, and the message `id`, which starts with Anthropic's `msg_` (an engine's `chatcmpl-`
id becomes `msg_` + the rest), both as on the translated path; and a whole message's `stop_sequence` is
present (null) when no stop sequence matched, as in Anthropic's answers. Usage is read from the answer:
the prompt is `input_tokens` plus the cache reads and writes (Anthropic counts those apart), the
completion `output_tokens`; streamed, `message_delta`'s totals over `message_start`'s.

`MessagesRelay` passes each event's bytes through untouched (only `message_start` is re-serialized, for
the model name and the id) and reads what the service needs: the usage, the first generated output (a
non-empty text, thinking or partial-JSON delta, or a tool_use block), the text bytes (the estimate for a
stream that never reports usage), and an in-band `event: error`, which ends the stream with one error
event in Anthropic's envelope carrying the gateway's message, its type the one the translation and the
answers before a stream give that error. (The ids, the usage object and the error types are Anthropic's
wire facts, written once in wire/anthropic.py for this pass-through and the translation.) A stream that
ends before `message_stop` ends with such an error event as well: a client must never take a cut stream
for a complete answer. Errors the engine answers before a stream (its own envelope or Anthropic's) go
through the adapter's `error()`, and the gateway renders them in Anthropic's envelope. A request with a
content block the engine refuses but the translation takes (`refused_blocks`) is translated.

An engine version without the route answers FastAPI's plain 404 `{"detail": "Not Found"}`; that API is
then translated on the backend (`native_unserved`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import TokenizeClient, UpstreamRequest
from llm_gateway.adapters.error_bodies import json_object
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter, json_field
from llm_gateway.adapters.relay_base import RelayBase
from llm_gateway.errors import EngineErrorAnswer, GatewayError, StreamInterrupted, UpstreamProtocolError
from llm_gateway.types import CallContext, Usage
from llm_gateway.wire.anthropic import STOP, error_frame, message_id, usage_of

NATIVE_PATHS = {"messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}
_ROUTE_MISSING = {"detail": "Not Found"}  # FastAPI's answer for a path it has no route for


class MessagesNativeAdapter(OpenAICompatAdapter):
    """An OpenAI-compatible engine that serves Anthropic's Messages API faithfully itself."""

    native_apis: ClassVar[frozenset[str]] = frozenset(NATIVE_PATHS)
    #: content blocks the engine refuses that the gateway's translation takes: a request with one is translated
    refused_blocks: ClassVar[frozenset[str]] = frozenset()

    def speaks_natively(self, api: str, body: dict[str, Any] | None = None) -> bool:
        if not super().speaks_natively(api, body):
            return False
        return body is None or not self.refused_blocks or not _has_block(body, self.refused_blocks)

    def build_native(self, api: str, body: dict[str, Any], ctx: CallContext) -> UpstreamRequest:
        b = dict(body)
        b["model"] = ctx.upstream_model
        headers = {**self.headers, "X-Request-Id": ctx.request_id}
        return UpstreamRequest("POST", NATIVE_PATHS[api], headers, orjson.dumps(b))

    def native_response_body(self, api: str, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        obj = json_object(body, self.backend.name, self.kind)
        if obj.get("type") == "error":
            raise self.error_from_frame(obj)
        obj["model"] = ctx.public_model
        obj["id"] = message_id(obj.get("id"))
        obj.setdefault("stop_sequence", None)
        return orjson.dumps(obj), usage_of(obj.get("usage"))

    def native_relay(self, api: str, ctx: CallContext) -> MessagesRelay:
        return MessagesRelay(ctx, self.error_from_frame)

    def native_unserved(self, api: str, status: int, body: bytes) -> bool:
        if status != 404:
            return False
        try:
            return bool(orjson.loads(body) == _ROUTE_MISSING)
        except orjson.JSONDecodeError:
            return False

    async def count_native_tokens(
        self, client: TokenizeClient, body: dict[str, Any], chat_body: dict[str, Any], upstream_model: str
    ) -> int | None:
        req = {**body, "model": upstream_model}
        status, data = await client.post(NATIVE_PATHS["count_tokens"], orjson.dumps(req), self.headers)
        if self.native_unserved("count_tokens", status, data):
            self.unserved.add("count_tokens")
            return await self.count_prompt_tokens(client, chat_body, upstream_model)
        n = json_field(data, "input_tokens") if status == 200 else None
        return n if isinstance(n, int) and not isinstance(n, bool) else None


def _has_block(body: dict[str, Any], types: frozenset[str]) -> bool:
    """Does a Messages body hold a content block of one of `types` (in a message, or in a tool result)?"""
    messages = body.get("messages")
    for m in messages if isinstance(messages, list) else ():
        blocks = m.get("content") if isinstance(m, dict) else None
        for b in blocks if isinstance(blocks, list) else ():
            if not isinstance(b, dict):
                continue
            if b.get("type") in types:
                return True
            inner = b.get("content")
            if isinstance(inner, list) and any(isinstance(c, dict) and c.get("type") in types for c in inner):
                return True
    return False


_INDEX = re.compile(rb'"index": ?(\d+)')
# the strings of a content_block_delta that carry generated text (escapes included, as sent)
_TEXT = re.compile(rb'"(?:text|thinking|partial_json)": ?"((?:[^"\\]|\\.)*)"')


class MessagesRelay(RelayBase):
    """One Anthropic event stream on its way to the client; see the module docstring."""

    __slots__ = ("_on_error", "_open", "_started")

    oversized: ClassVar[str] = "the engine sent an event"

    def __init__(self, ctx: CallContext, on_error: Callable[[Mapping[str, Any]], EngineErrorAnswer]) -> None:
        super().__init__(ctx)
        self._on_error = on_error
        self._started: dict[str, Any] = {}  # message_start's usage
        self._open: bytes | None = None  # the index of the content block started and not stopped yet

    def cut(self, choices: int, prompt_tokens: int) -> bytes:
        """The message ended as Anthropic ends one at `max_tokens`: the open block stopped, `message_delta`
        with stop_reason `max_tokens` and the output so far (estimated), `message_stop`."""
        self.done = self._closed = True
        out = b""
        if self._open is not None:
            out += b'event: content_block_stop\ndata: {"type":"content_block_stop","index":' + self._open + b"}\n\n"
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
            "usage": {"output_tokens": self.completion_estimate()},
        }
        out += b"event: message_delta\ndata: " + orjson.dumps(delta) + b"\n\n"
        return out + STOP

    def _fail(self, err: GatewayError) -> bytes:
        self._closed = True
        self.error = err
        return error_frame(err)

    def feed(self, data: bytes) -> bytes:
        if self._closed:
            return b""
        buf = self._buf + data if self._buf else data
        if buf.find(b"\r") >= 0:  # `find`, not `in`: see sse_relay.py
            tail = b"\r" if buf.endswith(b"\r") else b""
            buf = buf[: len(buf) - len(tail)].replace(b"\r\n", b"\n") + tail
        end = buf.rfind(b"\n\n")
        if end < 0:
            return self._hold(buf)
        self._buf = buf[end + 2 :]
        out: list[bytes] = []
        for raw in buf[:end].split(b"\n\n"):
            if self._closed:
                break
            if raw.strip(b"\n"):
                out.append(self._event(raw.strip(b"\n")))
        return b"".join(out)

    def _event(self, raw: bytes) -> bytes:
        name, payload = _parts(raw)
        if payload is None:
            return b""  # a comment, or an event without data
        if name is None:  # no `event:` line: the type is in the data
            name = _type_of(payload)
        if name == b"content_block_delta":
            self.content_events += 1
            spans = [m.end(1) - m.start(1) for m in _TEXT.finditer(payload)]
            self.text_bytes += sum(spans)
            if not self.output_started and any(spans):
                self.output_started = True
            return raw + b"\n\n"
        if name == b"content_block_start":
            if not self.output_started and payload.find(b'"tool_use"') >= 0:
                self.output_started = True
            m = _INDEX.search(payload)
            self._open = m.group(1) if m else None
            return raw + b"\n\n"
        if name == b"content_block_stop":
            self._open = None
            return raw + b"\n\n"
        if name not in (b"message_start", b"message_delta", b"message_stop", b"error"):
            return raw + b"\n\n"  # ping, content_block_stop, and events to come: as they are
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self._fail(UpstreamProtocolError("the engine sent an event that is not valid JSON"))
        if not isinstance(obj, dict):
            return self._fail(UpstreamProtocolError("the engine sent an event that is not a JSON object"))
        if name == b"error":
            return self._fail(self._on_error(obj))
        if name == b"message_stop":
            self.done = self._closed = True
            return raw + b"\n\n"
        if name == b"message_delta":  # its counts are totals; those it leaves out stay message_start's
            u = obj.get("usage")
            self.usage = usage_of({**self._started, **u} if isinstance(u, dict) else None) or self.usage
            return raw + b"\n\n"
        msg = obj.get("message")
        if isinstance(msg, dict):
            msg["model"] = self._ctx.public_model
            msg["id"] = message_id(msg.get("id"))
            u = msg.get("usage")
            self._started = u if isinstance(u, dict) else {}
        return b"event: message_start\ndata: " + orjson.dumps(obj) + b"\n\n"

    def _last(self, rest: bytes) -> bytes:
        """An event the engine did not terminate: taken if its data is whole JSON, else the stream failed."""
        raw = rest.strip(b"\n")
        _, payload = _parts(raw)
        if payload is not None:
            try:
                orjson.loads(payload)
            except orjson.JSONDecodeError:
                return self._fail(StreamInterrupted("the engine's stream ended in the middle of an event"))
        return self._event(raw)

    def _end(self) -> bytes:
        if self.done:
            return b""
        return self._fail(StreamInterrupted("the engine's stream ended before the answer was complete"))


def _parts(raw: bytes) -> tuple[bytes | None, bytes | None]:
    """(event name, data) of one SSE event; either is None when absent."""
    name: bytes | None = None
    data: list[bytes] = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data:"):
            v = line[5:]
            data.append(v[1:] if v.startswith(b" ") else v)
        elif line.startswith(b"event:"):
            name = line[6:].strip()
    return name, (b"\n".join(data) if data else None)


_TYPE = re.compile(rb'^\{\s*"type"\s*:\s*"([a-z_]+)"')


def _type_of(payload: bytes) -> bytes | None:
    m = _TYPE.match(payload)
    if m:
        return m.group(1)
    t = json_field(payload, "type")
    return t.encode() if isinstance(t, str) else None
