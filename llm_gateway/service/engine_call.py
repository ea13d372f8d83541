"""One call that asks an engine for something other than a generation, routed by capability: `/tokenize` and
`/detokenize` (`tokenize`), `/rerank` (`rerank`), `/score` (`score`), `/v1/audio/*` (`audio`).

The request names a public model; the key must be allowed to use it and the model must have a deployment with
the capability (else a 400 `capability_unavailable`). It is one request against the key's requests per minute and
holds a concurrency lease while it runs. A call that only looks tokens up (tokenize, detokenize) or whose engines
report no tokens (audio: seconds of speech) is charged no tokens, like `count_prompt_tokens`
(Limiter.admit_requests). A call the engine computes over a prompt and reports in tokens (rerank, score: both
vLLM's and llama-server's answers carry `usage.prompt_tokens`) is given `prompt_estimate`: it reserves that much
against the key's tokens per minute and token/cost budgets like an embedding (Limiter.admit, refused when they are
spent), and settles with the prompt tokens the engine reported (the estimate when the answer has none, flagged
`usage_estimated`), which the metrics, the access log and the usage ledger count as the request's prompt tokens.
The first routable deployment with the capability whose engine answers serves it; an engine that cannot be reached is
passed over for the next (up to `ATTEMPTS`), an engine's refusal (a bad token id, an unknown field) is its answer,
classified by its adapter. Metrics and the access log count it as the endpoint the dialect set on the record.
What is sent to the engine and how its answer is shaped is the caller's `ask` (engine knowledge: adapters/).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import orjson

from llm_gateway.access.keys import Principal
from llm_gateway.errors import BackendFailure, InvalidRequest, ModelNotFound, NoHealthyBackend
from llm_gateway.exchange import ClientExchange
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.backend_calls import BackendPoster
from llm_gateway.routing.table import Deployment
from llm_gateway.service.runtime import Gateway, Runtime
from llm_gateway.upstream.base import UpstreamTimeouts

ATTEMPTS = 3
#: for a call that computes (rerank, score, audio): the backend's own timeouts, uncapped by counting's short ones
ENGINE_TIMEOUTS = UpstreamTimeouts(*(float("inf"),) * 4)
#: the most of an engine's answer such a call reads (a rerank with its documents, a long transcript)
ANSWER_LIMIT = 16 * 1024 * 1024
#: (status, answer) from the engine of one deployment, through a poster to its backend
Ask = Callable[[Deployment, BackendPoster], Awaitable[tuple[int, bytes]]]


async def serve(
    gw: Gateway,
    call: ClientExchange,
    rec: RequestRecord,
    rt: Runtime,
    capability: str,
    model: object,
    who: Principal,
    ask: Ask,
    *,
    check: Callable[[], None] | None = None,
    timeouts: UpstreamTimeouts | None = None,
    answer_limit: int | None = None,
    prompt_estimate: int | None = None,
) -> None:
    """Answer the call with the first deployment's 200 answer. `check` refuses a bad body, once the model and
    the key's right to it are known (a 404 or 403 comes first). `timeouts`/`answer_limit`: the poster's (None:
    token counting's short ones); the backend's own timeouts still cap them. `prompt_estimate`: charge the call
    the prompt tokens its answer reports (None: a request, no tokens)."""
    route = rt.table.resolve(model) if isinstance(model, str) else None
    if route is None:
        raise ModelNotFound(
            "The requested model does not exist; GET /v1/models lists the models this key may use.", param="model"
        )
    rec.model = route.name
    rt.auth.check_model(who, route.name, route.cfg.aliases)
    if not any(capability in d.cfg.capabilities for d in route.deployments):
        raise InvalidRequest(
            f"model '{route.name}' has no deployment with the '{capability}' capability",
            param="model",
            code="capability_unavailable",
        )
    if check is not None:
        check()
    if prompt_estimate is None:
        _, reservation = await rt.limiter.admit_requests(who, route.name, call.rid)
    else:
        _, reservation = await rt.limiter.admit(
            who, route.name, prompt_estimate, call.rid, prompt_tokens=prompt_estimate
        )
    rec.metered = True
    now = time.monotonic()
    t = time.perf_counter()
    failures = 0
    used = 0  # the tokens to settle with: none unless an answer came
    try:
        for dep in route.deployments:
            b = dep.backend
            if capability not in dep.cfg.capabilities or failures >= ATTEMPTS:
                continue
            if not (b.routable() and dep.breaker.available(now) and dep.model_present()):
                continue
            poster = BackendPoster(gw.upstream, b, timeouts, answer_limit)
            try:
                status, data = await ask(dep, poster)
            except BackendFailure:
                failures += 1
                continue
            rec.backend, rec.engine, rec.upstream_model = b.name, b.kind, dep.upstream_model
            if status != 200:
                raise b.adapter.error(status, data, "application/json")
            if prompt_estimate is not None:
                reported = prompt_tokens_of(data)
                used = prompt_estimate if reported is None else reported
                rec.prompt_tokens, rec.completion_tokens = used, 0
                rec.usage_estimated = reported is None
            await call.respond(200, data, [(b"x-request-id", call.rid.encode())])
            return
    finally:
        rec.upstream_s += time.perf_counter() - t
        # the lease back, and for a charged call its real prompt tokens (0 when no engine answered)
        settled = rt.limiter.finish(reservation, used, prompt_tokens=used)
        await (settled if rt.limiter.inline else asyncio.shield(settled))
    raise NoHealthyBackend(f"no deployment of model '{route.name}' with the '{capability}' capability can serve now")


def prompt_tokens_of(answer: bytes) -> int | None:
    """`usage.prompt_tokens` of an engine's JSON answer (None: not there, or not a count)."""
    try:
        usage = orjson.loads(answer).get("usage")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    n = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
