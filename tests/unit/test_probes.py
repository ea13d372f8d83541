"""Adapters' probe(): readiness, served models and load, against a fake ProbeClient with real bodies."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.openai_generic import GenericOpenAIAdapter
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.errors import UpstreamUnreachable
from llm_gateway.types import BackendInfo, LoadSnapshot, ProbeResult

NOW = 4242.0
NOT_FOUND = (404, b'{"detail":"Not Found"}')


class FakeClient:
    """Answers GETs from a route table; records (path, headers) of every call."""

    def __init__(self, routes: Mapping[str, tuple[int, bytes] | Exception]) -> None:
        self.routes = dict(routes)
        self.calls: list[tuple[str, dict[str, str]]] = []

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        self.calls.append((path, dict(headers or {})))
        r = self.routes.get(path, NOT_FOUND)
        if isinstance(r, Exception):
            raise r
        return r

    def now(self) -> float:
        return NOW

    @property
    def paths(self) -> list[str]:
        return [p for p, _ in self.calls]

    def headers_for(self, path: str) -> dict[str, str]:
        return next(h for p, h in self.calls if p == path)


def backend(key: str | None = "engine-secret", url: str = "http://gpu-1.test:8080") -> BackendInfo:
    return BackendInfo("gpu-1", url, key)


# -- llama-server ------------------------------------------------------------------------------------

LLAMA_LOADING = (503, b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}')
LLAMA_OK = (200, b'{"status":"ok"}')
LLAMA_MODELS = (
    200,
    b'{"models":[{"name":"tiny-llama","model":"tiny-llama","details":{"format":"gguf"}}],"object":"list",'
    b'"data":[{"id":"tiny-llama","object":"model","created":1796008467,"owned_by":"llamacpp","meta":null}]}',
)
LLAMA_METRICS = (
    200,
    b"# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens\n"
    b"# TYPE llamacpp:prompt_tokens_total counter\n"
    b"llamacpp:prompt_tokens_total 218\n"
    b"# HELP llamacpp:requests_processing Number of requests processing\n"
    b"# TYPE llamacpp:requests_processing gauge\n"
    b"llamacpp:requests_processing 2\n"
    b"# HELP llamacpp:requests_deferred Number of requests deferred\n"
    b"# TYPE llamacpp:requests_deferred gauge\n"
    b"llamacpp:requests_deferred 1\n",
)
LLAMA_NO_METRICS = (
    501,
    b'{"error":{"code":501,"message":"This server does not support metrics endpoint. Start it with `--metrics`",'
    b'"type":"not_supported_error"}}',
)
LLAMA_SLOTS = (
    200,
    b'[{"id":0,"n_ctx":2048,"speculative":false,"is_processing":true,"id_task":2100},'
    b'{"id":1,"n_ctx":2048,"speculative":false,"is_processing":false},'
    b'{"id":2,"n_ctx":2048,"speculative":false,"is_processing":true,"id_task":2101},'
    b'{"id":3,"n_ctx":2048,"speculative":false,"is_processing":false}]',
)


async def test_llama_server_loading_model_is_loading_and_nothing_else_is_probed():
    client = FakeClient({"/health": LLAMA_LOADING})
    assert await LlamaServerAdapter(backend()).probe(client) == ProbeResult("loading", detail="/health answered 503")
    assert client.paths == ["/health"]


async def test_llama_server_ready_with_metrics_and_slots():
    client = FakeClient(
        {"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_METRICS, "/slots": LLAMA_SLOTS}
    )
    res = await LlamaServerAdapter(backend()).probe(client)
    assert res == ProbeResult(
        "ready",
        load=LoadSnapshot(running=2.0, waiting=1.0, kv=0.5, at=NOW, computed=218.0),  # prompt tokens it evaluated
        models=frozenset({"tiny-llama"}),
        resident={"tiny-llama": True},
    )


async def test_llama_server_without_metrics_falls_back_to_slots():
    client = FakeClient(
        {"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_NO_METRICS, "/slots": LLAMA_SLOTS}
    )
    res = await LlamaServerAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=2.0, waiting=None, kv=0.5, at=NOW)
    assert "/slots" in client.paths


async def test_llama_server_without_metrics_or_slots_reports_no_load():
    slots_off = (
        501,
        b'{"error":{"code":501,"message":"This server does not support slots endpoint.","type":"not_supported_error"}}',
    )
    client = FakeClient(
        {"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_NO_METRICS, "/slots": slots_off}
    )
    res = await LlamaServerAdapter(backend()).probe(client)
    assert (res.state, res.load) == ("ready", None)


async def test_llama_server_metrics_without_slots_has_no_kv_signal():
    client = FakeClient({"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_METRICS})
    res = await LlamaServerAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=2.0, waiting=1.0, kv=None, at=NOW, computed=218.0)


async def test_llama_server_idle_slots_mean_zero_running():
    idle = (200, b'[{"id":0,"n_ctx":2048,"is_processing":false},{"id":1,"n_ctx":2048,"is_processing":false}]')
    client = FakeClient({"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_NO_METRICS, "/slots": idle})
    res = await LlamaServerAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=0.0, waiting=None, kv=0.0, at=NOW)


@pytest.mark.parametrize("slots", [(200, b"not json"), (200, b'{"slots":[]}'), (200, b"[]")])
async def test_llama_server_unreadable_slots_are_ignored(slots):
    client = FakeClient(
        {"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_NO_METRICS, "/slots": slots}
    )
    assert (await LlamaServerAdapter(backend()).probe(client)).load is None


async def test_llama_server_sends_its_key_to_protected_routes_but_not_to_health():
    client = FakeClient(
        {"/health": LLAMA_OK, "/v1/models": LLAMA_MODELS, "/metrics": LLAMA_METRICS, "/slots": LLAMA_SLOTS}
    )
    await LlamaServerAdapter(backend()).probe(client)
    assert client.headers_for("/health") == {}
    for path in ("/v1/models", "/metrics", "/slots"):
        assert client.headers_for(path) == {"Authorization": "Bearer engine-secret"}


async def test_a_health_error_other_than_503_is_down():
    client = FakeClient({"/health": (500, b"")})
    assert await LlamaServerAdapter(backend()).probe(client) == ProbeResult("down", detail="/health answered 500")


async def test_an_unreachable_backend_raises_for_the_prober_to_handle():
    client = FakeClient({"/health": UpstreamUnreachable("connection refused")})
    with pytest.raises(UpstreamUnreachable):
        await LlamaServerAdapter(backend()).probe(client)


async def test_unreadable_models_list_leaves_models_unknown():
    client = FakeClient({"/health": LLAMA_OK, "/v1/models": (200, b"<html>"), "/metrics": LLAMA_METRICS})
    res = await LlamaServerAdapter(backend()).probe(client)
    assert (res.state, res.models) == ("ready", None)


# -- vLLM --------------------------------------------------------------------------------------------

VLLM_MODELS = (
    200,
    b'{"object":"list","data":[{"id":"tiny-llama","object":"model","created":1796007400,"owned_by":"vllm",'
    b'"root":"/models/tiny","parent":null,"max_model_len":512},{"id":"tiny-lora","object":"model",'
    b'"owned_by":"vllm","root":"/loras/a","parent":"tiny-llama"}]}',
)
VLLM_METRICS_DP2 = (
    200,
    b"# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE vllm:num_requests_running gauge\n"
    b'vllm:num_requests_running{engine="0",model_name="qwen3-8b"} 3.0\n'
    b'vllm:num_requests_running{engine="1",model_name="qwen3-8b"} 5.0\n'
    b"# TYPE vllm:num_requests_waiting gauge\n"
    b'vllm:num_requests_waiting{engine="0",model_name="qwen3-8b"} 1.0\n'
    b'vllm:num_requests_waiting{engine="1",model_name="qwen3-8b"} 0.0\n'
    b'vllm:num_requests_waiting_by_reason{engine="0",model_name="qwen3-8b",reason="capacity"} 1.0\n'
    b"# TYPE vllm:kv_cache_usage_perc gauge\n"
    b'vllm:kv_cache_usage_perc{engine="0",model_name="qwen3-8b"} 0.5\n'
    b'vllm:kv_cache_usage_perc{engine="1",model_name="qwen3-8b"} 0.5\n'
    b"# TYPE vllm:prompt_tokens_total counter\n"
    b'vllm:prompt_tokens_total{engine="0",model_name="qwen3-8b"} 90211.0\n',
)
VLLM_METRICS_OLD = (
    200,
    b'vllm:num_requests_running{model_name="qwen3-8b"} 4.0\n'
    b'vllm:num_requests_waiting{model_name="qwen3-8b"} 2.0\n'
    b"# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
    b'vllm:gpu_cache_usage_perc{model_name="qwen3-8b"} 0.41\n',
)


async def test_vllm_ready_with_models_and_load_summed_over_engines():
    client = FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": VLLM_METRICS_DP2})
    res = await VLLMAdapter(backend()).probe(client)
    assert res.state == "ready"
    assert res.models == frozenset({"tiny-llama", "tiny-lora"})
    assert res.load is not None
    assert (res.load.running, res.load.waiting, res.load.at) == (8.0, 1.0, NOW)


async def test_vllm_old_gpu_cache_usage_metric_is_the_kv_fallback():
    client = FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": VLLM_METRICS_OLD})
    res = await VLLMAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=4.0, waiting=2.0, kv=0.41, at=NOW)


async def test_vllm_new_kv_metric_wins_over_the_old_one():
    both = (200, VLLM_METRICS_OLD[1] + b'vllm:kv_cache_usage_perc{model_name="qwen3-8b"} 0.07\n')
    client = FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": both})
    res = await VLLMAdapter(backend()).probe(client)
    assert res.load is not None and res.load.kv == 0.07


async def test_vllm_prefix_cache_counters_are_read_with_the_load_summed_over_engines():
    counters = (
        b"# TYPE vllm:prefix_cache_queries counter\n"
        b'vllm:prefix_cache_queries_total{engine="0",model_name="qwen3-8b"} 1000.0\n'
        b'vllm:prefix_cache_queries_total{engine="1",model_name="qwen3-8b"} 500.0\n'
        b"# TYPE vllm:prefix_cache_hits counter\n"
        b'vllm:prefix_cache_hits_total{engine="0",model_name="qwen3-8b"} 600.0\n'
        b'vllm:prefix_cache_hits_total{engine="1",model_name="qwen3-8b"} 100.0\n'
    )
    client = FakeClient(
        {"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": (200, VLLM_METRICS_DP2[1] + counters)}
    )
    res = await VLLMAdapter(backend()).probe(client)
    assert res.load is not None
    assert (res.load.cache_queries, res.load.cache_hits, res.load.computed) == (1500.0, 700.0, None)
    old = (200, VLLM_METRICS_OLD[1] + b"vllm:gpu_prefix_cache_queries_total 40\nvllm:gpu_prefix_cache_hits_total 8\n")
    res = await VLLMAdapter(backend()).probe(
        FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": old})
    )
    assert res.load is not None and (res.load.cache_queries, res.load.cache_hits) == (40.0, 8.0)


async def test_vllm_metrics_missing_gauges_give_unknown_values():
    client = FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": (200, b"# nothing\n")})
    res = await VLLMAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=None, waiting=None, kv=None, at=NOW)


async def test_vllm_metrics_error_gives_no_load():
    client = FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": (500, b"")})
    assert (await VLLMAdapter(backend()).probe(client)).load is None


async def test_vllm_health_503_is_not_ready():
    client = FakeClient({"/health": (503, b"")})
    res = await VLLMAdapter(backend()).probe(client)
    assert res.state != "ready" and res.load is None and res.models is None


async def test_vllm_kv_fraction_over_data_parallel_ranks_stays_a_fraction():
    client = FakeClient({"/health": (200, b""), "/v1/models": VLLM_MODELS, "/metrics": VLLM_METRICS_DP2})
    res = await VLLMAdapter(backend()).probe(client)
    assert res.load is not None and res.load.kv == 0.5


# -- SGLang ------------------------------------------------------------------------------------------

SGLANG_METRICS = (
    200,
    b"# HELP sglang:num_running_reqs The number of running requests.\n"
    b"# TYPE sglang:num_running_reqs gauge\n"
    b'sglang:num_running_reqs{model_name="qwen3-8b"} 7.0\n'
    b"# TYPE sglang:num_queue_reqs gauge\n"
    b'sglang:num_queue_reqs{model_name="qwen3-8b"} 0.0\n'
    b"# TYPE sglang:token_usage gauge\n"
    b'sglang:token_usage{model_name="qwen3-8b"} 0.18\n',
)
SGLANG_MODELS = (
    200,
    b'{"object":"list","data":[{"id":"qwen3-8b","object":"model","owned_by":"sglang","root":"qwen3-8b"}]}',
)


async def test_sglang_starting_up_is_loading():
    client = FakeClient({"/health": (503, b"")})
    assert (await SGLangAdapter(backend()).probe(client)).state == "loading"


async def test_sglang_load_from_metrics():
    client = FakeClient({"/health": (200, b""), "/v1/models": SGLANG_MODELS, "/metrics": SGLANG_METRICS})
    res = await SGLangAdapter(backend()).probe(client)
    assert res == ProbeResult(
        "ready",
        load=LoadSnapshot(running=7.0, waiting=0.0, kv=0.18, at=NOW),
        models=frozenset({"qwen3-8b"}),
        resident={"qwen3-8b": True},
    )
    assert "/get_load" not in client.paths


async def test_sglang_without_metrics_falls_back_to_get_load_summed_over_ranks():
    get_load = (
        200,
        b'[{"dp_rank":0,"num_reqs":3,"num_waiting_reqs":1,"num_tokens":812},'
        b'{"dp_rank":1,"num_reqs":2,"num_waiting_reqs":0,"num_tokens":400}]',
    )
    client = FakeClient({"/health": (200, b""), "/v1/models": SGLANG_MODELS, "/get_load": get_load})
    res = await SGLangAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=5.0, waiting=1.0, kv=None, at=NOW)


async def test_sglang_get_load_as_a_single_object_with_running_reqs():
    get_load = (200, b'{"num_running_reqs":4}')
    client = FakeClient({"/health": (200, b""), "/v1/models": SGLANG_MODELS, "/get_load": get_load})
    res = await SGLangAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=4.0, waiting=0.0, kv=None, at=NOW)


@pytest.mark.parametrize("get_load", [NOT_FOUND, (200, b"oops"), (200, b'[{"dp_rank":0}]')])
async def test_sglang_without_metrics_or_a_usable_get_load_reports_no_load(get_load):
    client = FakeClient({"/health": (200, b""), "/v1/models": SGLANG_MODELS, "/get_load": get_load})
    assert (await SGLangAdapter(backend()).probe(client)).load is None


# -- LMDeploy ----------------------------------------------------------------------------------------

LMDEPLOY_METRICS = (
    200,
    b"# HELP lmdeploy:num_requests_running Number of requests in model execution batches.\n"
    b"# TYPE lmdeploy:num_requests_running gauge\n"
    b'lmdeploy:num_requests_running{engine="0",model_name="internlm3"} 5.0\n'
    b"# TYPE lmdeploy:num_requests_waiting gauge\n"
    b'lmdeploy:num_requests_waiting{engine="0",model_name="internlm3"} 2.0\n'
    b"# TYPE lmdeploy:num_api_requests_waiting gauge\n"
    b'lmdeploy:num_api_requests_waiting{engine="0",model_name="internlm3"} 3.0\n'
    b"# HELP lmdeploy:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.\n"
    b"# TYPE lmdeploy:gpu_cache_usage_perc gauge\n"
    b'lmdeploy:gpu_cache_usage_perc{engine="0",model_name="internlm3"} 0.37\n',
)
LMDEPLOY_MODELS = (200, b'{"object":"list","data":[{"id":"internlm3","object":"model","owned_by":"lmdeploy"}]}')


@pytest.mark.parametrize(
    ("health", "state", "detail"),
    [
        ((200, b'{"status":"healthy","message":"ok"}'), "ready", ""),
        ((200, b'{"status":"sleeping","message":"engine is sleeping"}'), "loading", "/health says sleeping"),
        ((503, b'{"status":"initializing","message":"starting"}'), "loading", "/health says initializing"),
        ((503, b'{"status":"unhealthy","message":"stalled for 12s"}'), "down", "/health says unhealthy"),
        ((503, b"Service Unavailable"), "loading", "/health answered 503"),
        ((200, b""), "ready", ""),
        ((500, b"<html>"), "down", "/health says 500"),
    ],
)
async def test_lmdeploy_health_status_decides_readiness(health, state: str, detail: str):
    client = FakeClient({"/health": health, "/v1/models": LMDEPLOY_MODELS, "/metrics": LMDEPLOY_METRICS})
    res = await LMDeployAdapter(backend()).probe(client)
    assert (res.state, res.detail) == (state, detail)


async def test_lmdeploy_load_adds_the_api_layer_queue_to_waiting():
    client = FakeClient(
        {"/health": (200, b'{"status":"healthy"}'), "/v1/models": LMDEPLOY_MODELS, "/metrics": LMDEPLOY_METRICS}
    )
    res = await LMDeployAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=5.0, waiting=5.0, kv=0.37, at=NOW)
    assert res.models == frozenset({"internlm3"})
    assert client.headers_for("/metrics") == {"Authorization": "Bearer engine-secret"}


async def test_lmdeploy_without_the_api_queue_metric_reports_the_engine_queue():
    body = b"\n".join(line for line in LMDEPLOY_METRICS[1].split(b"\n") if b"api_requests" not in line)
    client = FakeClient(
        {"/health": (200, b'{"status":"healthy"}'), "/v1/models": LMDEPLOY_MODELS, "/metrics": (200, body)}
    )
    res = await LMDeployAdapter(backend()).probe(client)
    assert res.load is not None and res.load.waiting == 2.0


async def test_lmdeploy_api_queue_alone_does_not_invent_an_engine_queue():
    body = b'lmdeploy:num_requests_running 1\nlmdeploy:num_api_requests_waiting{engine="0"} 4\n'
    client = FakeClient(
        {"/health": (200, b'{"status":"healthy"}'), "/v1/models": LMDEPLOY_MODELS, "/metrics": (200, body)}
    )
    res = await LMDeployAdapter(backend()).probe(client)
    assert res.load == LoadSnapshot(running=1.0, waiting=None, kv=None, at=NOW)


# -- TabbyAPI ----------------------------------------------------------------------------------------

TABBY_MODEL = (
    200,
    b'{"id":"Qwen3-8B-exl3","object":"model","created":1796008000,"owned_by":"tabbyAPI",'
    b'"parameters":{"max_seq_len":32768,"cache_size":32768,"cache_mode":"Q8","max_batch_size":8}}',
)


async def test_tabbyapi_healthy_without_a_model_is_loading():
    client = FakeClient(
        {
            "/health": (200, b'{"status":"healthy","issues":[]}'),
            "/v1/model": (503, b'{"detail":"No models are currently loaded."}'),
        }
    )
    assert await TabbyAPIAdapter(backend()).probe(client) == ProbeResult("loading", detail="no model loaded")


async def test_tabbyapi_ready_reports_the_loaded_model_and_no_load():
    client = FakeClient({"/health": (200, b'{"status":"healthy","issues":[]}'), "/v1/model": TABBY_MODEL})
    res = await TabbyAPIAdapter(backend()).probe(client)
    assert res == ProbeResult(
        "ready",
        load=None,
        models=frozenset({"Qwen3-8B-exl3"}),
        context_lengths={"Qwen3-8B-exl3": 32768},
        resident={"Qwen3-8B-exl3": True},
    )
    assert client.headers_for("/v1/model") == {"x-api-key": "engine-secret"}
    assert client.headers_for("/health") == {}


async def test_tabbyapi_unhealthy_is_down():
    unhealthy = (503, b'{"status":"unhealthy","issues":[{"time":"2026-11-30T03:00:00","description":"crash"}]}')
    res = await TabbyAPIAdapter(backend()).probe(FakeClient({"/health": unhealthy}))
    assert res == ProbeResult("down", detail="/health answered 503")


async def test_tabbyapi_rejected_key_is_down():
    client = FakeClient(
        {"/health": (200, b'{"status":"healthy"}'), "/v1/model": (401, b'{"detail":"Invalid API key"}')}
    )
    res = await TabbyAPIAdapter(backend()).probe(client)
    assert (res.state, res.models, res.load) == ("down", None, None)
    assert res.detail.startswith("/v1/model answered 401")
    assert "backends[].api_key" in res.detail


# -- Ollama ------------------------------------------------------------------------------------------

OLLAMA_TAGS = (
    200,
    b'{"models":[{"name":"tiny:latest","model":"tiny:latest","modified_at":"2026-11-30T02:59:27.736209885Z",'
    b'"size":564212,"digest":"df23d3d75cc3","details":{"parent_model":"","format":"gguf","family":"llama"}},'
    b'{"name":"qwen3:8b","model":"qwen3:8b","details":{"format":"gguf"}},'
    b'{"model":"hf.co/org/repo:Q4_K_M"}]}',
)


async def test_ollama_lists_pulled_models_with_and_without_latest():
    client = FakeClient({"/api/version": (200, b'{"version":"0.5.4-ipexllm-20250407"}'), "/api/tags": OLLAMA_TAGS})
    res = await OllamaAdapter(backend(url="http://127.0.0.1:11434")).probe(client)
    assert res == ProbeResult("ready", models=frozenset({"tiny:latest", "tiny", "qwen3:8b", "hf.co/org/repo:Q4_K_M"}))
    assert res.load is None


async def test_ollama_not_answering_version_is_down():
    res = await OllamaAdapter(backend()).probe(FakeClient({"/api/version": (403, b"")}))
    assert res == ProbeResult("down", detail="/api/version answered 403")


async def test_ollama_tags_failure_leaves_models_unknown_but_ready():
    client = FakeClient({"/api/version": (200, b'{"version":"0.9.0"}'), "/api/tags": (500, b"")})
    assert await OllamaAdapter(backend()).probe(client) == ProbeResult("ready", models=None)


async def test_ollama_unreadable_tags_give_no_models():
    client = FakeClient({"/api/version": (200, b'{"version":"0.9.0"}'), "/api/tags": (200, b"garbage")})
    assert (await OllamaAdapter(backend()).probe(client)).models == frozenset()


async def test_ollama_probes_carry_the_local_host_header():
    client = FakeClient({"/api/version": (200, b"{}"), "/api/tags": (200, b'{"models":[]}')})
    await OllamaAdapter(BackendInfo("ol", "http://ollama:11434")).probe(client)
    assert client.headers_for("/api/version")["Host"] == "localhost:11434"
    assert client.headers_for("/api/tags")["Host"] == "localhost:11434"


# -- generic OpenAI-compatible -----------------------------------------------------------------------


async def test_generic_openai_readiness_is_the_models_list():
    models = (200, b'{"object":"list","data":[{"id":"mlx-community/Qwen3-4B"},{"object":"model"}]}')
    client = FakeClient({"/v1/models": models})
    res = await GenericOpenAIAdapter(backend()).probe(client)
    assert res == ProbeResult("ready", models=frozenset({"mlx-community/Qwen3-4B"}))
    assert "/health" not in client.paths
    assert client.headers_for("/v1/models") == {"Authorization": "Bearer engine-secret"}


@pytest.mark.parametrize(("status", "state"), [(503, "loading"), (404, "down"), (500, "down")])
async def test_generic_openai_models_list_errors(status: int, state: str):
    res = await GenericOpenAIAdapter(backend()).probe(FakeClient({"/v1/models": (status, b"")}))
    assert res == ProbeResult(state, detail=f"/v1/models answered {status}")


@pytest.mark.parametrize("status", [401, 403])
async def test_a_rejected_engine_key_is_down_and_says_which_setting_to_check(status: int):
    res = await GenericOpenAIAdapter(backend()).probe(FakeClient({"/v1/models": (status, b'{"error":"Unauthorized"}')}))
    assert res.state == "down"
    assert res.detail.startswith(f"/v1/models answered {status}")
    assert "backends[].api_key" in res.detail
