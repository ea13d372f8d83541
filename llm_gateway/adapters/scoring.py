"""The engines' rerank and score routes (capabilities `rerank` and `score`), spoken to in each engine's path and
answered in the Jina/Cohere-style shape vLLM and llama-server share, with the public model's name.

Paths: vLLM serves `/rerank`, `/v1/rerank` and `/v2/rerank` (one handler), and `/score` and `/v1/score`
(vllm-project/vllm v0.32.0 `vllm/entrypoints/pooling/scoring/api_router.py`: `/v1/rerank` and `/v1/score` log a
deprecation and call the unprefixed handlers, so the gateway asks `/rerank` and `/score`). Its `RerankRequest`
{model, query, documents, top_n, ...} answers `RerankResponse` {id, model, usage, results: [{index, document,
relevance_score}]}; `ScoreRequest` ({queries, documents} / {queries, items} / {data_1, data_2} / {text_1, text_2})
answers `ScoreResponse` {id, object: list, created, model, data: [{index, object: score, score}], usage}
(`vllm/entrypoints/pooling/scoring/protocol.py`). llama-server (`--reranking`, a model with rank pooling) serves
`/rerank`, `/reranking`, `/v1/rerank` and `/v1/reranking` and no score route (ggml-org/llama.cpp
`tools/server/server.cpp` @aa6192d, `main`'s route table: `post_rerank`); it takes the same Jina body and answers
{model, object, usage, results: [{index, relevance_score, document?}]}. Both get the body as it came with the
engine's model name; the answer's `model` becomes the public name. Engines without the routes are refused the
capabilities in config (adapters/registry.py).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.adapters.base import Adapter, TokenizeClient
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter

#: the engine kinds that serve a rerank route, and the path each is asked on
RERANK_PATHS = {"vllm": "/rerank", "llama-server": "/v1/rerank"}
#: the engine kinds that serve `/score`
SCORE_PATHS = {"vllm": "/score"}


async def rerank(
    adapter: Adapter, client: TokenizeClient, body: dict[str, Any], upstream_model: str, public_model: str
) -> tuple[int, bytes]:
    """(status, answer): the engine's 200 answer with the public model's name, or its error answer as it came."""
    return await _ask(adapter, client, RERANK_PATHS, body, upstream_model, public_model)


async def score(
    adapter: Adapter, client: TokenizeClient, body: dict[str, Any], upstream_model: str, public_model: str
) -> tuple[int, bytes]:
    return await _ask(adapter, client, SCORE_PATHS, body, upstream_model, public_model)


async def _ask(
    adapter: Adapter,
    client: TokenizeClient,
    paths: dict[str, str],
    body: dict[str, Any],
    upstream_model: str,
    public_model: str,
) -> tuple[int, bytes]:
    path = paths.get(adapter.kind)
    if path is None or not isinstance(adapter, OpenAICompatAdapter):  # config keeps others from the capability
        raise NotImplementedError(f"{adapter.kind} serves no {'/'.join(paths.values())}")
    status, data = await client.post(path, orjson.dumps({**body, "model": upstream_model}), adapter.headers)
    if status != 200:
        return status, data
    try:
        answer = orjson.loads(data)
    except orjson.JSONDecodeError:
        return 502, data  # classified by the adapter as the engine's fault
    if isinstance(answer, dict) and "model" in answer:
        answer["model"] = public_model  # the engine's name for its weights stays behind the gateway
    return 200, orjson.dumps(answer)
