"""The engine kinds of issue 39 (Aphrodite, trtllm-serve, MLX-LM, MLC LLM, TGI, Dynamo, LM Studio): each one's
error normalisation, request shaping, readiness, load and residency, from bodies their sources produce (cited
in each adapter's module), and a config naming all fourteen kinds passing `check-config`."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.adapters.registry import ADAPTERS, adapter_for
from llm_gateway.cli import main
from llm_gateway.errors import InvalidRequest
from llm_gateway.settings.vocabulary import EngineKind
from llm_gateway.types import BackendInfo, CallContext
from tests.unit.test_probes import FakeClient

B = BackendInfo("b", "http://engine.test", None)
HI = [{"role": "user", "content": "hi"}]


def sent(kind: str, body: dict[str, Any], endpoint: str = "chat", stream: bool = False) -> dict[str, Any]:
    ctx = CallContext(endpoint, "pub", "up", stream, False, "req-1")  # type: ignore[arg-type]
    req = adapter_for(kind, B).build(endpoint, body, ctx)  # type: ignore[arg-type]
    assert req.body is not None
    out: dict[str, Any] = orjson.loads(req.body)
    return out


def probe(kind: str, routes: dict[str, tuple[int, bytes]]) -> Any:
    return asyncio.run(adapter_for(kind, B).probe(FakeClient(routes)))


# -- errors -------------------------------------------------------------------------------------------------


def test_mlc_twice_serialised_error_is_read_and_an_unserved_model_is_model_not_found() -> None:
    inner = {"object": "error", "message": "Penalty value should be in range [-2, 2].", "code": 400}
    body = orjson.dumps(orjson.dumps(inner).decode())  # JSONResponse(model_dump_json()): a JSON string
    assert body.startswith(b'"')
    e = adapter_for("mlc", B).error(400, body, "application/json")
    assert e.status == 400 and e.message == "Penalty value should be in range [-2, 2]. (backend 'b' (mlc))"
    unserved = {"object": "error", "message": 'The requested model "x" is not served.', "code": 400}
    e = adapter_for("mlc", B).error(400, orjson.dumps(orjson.dumps(unserved).decode()), "application/json")
    assert e.status == 502 and e.code == "upstream_model_not_found" and e.retryable


def test_tgi_overload_is_busy_and_a_failed_generation_is_the_engines_failure() -> None:
    a = adapter_for("tgi", B)
    busy = a.error(429, b'{"error":"Model is overloaded","error_type":"overloaded"}', "application/json")
    assert busy.busy and busy.retryable and busy.status == 429 and "overloaded" in busy.message
    failed = a.error(424, b'{"error":"Request failed during generation","error_type":"generation"}', "")
    assert failed.status == 502 and failed.retryable and not failed.busy and "during generation" in failed.message
    bad = a.error(422, b'{"error":"Input validation error: `top_p` must be > 0.0","error_type":"validation"}', "")
    assert bad.status == 400 and not bad.retryable and "top_p" in bad.message


def test_dynamo_529_is_busy_and_499_is_not_the_clients_error() -> None:
    a = adapter_for("dynamo", B)
    busy = a.error(529, b'{"message":"Service temporarily overloaded","type":"<unknown status code>","code":529}', "")
    assert busy.busy and busy.retryable and busy.status == 503 and "overloaded" in busy.message
    cancelled = a.error(499, b'{"message":"Request cancelled","type":"<unknown status code>","code":499}', "")
    assert cancelled.status == 502 and not cancelled.busy
    missing = a.error(404, b'{"message":"Model not found","type":"Not Found","code":404}', "")
    assert missing.code == "upstream_model_not_found"


def test_mlx_plain_error_string_is_the_message() -> None:
    e = adapter_for("mlx", B).error(400, b'{"error": "top_p must be at most 1"}', "application/json")
    assert e.status == 400 and e.message.startswith("top_p must be at most 1")


# -- request shaping ----------------------------------------------------------------------------------------


def test_trtllm_sends_only_fields_its_request_declares() -> None:
    up = sent("trtllm", {"messages": HI, "max_completion_tokens": 5, "metadata": {"a": "b"}, "top_k": 3})
    assert up["max_tokens"] == 5 and "max_completion_tokens" not in up  # one name of the aliased field
    assert "metadata" not in up and up["top_k"] == 3  # a hint dropped, its own extra kept
    up = sent("trtllm", {"messages": HI, "stream_options": {"include_usage": True}})
    assert "stream_options" not in up  # refused by its validator outside a stream
    assert sent("trtllm", {"messages": HI, "stream": True}, stream=True)["stream_options"] == {"include_usage": True}
    with pytest.raises(InvalidRequest) as e:
        sent("trtllm", {"messages": HI, "mirostat_tau": 5.0})  # Aphrodite's sampler: extra="forbid" there
    assert e.value.param == "mirostat_tau" and "TensorRT-LLM" in e.value.message


def test_tgi_and_mlc_send_max_tokens_only() -> None:
    for kind in ("tgi", "mlc"):
        up = sent(kind, {"messages": HI, "max_completion_tokens": 5})
        assert up["max_tokens"] == 5 and "max_completion_tokens" not in up, kind


def test_mlc_response_format_json_schema_becomes_its_schema_string() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    up = sent("mlc", {"messages": HI, "response_format": rf, "stream_options": {"include_usage": True}})
    assert up["response_format"] == {"type": "json_object", "schema": orjson.dumps(schema).decode()}
    assert "stream_options" not in up
    with pytest.raises(InvalidRequest):
        sent("mlc", {"messages": HI, "response_format": {"type": "regex"}})


# -- probes -------------------------------------------------------------------------------------------------


def test_mlx_models_answer_with_an_empty_body_is_not_an_empty_list() -> None:
    r = probe("mlx", {"/health": (200, b'{"status": "ok"}'), "/v1/models": (200, b"")})
    assert r.state == "ready" and r.models is None and r.load is None


def test_mlc_readiness_is_its_model_list() -> None:
    models = b'{"object":"list","data":[{"id":"tiny","created":1,"object":"model","owned_by":"MLC-LLM"}]}'
    r = probe("mlc", {"/v1/models": (200, models)})
    assert r.state == "ready" and r.models == frozenset({"tiny"})
    assert probe("mlc", {}).state == "down"


def test_tgi_and_aphrodite_and_dynamo_read_their_load() -> None:
    tgi = probe(
        "tgi",
        {
            "/health": (200, b""),
            "/v1/models": (200, b'{"object":"list","data":[{"id":"m","object":"model","created":0,"owned_by":"m"}]}'),
            "/metrics": (200, b"tgi_queue_size 3\ntgi_batch_current_size 2\n"),
        },
    )
    assert tgi.load is not None and (tgi.load.running, tgi.load.waiting, tgi.load.kv) == (2, 3, None)
    aph_metrics = (
        b'aphrodite:num_requests_running{engine="0",model_name="m"} 1.0\n'
        b'aphrodite:num_requests_waiting{engine="0",model_name="m"} 4.0\n'
        b'aphrodite:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        b'aphrodite:engine_sleep_state{engine="0",model_name="m",sleep_state="awake"} 0.0\n'
    )
    card = b'{"object":"list","data":[{"id":"m","object":"model","owned_by":"aphrodite","max_model_len":8192}]}'
    aph = probe("aphrodite", {"/health": (200, b""), "/v1/models": (200, card), "/metrics": (200, aph_metrics)})
    assert aph.load is not None and (aph.load.running, aph.load.waiting, aph.load.kv) == (1, 4, 0.5)
    assert aph.context_lengths == {"m": 8192} and aph.resident == {"m": False}  # asleep
    dyn_card = b'{"object":"list","data":[{"id":"m","object":"model","owned_by":"nvidia","context_window":2048}]}'
    dyn_metrics = b'dynamo_frontend_inflight_requests{model="m"} 2\ndynamo_frontend_queued_requests{model="m"} 1\n'
    dyn = probe("dynamo", {"/live": (200, b""), "/v1/models": (200, dyn_card), "/metrics": (200, dyn_metrics)})
    assert dyn.state == "ready" and dyn.context_lengths == {"m": 2048}
    assert dyn.load is not None and (dyn.load.running, dyn.load.waiting) == (2, 1)


def test_lmstudio_residency_and_windows_come_from_its_native_listing() -> None:
    oai = b'{"object":"list","data":[{"id":"qwen3-4b","object":"model"},{"id":"gemma-3","object":"model"}]}'
    native = orjson.dumps(
        {
            "models": [
                {
                    "type": "llm",
                    "key": "qwen3-4b",
                    "loaded_instances": [{"id": "qwen3-4b", "config": {"context_length": 4096}}],
                },
                {"type": "llm", "key": "gemma-3", "loaded_instances": [], "max_context_length": 32768},
            ]
        }
    )
    r = probe("lmstudio", {"/v1/models": (200, oai), "/api/v1/models": (200, native)})
    assert r.resident == {"qwen3-4b": True, "gemma-3": False}
    assert r.context_lengths == {"qwen3-4b": 4096}
    bare = probe("lmstudio", {"/v1/models": (200, oai)})  # an older build without the native listing
    assert bare.state == "ready" and bare.resident is None


# -- config -------------------------------------------------------------------------------------------------

FORMAT_OF = {
    "llama-server": "gguf",
    "vllm": "safetensors",
    "sglang": "safetensors",
    "ollama": "gguf",
    "tabbyapi": "exl3",
    "lmdeploy": "awq",
    "aphrodite": "exl2",
    "trtllm": "fp8",
    "mlx": "mlx",
    "mlc": "mlc",
    "tgi": "gptq",
    "dynamo": "safetensors",
    "lmstudio": "gguf",
    "openai": "safetensors",
}


def test_a_config_with_all_fourteen_kinds_passes_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kinds = list(EngineKind.__args__)  # type: ignore[attr-defined]
    assert len(kinds) == 14 and set(kinds) == set(ADAPTERS) == set(FORMAT_OF)
    backends = "\n".join(
        f'  - {{name: b-{k}, engine: {k}, url: "http://127.0.0.1:{9000 + i}"}}' for i, k in enumerate(kinds)
    )
    models = "\n".join(
        f"  - {{name: m-{k}, deployments: [{{backend: b-{k}, model: x, format: {FORMAT_OF[k]}}}]}}" for k in kinds
    )
    path = tmp_path / "all.yaml"
    path.write_text(f"backends:\n{backends}\nmodels:\n{models}\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    for k in kinds:
        assert re.search(rf"\({re.escape(k)} at http", out), k


@pytest.mark.parametrize(
    ("kind", "fmt"), [("mlx", "gguf"), ("mlc", "safetensors"), ("trtllm", "gguf"), ("lmstudio", "exl2")]
)
def test_check_config_refuses_a_format_the_engine_cannot_load(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, fmt: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        f'backends:\n  - {{name: b, engine: {kind}, url: "http://127.0.0.1:9"}}\n'
        f"models:\n  - {{name: m, deployments: [{{backend: b, model: x, format: {fmt}}}]}}\n"
    )
    assert main(["check-config", str(path)]) == 1
    assert "cannot load" in capsys.readouterr().err


def test_mlx_deployments_cannot_declare_embeddings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        'backends:\n  - {name: b, engine: mlx, url: "http://127.0.0.1:9"}\n'
        "models:\n  - {name: m, deployments: [{backend: b, model: x, format: mlx, capabilities: [chat, embeddings]}]}\n"
    )
    assert main(["check-config", str(path)]) == 1
    assert "cannot serve embeddings" in capsys.readouterr().err


def test_trtllm_flat_error_event_ends_the_stream_with_an_error() -> None:
    """trtllm-serve sends a stream's error as a flat `data: {"object": "error", ...}` event: not a chunk."""
    ctx = CallContext("chat", "pub", "up", True, False, "req-1")  # type: ignore[arg-type]
    relay = adapter_for("trtllm", B).relay(ctx)
    chunk = b'data: {"id":"c","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
    relay.feed(chunk)
    out = relay.feed(
        b'data: {"object":"error","message":"boom","type":"InternalServerError","param":null,"code":500}\n\n'
    )
    assert relay.error is not None and "boom" in relay.error.message
    assert b"boom" in out and b'"object":"error"' not in out  # the client gets the OpenAI envelope
