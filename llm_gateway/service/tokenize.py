"""`/tokenize` and `/detokenize`: a model's own tokenizer, asked of a deployment with the `tokenize` capability.

The request names a public model (vLLM's shapes, adapters/tokenize.py). Keys, limits, routing and metrics are
service/engine_call.py's (one request against the key's requests per minute, no tokens); metrics and the access
log count it as the endpoint `tokenize` or `detokenize`.
"""

from __future__ import annotations

from typing import Any, Literal

from llm_gateway.access.keys import Principal
from llm_gateway.adapters import tokenize as engine_tokens
from llm_gateway.errors import InvalidRequest
from llm_gateway.exchange import ClientExchange
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.backend_calls import BackendPoster
from llm_gateway.routing.table import Deployment
from llm_gateway.service import engine_call
from llm_gateway.service.runtime import Gateway, Runtime

Op = Literal["tokenize", "detokenize"]


async def serve(
    gw: Gateway, call: ClientExchange, rec: RequestRecord, rt: Runtime, op: Op, body: dict[str, Any], who: Principal
) -> None:
    async def ask(dep: Deployment, poster: BackendPoster) -> tuple[int, bytes]:
        adapter = dep.backend.adapter
        if op == "tokenize":
            return await engine_tokens.tokenize(adapter, poster, body, dep.upstream_model, dep.context_length)
        return await engine_tokens.detokenize(adapter, poster, body, dep.upstream_model)

    await engine_call.serve(gw, call, rec, rt, "tokenize", body.get("model"), who, ask, check=lambda: _check(op, body))


def _check(op: Op, body: dict[str, Any]) -> None:
    if op == "detokenize":
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequest("tokens must be a list of token ids (integers).", param="tokens")
    elif not isinstance(body.get("prompt"), str) and not isinstance(body.get("messages"), list):
        raise InvalidRequest("Send the text as 'prompt' (a string) or a chat as 'messages' (a list).", param="prompt")
