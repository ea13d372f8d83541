"""OpenAI's Responses API on the gateway: `POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`,
`GET /v1/responses/{id}/input_items`, `POST /v1/responses/input_tokens`.

The request is translated into an OpenAI chat body (`ingress.responses_request`), after the stored
conversation of `previous_response_id` (if any) is put before its input, and handed to the same
`GenerationService.handle` as `/v1/chat/completions`: keys, limits, routing, retries, failover,
metrics and usage accounting are exactly the chat path's. `ResponsesExchange` implements
`ClientExchange` over the real `Call` and translates what the service answers into a Response object
(a whole chat completion, here) or the Responses event stream (by the relay, which drives the stream's
translation, `translation()`: dialects/responses/stream.py, with the engine's events as it reads them).
Errors are OpenAI's envelope (the app's default rendering). Engines that serve `/v1/responses`
themselves are still spoken to in chat: the gateway owns the stored responses and their chaining,
which an engine's own store (one per engine process) could not share across replicas.

`store` (default true, as OpenAI's) keeps the Response, this input's items and the conversation so
far in the gateway's database (`state.responses`: SQLite by default, Postgres when replicas share
it), written once the answer is complete and before its last bytes go out, so that a client that
chains at once finds it; `store: false` writes nothing. Responses are visible to the key that made
them only. Their items (new input items and output items) can be named by a later request's
`item_reference`s: all of a request's references are looked up in one query, and only when it has
some; another key's item, or an unknown one, is OpenAI's 404 (`param` input). A `previous_response_id`
the key has no stored response for (unknown, deleted, `store: false`, another key's) is OpenAI's 400
`previous_response_not_found`, the code Codex and its proxies recover on. A database that cannot be
reached is a 503 for reads, references and chaining; for a generation that already ran, the answer
still goes out (with `x-gateway-stored: false`) and the failure is logged and counted.

Errors are in the route's names: what the chat path raises about the translated body (`messages`,
`max_tokens`...) names `input`, `max_output_tokens`... (`ingress.error_names`). The request's model is
recorded as soon as the body parsed, so an early 400 is counted under the public model it asked for (a
model the gateway does not serve stays "unknown": metric labels never take a client's string).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

import orjson

from llm_gateway.dialects.common import HandlerContext, authenticate, read_json_and_bytes, record_model
from llm_gateway.dialects.error_names import RESPONSES, renamed
from llm_gateway.dialects.responses.echo import Echo, echo_json
from llm_gateway.dialects.responses.items import item_references, new_id
from llm_gateway.dialects.responses.request import ResponsesRequest, parse
from llm_gateway.dialects.responses.response import to_response
from llm_gateway.dialects.responses.stream import ResponsesStream
from llm_gateway.errors import GatewayError, InvalidRequest
from llm_gateway.exchange import JSON, Headers
from llm_gateway.http.call import Call, CallExchange
from llm_gateway.observability.record import RequestRecord
from llm_gateway.service.runtime import Runtime

if TYPE_CHECKING:
    from llm_gateway.state.responses import ResponseStore

log = logging.getLogger("gateway")
STORED_HEADER = b"x-gateway-stored"
TOKEN_COUNT_HEADER = b"x-gateway-token-count"  # "engine" (its own tokenizer) or "estimate" (the gateway's)
PREFIXES = ("/v1/responses/", "/responses/")


class ResponsesExchange(CallExchange):
    """The service's `ClientExchange` for one Responses request: answers go out as the Responses API's."""

    __slots__ = ("_earlier", "_owner", "_req", "_saved", "_store", "_stream", "id")

    def __init__(
        self,
        call: Call,
        req: ResponsesRequest,
        earlier: list[dict[str, Any]],
        store: ResponseStore | None,
        owner: str,
    ) -> None:
        super().__init__(call)
        self._req = req
        self._earlier = earlier
        self._store = store if req.store else None
        self._saved = not req.store  # nothing to store counts as done
        self._owner = owner
        self._stream: ResponsesStream | None = None
        self.id = new_id("resp_")

    async def respond(self, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
        if 200 <= status < 300 and content_type == JSON:
            obj = orjson.loads(body)
            resp, turn = to_response(obj if isinstance(obj, dict) else {}, self._req, self.id)
            if not await self._save(resp, turn):
                headers.append((STORED_HEADER, b"false"))
            body = Echo(resp, echo_json(self._req)).dumps(resp)  # the echoed tools and instructions: their kept JSON
        await self._call.respond(status, body, headers, content_type)

    async def start(self, status: int, headers: Headers, *, hold: bool = False) -> None:
        if self._stream is None:
            self._stream = ResponsesStream(self._req, self.id)
        await self._call.start(status, headers, hold=hold)

    def translation(self) -> ResponsesStream:
        """The stream's translation, for the relay to drive: from now on what is written is the Responses
        API's already. The relay ends it only with its own end (`[DONE]` or a failure, `relay.done` or
        `relay.error` set), whose last part the relay never writes from the connection's callback: so the
        Response is stored (`write`, `end`) before its last event goes out."""
        if self._stream is None:
            self._stream = ResponsesStream(self._req, self.id)
        self._relayed = True
        return self._stream

    async def write(self, data: bytes) -> None:
        stream = self._stream
        assert stream is not None, "write() before start()"
        if not self._relayed:  # the service's own OpenAI SSE (a queued stream's)
            data = stream.feed(data)
        if stream.terminal is not None and stream.terminal != "response.failed":
            await self._save(stream.response, stream.turn)  # before the last event: chaining finds it
        if data:
            await self._call.write(data)

    async def end(self, data: bytes = b"") -> None:
        stream = self._stream
        if stream is None:
            await self._call.end()
            return
        if data and not self._relayed:
            data = stream.feed(data)
        if stream.terminal is not None and stream.terminal != "response.failed":
            await self._save(stream.response, stream.turn)  # before the last event: chaining finds it
        await self._call.end(data + stream.finish())

    async def _save(self, resp: dict[str, Any], turn: dict[str, Any]) -> bool:
        """Store the finished response (when asked); False if the store failed."""
        store = self._store
        if store is None:
            return self._saved
        self._store = None  # once
        from llm_gateway.state.responses import StoredResponse  # with the store: SQLAlchemy is loaded by then

        req = self._req
        stored = StoredResponse(
            id=resp["id"],
            owner=self._owner,
            model=str(resp.get("model") or req.model),
            created_at=int(resp.get("created_at") or time.time()),
            previous_response_id=req.previous_response_id,
            response=resp,
            input_items=req.items,
            conversation=[*self._earlier, *req.messages, turn],
        )
        new_inputs = [it for it in req.items if it["id"] not in req.referenced]  # referenced: stored already
        try:
            await store.save(stored, [*new_inputs, *resp["output"]])
        except GatewayError as e:
            log.warning("response %s was not stored: %s (request %s)", resp["id"], e.message, self.rid)
            return False
        self._saved = True
        return True


async def create(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "responses"
    who = authenticate(call, rec, rt)
    owner = who.id
    body, raw = await read_json_and_bytes(ctx, call)
    record_model(rec, rt, body)
    req = parse(body, await _referenced(ctx, body, owner), raw)
    earlier = await _earlier(ctx, req, owner)
    store = None
    if req.store:
        try:
            store = await ctx.responses.get()
        except GatewayError as e:  # the answer still goes out, marked as not stored
            log.warning("responses cannot be stored now: %s (request %s)", e.message, call.rid)
    exchange = ResponsesExchange(call, req, earlier, store, owner)
    try:
        body = req.chat_body(earlier)  # its messages as gathered, unless an earlier conversation leads them
        await ctx.service.handle(exchange, rec, rt, "chat", body, who, gathered=req.gathered_for(earlier))
    except GatewayError as e:
        raise renamed(e, RESPONSES) from None


async def input_tokens(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    """`POST /v1/responses/input_tokens`: the prompt tokens a Responses request would have, by the engine's
    own tokenizer where it has one (`x-gateway-token-count: engine`), else the gateway's estimate.
    Not charged to the key's limits: nothing is generated."""
    who = authenticate(call, rec, rt)
    parsed, raw = await read_json_and_bytes(ctx, call)
    req = parse(parsed, await _referenced(ctx, parsed, who.id), raw)
    earlier = await _earlier(ctx, req, who.id)
    body = req.chat_body(earlier)
    for k in ("stream", "stream_options", "max_tokens", "temperature", "top_p", "logprobs", "top_logprobs", "user"):
        body.pop(k, None)
    try:
        n, source = await ctx.service.count_prompt_tokens(call, rec, rt, body, who, gathered=req.gathered_for(earlier))
    except GatewayError as e:
        raise renamed(e, RESPONSES) from None
    headers = [(b"x-request-id", call.rid.encode()), (TOKEN_COUNT_HEADER, source.encode())]
    await call.respond(200, orjson.dumps({"object": "response.input_tokens", "input_tokens": n}), headers)


