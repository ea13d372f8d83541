"""Anthropic's Messages API on the gateway: `POST /v1/messages` and `/v1/messages/count_tokens`.

The request is translated into an OpenAI chat body (`ingress.anthropic_request`) and handed to the
same `GenerationService.handle` as `/v1/chat/completions`, so keys, limits, routing, retries,
failover, metrics and usage accounting are exactly the chat path's. The dialect is applied at the
service's own seam: `AnthropicExchange` implements `ClientExchange` over the real `Call` and
translates what the service answers (a whole OpenAI chat completion, or OpenAI SSE written chunk by
chunk) into Anthropic's message and event stream. Errors raised before the answer starts are
rendered in Anthropic's envelope by the app (asgi.py's `DIALECTS`), errors after it by the stream
translation. Keys come as `x-api-key` or `Authorization: Bearer`; `anthropic-version` and
`anthropic-beta` are accepted whatever their value.
"""

from __future__ import annotations

import orjson

from llm_gateway.exchange import JSON, Headers
from llm_gateway.http.call import Call
from llm_gateway.http.handlers import HandlerContext, authenticate, read_json_object
from llm_gateway.ingress.anthropic_request import MessagesRequest, to_chat
from llm_gateway.ingress.anthropic_response import message_bytes
from llm_gateway.ingress.anthropic_stream import StreamTranslator
from llm_gateway.observability.record import RequestRecord
from llm_gateway.runtime import Runtime

TOKEN_COUNT_HEADER = b"x-gateway-token-count"  # "engine" (its own tokenizer) or "estimate" (the gateway's)


class AnthropicExchange:
    """The service's `ClientExchange` for one Anthropic request: answers go out in Anthropic's dialect."""

    __slots__ = ("_call", "_req", "_stream", "rid")

    def __init__(self, call: Call, req: MessagesRequest) -> None:
        self._call = call
        self._req = req
        self._stream: StreamTranslator | None = None
        self.rid = call.rid

    @property
    def status(self) -> int:
        return self._call.status

    @status.setter
    def status(self, value: int) -> None:
        self._call.status = value

    def header(self, name: bytes) -> bytes | None:
        return self._call.header(name)

    async def respond(self, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
        if 200 <= status < 300 and content_type == JSON:
            body = message_bytes(body, self._req.stop_sequences)
        headers.append((b"request-id", self.rid.encode()))
        await self._call.respond(status, body, headers, content_type)

    async def start(self, status: int, headers: Headers) -> None:
        self._stream = StreamTranslator(self._req.stop_sequences, self._req.prompt_estimate)
        headers.append((b"request-id", self.rid.encode()))
        await self._call.start(status, headers)

    async def write(self, data: bytes) -> None:
        assert self._stream is not None, "write() before start()"
        out = self._stream.feed(data)
        if out:
            await self._call.write(out)

    async def end(self) -> None:
        if self._stream is not None:
            tail = self._stream.finish()
            if tail:
                await self._call.write(tail)
        await self._call.end()

    def watch_disconnect(self, delay_s: float = 0.0) -> None:
        self._call.watch_disconnect(delay_s)

    def stop_watching(self) -> None:
        self._call.stop_watching()


async def messages(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "chat"
    who = authenticate(call, rec, rt)
    req = to_chat(await read_json_object(ctx, call))
    await ctx.service.handle(AnthropicExchange(call, req), rec, rt, "chat", req.body, who)


async def count_tokens(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    req = to_chat(await read_json_object(ctx, call), count_only=True)
    n, source = await ctx.service.count_prompt_tokens(call, rec, rt, req.body, who)
    headers = [
        (b"x-request-id", call.rid.encode()),
        (b"request-id", call.rid.encode()),
        (TOKEN_COUNT_HEADER, source.encode()),
    ]
    if rec.backend != "none":
        headers.append((b"x-gateway-backend", rec.backend.encode()))
    await call.respond(200, orjson.dumps({"input_tokens": n}), headers)
