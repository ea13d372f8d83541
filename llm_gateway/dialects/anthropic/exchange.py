"""Anthropic's Messages API on the gateway: `POST /v1/messages` and `/v1/messages/count_tokens`.

The request is validated and translated into an OpenAI chat body (`ingress.anthropic_request`) and
handed to the same `GenerationService.handle` as `/v1/chat/completions`, so keys, limits, routing,
retries, failover, metrics and usage accounting are exactly the chat path's. The client's own body
goes along (`AnthropicExchange` is also the service's `NativeDialect`): a deployment whose engine
serves Messages faithfully itself (its adapter's `native_apis`) gets that body, and its answer is
already Anthropic's; any other gets the chat translation. The service says which before it answers
(`answer_natively`), per request, as failover may cross both kinds. The dialect is applied at the
service's own seam: `AnthropicExchange` implements `ClientExchange` over the real `Call` and passes a
native answer through, or translates what the service answers into Anthropic's message and event stream: a
whole OpenAI chat completion here, a stream by the relay, which drives the stream's translation
(`translation()`: dialects/anthropic/stream.py) with the engine's events as it reads them. Errors raised
before the answer starts are rendered in Anthropic's envelope by the app (asgi.py's `DIALECTS`), the chat
fields they name as Messages' own (`ingress.error_names`: `stop` is `stop_sequences`...), errors after it
by the native relay or the stream translation. The request's model is recorded as soon as the body parsed,
so that a 400 of its translation is counted under it. count_tokens counts by the engine (natively where it
serves that too). Keys come as `x-api-key` or `Authorization: Bearer`; `anthropic-version` and
`anthropic-beta` are accepted whatever their value.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.anthropic.request import MessagesRequest, to_chat
from llm_gateway.dialects.anthropic.response import message_bytes
from llm_gateway.dialects.anthropic.stream import StreamTranslator
from llm_gateway.dialects.common import (
    HandlerContext,
    authenticate,
    read_json_and_bytes,
    record_model,
)
from llm_gateway.dialects.error_names import MESSAGES, renamed
from llm_gateway.errors import GatewayError
from llm_gateway.exchange import JSON, Headers
from llm_gateway.http.call import Call, CallExchange
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service.runtime import Runtime

TOKEN_COUNT_HEADER = b"x-gateway-token-count"  # "engine" (its own tokenizer) or "estimate" (the gateway's)


class AnthropicExchange(CallExchange):
    """The service's `ClientExchange` (and `NativeDialect`) for one Anthropic request: answers go out in
    Anthropic's dialect, passed through when the engine answered natively, else translated."""

    __slots__ = ("_native", "_req", "_stream", "native_body")

    native_api = "messages"

    def __init__(self, call: Call, req: MessagesRequest, body: dict[str, Any]) -> None:
        super().__init__(call)
        self._req = req
        self._stream: StreamTranslator | None = None
        self._native = False
        self.native_body = body

    def limit_output(self, max_tokens: int) -> None:
        mt = self.native_body.get("max_tokens")
        if not isinstance(mt, int) or mt > max_tokens:  # a new dict: the client's stays as it came
            self.native_body = {**self.native_body, "max_tokens": max_tokens}

    def answer_natively(self, native: bool) -> None:
        self._native = native
        if native:
            self._stream = None  # a translation begun for a queued stream's comments: the engine's bytes now

    async def respond(self, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
        if 200 <= status < 300 and content_type == JSON and not self._native:
            body = message_bytes(body, self._req.stop_sequences)
        headers.append((b"request-id", self.rid.encode()))
        await self._call.respond(status, body, headers, content_type)

    async def start(self, status: int, headers: Headers, *, hold: bool = False) -> None:
        if not self._native and self._stream is None:
            self._stream = StreamTranslator(self._req.stop_sequences, self._req.prompt_estimate)
        headers.append((b"request-id", self.rid.encode()))
        await self._call.start(status, headers, hold=hold)

    def translation(self) -> StreamTranslator | None:
        """The stream's translation, for the relay to drive (None: the engine answers natively): from now on
        what is written is Anthropic's already."""
        if self._native:
            return None
        if self._stream is None:
            self._stream = StreamTranslator(self._req.stop_sequences, self._req.prompt_estimate)
        self._relayed = True
        return self._stream

    async def write(self, data: bytes) -> None:
        stream = self._stream
        if stream is not None and not self._relayed:  # the service's own OpenAI SSE (a queued stream's)
            data = stream.feed(data)
        if data:
            await self._call.write(data)

    async def end(self, data: bytes = b"") -> None:
        stream = self._stream
        if stream is None:  # native: Anthropic's already
            await self._call.end(data)
            return
        if data and not self._relayed:
            data = stream.feed(data)
        await self._call.end(data + stream.finish())


async def messages(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "messages"
    who = authenticate(call, rec, rt)
    body, raw = await read_json_and_bytes(ctx, call)
    record_model(rec, rt, body)
    req = to_chat(body, raw=raw)
    exchange = AnthropicExchange(call, req, body)
    try:
        await ctx.service.handle(exchange, rec, rt, "chat", req.body, who, native=exchange, gathered=req.gathered)
    except GatewayError as e:
        raise renamed(e, MESSAGES) from None


async def count_tokens(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    body, raw = await read_json_and_bytes(ctx, call)
    req = to_chat(body, count_only=True, raw=raw)
    try:
        n, source = await ctx.service.count_prompt_tokens(
            call, rec, rt, req.body, who, native_body=body, gathered=req.gathered
        )
    except GatewayError as e:
        raise renamed(e, MESSAGES) from None
    headers = [
        (b"x-request-id", call.rid.encode()),
        (b"request-id", call.rid.encode()),
        (TOKEN_COUNT_HEADER, source.encode()),
    ]
    if rec.backend != "none":
        headers.append((b"x-gateway-backend", rec.backend.encode()))
    await call.respond(200, orjson.dumps({"input_tokens": n}), headers)
