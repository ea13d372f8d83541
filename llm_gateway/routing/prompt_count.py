"""Exact prompt counts, only where a request's size is ambiguous for a deployment's context window.

The fit check (candidates.fits) judges a prompt on its lower bound (request_info `prompt_floor`), so the
gateway never refuses what an engine would take. A chat request also has an upper bound
(`prompt_ceiling`: every UTF-8 byte a token, plus the template's allowances). Where a deployment's
known window lies between the two (`floor + output <= window < ceiling + output`) the bound cannot
decide: the request might fit or not. Only then is the prompt counted with the engine's own tokenizer
and chat template (`Adapter.count_prompt_tokens`, where the adapter `counts_prompts`: llama-server
/apply-template + /tokenize, vLLM /tokenize), on a routable deployment of that model (the ambiguous ones
first: theirs is the tokenizer in question), and the count decides the fit for every deployment of the model
(`RequestInfo.prompt_exact`).
A request far from every window (the usual case) pays one loop over the deployments' windows: no
await, no hashing, no serialization.

Counts are cached per public model and prompt (an LRU of `CACHE_SIZE`, keyed by the model, its
upstream models and a digest of the fields the template renders, `prompt_fields`): an agent's growing
conversation, resent, is counted once per turn. Counting is a courtesy: it gets `COUNT_BUDGET_S` and
`COUNT_ATTEMPTS` engines in all; when it fails (engine down, timeout, no tokenizer endpoint) the fit is
decided on the lower bound as before, so the engine judges what the gateway could not. Different
deployments of one public model are meant to be the same weights, hence one tokenizer; where they
are not (a GGUF beside safetensors with another template), the count is off by a few template tokens.
An engine that answers that it has no such endpoint (404, 405, 501: a build without a tokenizer route) is
not asked again for `NO_ENDPOINT_RETRY_S`: without that, every request near its window paid a round trip
for nothing (bench/: the fake engine's /tokenize is a 404). Other failures are not remembered.
Outcomes are counted in `gateway_prompt_counts_total{result="counted|cached|failed"}`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import OrderedDict
from typing import Any

import orjson

from llm_gateway.adapters.openai_compat import prompt_fields
from llm_gateway.errors import GatewayError
from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.backend_calls import COUNT_ATTEMPTS, BackendPoster
from llm_gateway.routing.candidates import eligible, output_counted
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.table import Deployment, ModelRoute, RoutingTable
from llm_gateway.upstream.base import UpstreamClient

CACHE_SIZE = 4096  # prompts remembered (a key and an int each)
COUNT_BUDGET_S = 2.0  # for all the engines asked for one model's count
NO_ENDPOINT_RETRY_S = 300.0  # an engine that said it has no counting endpoint is asked again after this
NO_ENDPOINT = frozenset((404, 405, 501))


def _ambiguous(d: Deployment, info: RequestInfo, ceiling: int) -> bool:
    window = d.context_length
    if window is None or window >= ceiling + (info.max_tokens or 0):
        return False  # unknown, or more than the ceiling with any output counted: fits (the usual case)
    out = output_counted(d, info)
    return info.prompt_floor + out <= window < ceiling + out


def _countable(route: ModelRoute, info: RequestInfo, ceiling: int) -> bool:
    """Has the model a deployment the bounds cannot decide, and an engine that can count its prompt?"""
    deps = eligible(route, info)
    return any(_ambiguous(d, info, ceiling) for d in deps) and any(d.backend.adapter.counts_prompts for d in deps)


def ambiguous_routes(table: RoutingTable, route: ModelRoute, info: RequestInfo) -> list[ModelRoute]:
    """The model and fallbacks with a deployment whose window the request's bounds cannot decide, and
    an engine to count on (a model whose engines cannot count is decided on the floor, unhashed)."""
    ceiling = info.prompt_ceiling
    if ceiling is None:
        return []
    found = [route] if _countable(route, info, ceiling) else []
    for name in route.cfg.fallbacks:
        g = table.resolve(name)
        if g is not None and all(g is not f for f in found) and _countable(g, info, ceiling):
            found.append(g)
    return found


class PromptCounter:
    """Counts ambiguous prompts on an engine, remembering the last `size` counts."""

    def __init__(self, metrics: Metrics, size: int = CACHE_SIZE, budget_s: float = COUNT_BUDGET_S) -> None:
        self.size = size
        self.budget_s = budget_s
        self._cache: OrderedDict[tuple[str, str, bytes], int] = OrderedDict()
        #: backends that answered they have no counting endpoint, and when to ask them again
        self._no_endpoint: dict[str, float] = {}
        self._results = {r: metrics.prompt_counts.labels(r) for r in ("counted", "cached", "failed")}

    def __len__(self) -> int:
        return len(self._cache)

    async def settle(
        self, upstream: UpstreamClient, groups: list[ModelRoute], body: dict[str, Any], info: RequestInfo
    ) -> None:
        """Count the prompt for each model in `groups` (from `ambiguous_routes`) into `info.prompt_exact`;
        a model whose count failed is left out (its fit is judged on the floor)."""
        fields = orjson.dumps(prompt_fields(body), option=orjson.OPT_SORT_KEYS)
        digest = hashlib.blake2b(fields, digest_size=16).digest()
        for g in groups:
            key = (g.name, "\x00".join(sorted({d.upstream_model for d in g.deployments})), digest)
            n = self._cache.get(key)
            if n is not None:
                self._cache.move_to_end(key)
                self._results["cached"].inc()
            else:
                n = await self._count(upstream, g, body, info)
                if n is None:
                    self._results["failed"].inc()
                    continue
                self._results["counted"].inc()
                self._cache[key] = n
                if len(self._cache) > self.size:
                    self._cache.popitem(last=False)
            if info.prompt_exact is None:
                info.prompt_exact = {}
            info.prompt_exact[g.name] = n

    async def _count(
        self, upstream: UpstreamClient, g: ModelRoute, body: dict[str, Any], info: RequestInfo
    ) -> int | None:
        ceiling = info.prompt_ceiling
        assert ceiling is not None
        now = time.monotonic()
        deps = [
            d
            for d in eligible(g, info)
            if d.backend.adapter.counts_prompts
            and d.backend.routable()
            and d.breaker.available(now)
            and d.model_present()
            and self._no_endpoint.get(d.backend.name, 0.0) <= now
        ]
        deps.sort(key=lambda d: not _ambiguous(d, info, ceiling))  # the ambiguous windows' own tokenizers first
        try:
            async with asyncio.timeout(self.budget_s):
                for d in deps[:COUNT_ATTEMPTS]:
                    poster = BackendPoster(upstream, d.backend)
                    try:
                        n = await d.backend.adapter.count_prompt_tokens(poster, body, d.upstream_model)
                    except GatewayError:
                        continue
                    if n is not None:
                        return n
                    if poster.statuses and poster.statuses[-1] in NO_ENDPOINT:
                        self._no_endpoint[d.backend.name] = now + NO_ENDPOINT_RETRY_S
        except TimeoutError:
            pass
        return None
