"""Rerank and score on the gateway, in vLLM's paths and shapes (adapters/scoring.py has each engine's):
`POST /rerank`, `/v1/rerank`, `/v2/rerank` ({model, query, documents, top_n} -> {id, model, usage, results:
[{index, relevance_score, document}]}) to a deployment with the `rerank` capability, and `POST /score`,
`/v1/score` ({model, queries, documents} or {text_1, text_2} ... -> {data: [{index, score}]}) to one with `score`.
Keys, limits, routing and metrics are service/engine_call.py's; errors are OpenAI's envelope. Both are charged
the prompt tokens the engine reports (`usage.prompt_tokens`) against the key's tokens per minute and budgets,
reserved beforehand at an estimate: a cross-encoder reads the query once with each document (or each pair of a
score), so the estimate is their characters / 4 per pair, as a chat prompt's.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.adapters import scoring as engine_scoring
from llm_gateway.dialects.common import HandlerContext, authenticate, read_json_object
from llm_gateway.errors import InvalidRequest
from llm_gateway.http.call import Call
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.backend_calls import BackendPoster
from llm_gateway.routing.table import Deployment
from llm_gateway.service import engine_call
from llm_gateway.service.runtime import Runtime

RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank")
SCORE_PATHS = ("/score", "/v1/score")
#: the pairs a score request may name (vLLM's ScoreRequest variants), first and second side
SCORE_FIELDS = (("queries", "documents"), ("queries", "items"), ("data_1", "data_2"), ("text_1", "text_2"))


async def rerank(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "rerank"
    who = authenticate(call, rec, rt)
    body = await read_json_object(ctx, call)

    async def ask(dep: Deployment, poster: BackendPoster) -> tuple[int, bytes]:
        return await engine_scoring.rerank(dep.backend.adapter, poster, body, dep.upstream_model, dep.model)

    await _serve(ctx, call, rec, rt, "rerank", body, who, ask, lambda: _check_rerank(body), _pairs_estimate(body))


async def score(ctx: HandlerContext, call: Call, rec: RequestRecord, rt: Runtime) -> None:
    rec.endpoint = "score"
    who = authenticate(call, rec, rt)
    body = await read_json_object(ctx, call)

    async def ask(dep: Deployment, poster: BackendPoster) -> tuple[int, bytes]:
        return await engine_scoring.score(dep.backend.adapter, poster, body, dep.upstream_model, dep.model)

    await _serve(ctx, call, rec, rt, "score", body, who, ask, lambda: _check_score(body), _pairs_estimate(body))


async def _serve(
    ctx: HandlerContext,
    call: Call,
    rec: RequestRecord,
    rt: Runtime,
    capability: str,
    body: dict[str, Any],
    who: Any,
    ask: engine_call.Ask,
    check: Any,
    estimate: int,
) -> None:
    await engine_call.serve(
        ctx.service.gw,
        call,
        rec,
        rt,
        capability,
        body.get("model"),
        who,
        ask,
        check=check,
        timeouts=engine_call.ENGINE_TIMEOUTS,
        answer_limit=engine_call.ANSWER_LIMIT,
        prompt_estimate=estimate,
    )


def _texts(value: object) -> bool:
    """A text or a list of texts (or of vLLM's multimodal parts: objects), not empty."""
    if isinstance(value, (str, dict)):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(v, (str, dict)) for v in value)


def _check_rerank(body: dict[str, Any]) -> None:
    if not isinstance(body.get("query"), (str, dict)):
        raise InvalidRequest("query must be a string.", param="query")
    if not _texts(body.get("documents")):
        raise InvalidRequest("documents must be a non-empty list of strings.", param="documents")
    top_n = body.get("top_n")
    if top_n is not None and (not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 0):
        raise InvalidRequest("top_n must be a non-negative integer.", param="top_n")


def _check_score(body: dict[str, Any]) -> None:
    for first, second in SCORE_FIELDS:
        if first in body and second in body:
            if not _texts(body[first]):
                raise InvalidRequest(f"{first} must be a string or a non-empty list of strings.", param=first)
            if not _texts(body[second]):
                raise InvalidRequest(f"{second} must be a string or a non-empty list of strings.", param=second)
            return
    raise InvalidRequest(
        "Send the pairs to score as 'queries' and 'documents' (or 'text_1' and 'text_2').", param="queries"
    )


def _pairs_estimate(body: dict[str, Any]) -> int:
    """The prompt tokens a rerank or score is reserved at: each pair's characters / 4 (a text on one side with
    a list on the other is paired with each of its items), plus one; a malformed body (refused by its check
    before anything is reserved) estimates what it can."""
    first: object = body.get("query")
    second: object = body.get("documents")
    if first is None:
        first, second = next(((body[a], body[b]) for a, b in SCORE_FIELDS if a in body and b in body), (None, None))
    left, right = _sizes(first), _sizes(second)
    if len(left) == 1 and len(right) != 1:
        left = left * len(right)
    elif len(right) == 1 and len(left) != 1:
        right = right * len(left)
    return (sum(left) + sum(right)) // 4 + 1


def _sizes(value: object) -> list[int]:
    """The characters of each text of one side (a multimodal part: its JSON bytes)."""
    items = value if isinstance(value, list) else [] if value is None else [value]
    return [len(v) if isinstance(v, str) else len(orjson.dumps(v)) if isinstance(v, dict) else 0 for v in items]
