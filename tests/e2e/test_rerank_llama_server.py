"""Rerank through the gateway as a real process to the real `llama-server --reranking` with a tiny reranker
generated for it (scripts/make_tiny_gguf.py --reranker: qwen3 blocks, rank pooling, a two-label `cls.output`
head): every rerank path of the gateway gives llama-server's own ranking and scores (asked directly for
comparison), under the public model's name, and the prompt tokens llama-server reports for each call are what the
gateway counts (and charges the key); `/score` is refused for a model whose only engine has no score route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import LLAMA_KEY, engines_started
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import LlamaServer, RealEngine, tiny_gguf

pytestmark = pytest.mark.real_engine

CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: llama, engine: llama-server, url: "{url}", api_key: {key}, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny-ranker
    deployments: [{{backend: llama, model: {model}, format: gguf, capabilities: [rerank]}}]
"""
QUERY = "what is a panda?"
DOCS = ["hi", "it is a bear", "The giant panda is a bear species endemic to China.", "llamas"]


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    engines: list[RealEngine] = []
    with engines_started(engines):
        eng = LlamaServer(
            alias="tiny-ranker-gguf",
            parallel=2,
            api_key=LLAMA_KEY,
            workdir=tmp_path_factory.mktemp("reranker"),
            extra_args=("--reranking",),
        )
        engines.append(eng)
        eng.model_path = tiny_gguf("--reranker")
        eng.start()
        yield eng


def test_rerank_against_real_llama_server(reranker: RealEngine, tmp_path: Path) -> None:
    own = httpx.post(
        reranker.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS}, headers=reranker.headers
    ).json()["results"]
    assert len(own) == len(DOCS)
    cfg = CONFIG.format(url=reranker.url, key=reranker.api_key, model=reranker.model)
    reported = 0
    with GatewayProcess(cfg, tmp_path) as gw:
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            r = httpx.post(gw.url + path, json={"model": "tiny-ranker", "query": QUERY, "documents": DOCS})
            assert r.status_code == 200, (path, r.text)
            got = r.json()
            assert got["model"] == "tiny-ranker"
            assert got["usage"]["prompt_tokens"] > 0  # what the gateway charges the key (service/engine_call.py)
            reported += got["usage"]["prompt_tokens"]
            assert sorted((x["index"], x["relevance_score"]) for x in got["results"]) == sorted(
                (x["index"], x["relevance_score"]) for x in own
            )
        answer = httpx.post(
            gw.url + "/rerank", json={"model": "tiny-ranker", "query": QUERY, "documents": DOCS, "top_n": 2}
        ).json()
        top = answer["results"]
        reported += answer["usage"]["prompt_tokens"]
        best = sorted(own, key=lambda x: -x["relevance_score"])[:2]
        assert [x["index"] for x in top] == [x["index"] for x in best]
        r = httpx.post(gw.url + "/score", json={"model": "tiny-ranker", "text_1": QUERY, "text_2": DOCS})
        assert r.status_code == 400 and r.json()["error"]["code"] == "capability_unavailable"
        metrics = httpx.get(gw.url + "/metrics").text
    counted = f'gateway_prompt_tokens_total{{backend="llama",model="tiny-ranker"}} {float(reported)}'
    assert counted in metrics, [line for line in metrics.splitlines() if "prompt_tokens" in line]
