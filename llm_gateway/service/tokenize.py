"""`/tokenize` and `/detokenize`: a model's own tokenizer, asked of a deployment with the `tokenize` capability.

The request names a public model (vLLM's shapes, adapters/tokenize.py); the key must be allowed to use it. It is
one request against the key's requests per minute and holds a concurrency lease while it runs, and no tokens
(nothing is generated), like `count_prompt_tokens` (Limiter.admit_requests). The first routable deployment whose
engine answers serves it; an engine that cannot be reached is passed over for the next (up to `ATTEMPTS`), an
engine's refusal (a bad token id, an unknown field) is its answer, classified by its adapter. Metrics and the
access log count it as the endpoint `tokenize` or `detokenize`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

from llm_gateway.access.keys import Principal
from llm_gateway.adapters import tokenize as engine_tokens
from llm_gateway.errors import BackendFailure, InvalidRequest, ModelNotFound, NoHealthyBackend
from llm_gateway.exchange import ClientExchange
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.backend_calls import BackendPoster
from llm_gateway.service.runtime import Gateway, Runtime

ATTEMPTS = 3
Op = Literal["tokenize", "detokenize"]


async def serve(
    gw: Gateway, call: ClientExchange, rec: RequestRecord, rt: Runtime, op: Op, body: dict[str, Any], who: Principal
) -> None:
    model = body.get("model")
    route = rt.table.resolve(model) if isinstance(model, str) else None
    if route is None:
        raise ModelNotFound(
            "The requested model does not exist; GET /v1/models lists the models this key may use.", param="model"
        )
    rec.model = route.name
    rt.auth.check_model(who, route.name, route.cfg.aliases)
    if not any("tokenize" in d.cfg.capabilities for d in route.deployments):
        raise InvalidRequest(
            f"model '{route.name}' has no deployment with the 'tokenize' capability",
            param="model",
            code="capability_unavailable",
        )
    _check(op, body)
    _, reservation = await rt.limiter.admit_requests(who, route.name, call.rid)
    rec.metered = True
    now = time.monotonic()
    t = time.perf_counter()
    failures = 0
    try:
        for dep in route.deployments:
            b = dep.backend
            if "tokenize" not in dep.cfg.capabilities or failures >= ATTEMPTS:
                continue
            if not (b.routable() and dep.breaker.available(now) and dep.model_present()):
                continue
            poster = BackendPoster(gw.upstream, b)
            try:
                if op == "tokenize":
                    status, data = await engine_tokens.tokenize(
                        b.adapter, poster, body, dep.upstream_model, dep.context_length
                    )
                else:
                    status, data = await engine_tokens.detokenize(b.adapter, poster, body, dep.upstream_model)
            except BackendFailure:
                failures += 1
                continue
            rec.backend, rec.engine, rec.upstream_model = b.name, b.kind, dep.upstream_model
            if status != 200:
                raise b.adapter.error(status, data, "application/json")
            await call.respond(200, data, [(b"x-request-id", call.rid.encode())])
            return
    finally:
        rec.upstream_s += time.perf_counter() - t
        settled = rt.limiter.finish(reservation, 0)  # the lease back (no tokens were reserved)
        await (settled if rt.limiter.inline else asyncio.shield(settled))
    raise NoHealthyBackend(f"no deployment of model '{route.name}' with the 'tokenize' capability can serve now")


def _check(op: Op, body: dict[str, Any]) -> None:
    if op == "detokenize":
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise InvalidRequest("tokens must be a list of token ids (integers).", param="tokens")
    elif not isinstance(body.get("prompt"), str) and not isinstance(body.get("messages"), list):
        raise InvalidRequest("Send the text as 'prompt' (a string) or a chat as 'messages' (a list).", param="prompt")