async def _referenced(ctx: HandlerContext, body: dict[str, Any], owner: str) -> dict[str, dict[str, Any]] | None:
    """The stored items the input's `item_reference`s name, by id, in one query (None: it names none)."""
    refs = item_references(body.get("input"))
    if not refs:
        return None
    return await (await ctx.responses.get()).load_items(refs, owner)


async def _earlier(ctx: HandlerContext, req: ResponsesRequest, owner: str) -> list[dict[str, Any]]:
    """The stored conversation `previous_response_id` names ([] without one); OpenAI's 400
    `previous_response_not_found` if the key has none such."""
    if req.previous_response_id is None:
        return []
    prev = await (await ctx.responses.get()).load(req.previous_response_id, owner)
    if prev is None:
        raise InvalidRequest(
            f"Previous response with id '{req.previous_response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return prev.conversation


def _not_found(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(message, status=404, type_="invalid_request_error", code="not_found", param=param)


def _target(call: Call) -> tuple[str, str]:
    """(response id, what of it) from /v1/responses/{id}[/input_items]."""
    path: str = call.scope["path"]
    rest = path.split("/responses/", 1)[1]
    rid, _, sub = rest.partition("/")
    if not rid.startswith("resp_") or len(rid) > 128:
        raise _not_found(f"No response found with id '{rid[:128]}'.", param="response_id")
    return rid, sub


async def retrieve(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    rid, sub = _target(call)
    if sub not in ("", "input_items"):
        raise _not_found(f"Unknown request URL: GET {call.scope['path'][:200]}")
    stored = await (await ctx.responses.get()).load(rid, who.id)
    if stored is None:
        raise _not_found(f"No response found with id '{rid}'.", param="response_id")
    body = orjson.dumps(stored.response if sub == "" else _items_page(stored.input_items, call))
    await call.respond(200, body, [(b"x-request-id", call.rid.encode())])


async def delete(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    who = authenticate(call, rec, rt)
    rid, sub = _target(call)
    if sub:
        raise _not_found(f"Unknown request URL: DELETE {call.scope['path'][:200]}")
    if not await (await ctx.responses.get()).delete(rid, who.id):
        raise _not_found(f"No response found with id '{rid}'.", param="response_id")
    body = orjson.dumps({"id": rid, "object": "response.deleted", "deleted": True})
    await call.respond(200, body, [(b"x-request-id", call.rid.encode())])


def _items_page(items: list[dict[str, Any]], call: Call) -> dict[str, Any]:
    """One page of input items, as OpenAI lists them: `order` (desc by default), `limit` (1..100),
    `after` (an item id)."""
    query = _query(call)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("Invalid value for 'order': expected 'asc' or 'desc'.", param="order")
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        raise InvalidRequest("Invalid value for 'limit': expected an integer.", param="limit") from None
    if not 1 <= limit <= 100:
        raise InvalidRequest("Invalid value for 'limit': expected 1 to 100.", param="limit")
    seq = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after:
        ids = [it.get("id") for it in seq]
        seq = seq[ids.index(after) + 1 :] if after in ids else []
    page = seq[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0].get("id") if page else None,
        "last_id": page[-1].get("id") if page else None,
        "has_more": len(seq) > limit,
    }


def _query(call: Call) -> dict[str, str]:
    raw: bytes = call.scope.get("query_string", b"")
    return dict(parse_qsl(raw.decode("latin-1")))
