"""Context windows: what each adapter learns from its engine's probes (real captures and the emulators),
the deployment's window (probed, or configured over it), selection skipping a deployment the request
cannot fit, the 400 `context_length_exceeded` before any engine is called, the lower bound the fit is
judged on, `/v1/models` `context_length` and `ready`, and the `gateway_deployment_context_length` gauge.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.adapters.base import Adapter
from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.routing.prober import probe_once
from llm_gateway.routing.request_info import read_request
from llm_gateway.types import BackendInfo
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.unit.test_probes import FakeClient

CAPTURES = Path(__file__).resolve().parents[1] / "emulators" / "captures"  # the repo's copies of the real answers
ADAPTERS: dict[str, type[Adapter]] = {
    "llama-server": LlamaServerAdapter,
    "vllm": VLLMAdapter,
    "sglang": SGLangAdapter,
    "tabbyapi": TabbyAPIAdapter,
    "lmdeploy": LMDeployAdapter,
    "ollama": OllamaAdapter,
}


def captured(path: str) -> tuple[int, bytes]:
    """The status and body of a raw HTTP capture (`$ curl ...` line, status line, headers, body)."""
    text = (CAPTURES / path).read_bytes()
    head, _, body = text[text.index(b"HTTP/1.1 ") :].partition(b"\r\n\r\n" if b"\r\n\r\n" in text else b"\n\n")
    return int(head.split()[1]), body.strip()


def info() -> BackendInfo:
    return BackendInfo("gpu-1", "http://gpu-1.test", None)


# -- what each adapter reads, from the real engines' captures ------------------------------------------


async def test_llama_server_window_is_props_n_ctx_per_slot_from_the_real_capture() -> None:
    # captured with -c 4096 -np 2: /props says 2048, the context of one slot (server-main.log n_ctx_slot)
    client = FakeClient(
        {
            "/health": captured("llamacpp/http/01_health.txt"),
            "/v1/models": captured("llamacpp/http/02_v1_models.txt"),
            "/props": captured("llamacpp/http/03_props.txt"),
        }
    )
    res = await LlamaServerAdapter(info()).probe(client)
    assert res.models is not None and len(res.models) == 1
    assert res.context_lengths == dict.fromkeys(res.models, 2048)


@pytest.mark.parametrize(
    "props",
    [(404, b"{}"), (200, b"not json"), (200, b'{"default_generation_settings":{"n_ctx":0}}'), (200, b"[]")],
)
async def test_llama_server_without_a_usable_props_leaves_the_window_unknown(props: tuple[int, bytes]) -> None:
    client = FakeClient(
        {"/health": (200, b"{}"), "/v1/models": captured("llamacpp/http/02_v1_models.txt"), "/props": props}
    )
    res = await LlamaServerAdapter(info()).probe(client)
    assert res.state == "ready" and res.models and res.context_lengths is None


async def test_vllm_window_is_max_model_len_of_each_card_from_the_real_capture() -> None:
    client = FakeClient({"/health": (200, b""), "/v1/models": captured("vllm/models.txt")})
    res = await VLLMAdapter(info()).probe(client)
    assert res.context_lengths == {"tiny-llama": 512}


async def test_a_window_that_is_not_a_positive_integer_is_not_known() -> None:
    cards = b'{"data":[{"id":"a","max_model_len":true},{"id":"b","max_model_len":"4096"},{"id":"c"}]}'
    client = FakeClient({"/health": (200, b""), "/v1/models": (200, cards)})
    res = await VLLMAdapter(info()).probe(client)
    assert res.models == frozenset({"a", "b", "c"}) and res.context_lengths is None


# -- the same through the emulators (which expose the fields as the engines do) ------------------------


class EmulatorProbeClient:
    def __init__(self, url: str, http: httpx.AsyncClient) -> None:
        self.url, self.http = url, http

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        r = await self.http.get(self.url + path, headers=dict(headers or {}))
        return r.status_code, r.content

    def now(self) -> float:
        return 0.0


@pytest.mark.parametrize(
    ("engine", "learned"),
    [
        ("llama-server", True),
        ("vllm", True),
        ("sglang", True),
        ("tabbyapi", True),
        ("lmdeploy", False),
        ("ollama", False),
    ],
)
async def test_each_adapter_learns_the_window_its_emulator_reports(engine: str, learned: bool) -> None:
    with EmulatorThread(EmulatorConfig(engine=engine, model="tiny", ctx_len=3072)) as emu:
        async with httpx.AsyncClient(timeout=5) as http:
            res = await ADAPTERS[engine](info()).probe(EmulatorProbeClient(emu.url, http))
    assert res.state == "ready" and res.models
    if learned:
        assert res.context_lengths == dict.fromkeys(res.models, 3072)
    else:  # LMDeploy's cards carry no length; Ollama's trained length is not the num_ctx it runs with
        assert res.context_lengths is None


# -- the lower bound the fit is judged on --------------------------------------------------------------


def test_the_prompt_floor_is_non_blank_bytes_over_eight_and_below_the_typical_estimate() -> None:
    text = "word " * 800  # 4,000 bytes, 3,200 of them not blanks: at least 400 tokens under any tokenizer
    r = read_request("chat", {"model": "m", "messages": [{"role": "user", "content": text}]})
    assert r.prompt_floor == 400 and r.prompt_tokens > 2 * r.prompt_floor
    cjk = read_request("chat", {"model": "m", "messages": [{"role": "user", "content": "字" * 80}]})
    assert cjk.prompt_floor == 30  # 240 UTF-8 bytes


def test_a_batch_counts_its_largest_prompt_and_token_ids_count_one_each() -> None:
    assert read_request("completions", {"model": "m", "prompt": ["a" * 80, "b" * 800]}).prompt_floor == 100
    assert read_request("completions", {"model": "m", "prompt": list(range(300))}).prompt_floor == 300
    assert read_request("embeddings", {"model": "m", "input": [[1] * 50, [2] * 70]}).prompt_floor == 70


def test_a_request_asking_vllm_to_cut_its_prompt_has_no_floor() -> None:
    body = {"model": "m", "prompt": "x" * 8000, "truncate_prompt_tokens": 100}
    assert read_request("completions", body).prompt_floor == 0


# -- selection: skip what cannot fit, fail over to a bigger window, 400 before any engine ---------------

CONFIG = """
server: {access_log: false}
auth: {mode: none}
routing: {retries: 2}
backends:
  - {name: small, engine: vllm, url: "http://small.test"}
  - {name: big, engine: vllm, url: "http://big.test"}
  - {name: llama, engine: llama-server, url: "http://llama.test"}
  - {name: unknown, engine: lmdeploy, url: "http://unknown.test"}
models:
  - name: two
    strategy: priority
    deployments:
      - {backend: small, model: up, format: safetensors, priority: 0}
      - {backend: big, model: up, format: safetensors, priority: 1}
  - name: small-only
    deployments: [{backend: small, model: up, format: safetensors}]
  - name: overridden
    deployments: [{backend: big, model: up, format: safetensors, context_length: 1000}]
  - name: with-fallback
    fallbacks: [two]
    deployments: [{backend: small, model: up, format: safetensors}]
  - name: llama
    deployments: [{backend: llama, model: whatever-it-loaded, format: gguf}]
  - name: no-window
    deployments: [{backend: unknown, model: up, format: safetensors}]
"""


def chat_answer() -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 1,
            "model": "up",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
        }
    )


def cards(window: int) -> FakeAnswer:
    return FakeAnswer.json({"object": "list", "data": [{"id": "up", "object": "model", "max_model_len": window}]})


def engines() -> FakeUpstream:
    routes: dict[tuple[str, str], Any] = {}
    for name, window in (("small", 2048), ("big", 32768)):
        routes[("GET", f"http://{name}.test/health")] = FakeAnswer.json({})
        routes[("GET", f"http://{name}.test/v1/models")] = cards(window)
        routes[("POST", f"http://{name}.test/v1/chat/completions")] = chat_answer()
    routes[("GET", "http://llama.test/health")] = FakeAnswer.json({"status": "ok"})
    routes[("GET", "http://llama.test/v1/models")] = FakeAnswer.json({"data": [{"id": "/models/tiny.gguf"}]})
    routes[("GET", "http://llama.test/props")] = FakeAnswer.json({"default_generation_settings": {"n_ctx": 4096}})
    routes[("POST", "http://llama.test/v1/chat/completions")] = chat_answer()
    routes[("GET", "http://unknown.test/health")] = FakeAnswer.json({"status": "healthy"})
    routes[("POST", "http://unknown.test/v1/chat/completions")] = chat_answer()
    return FakeUpstream(routes, default=FakeAnswer.json({"detail": "Not Found"}, status=404))


async def probed(app: Any, up: FakeUpstream) -> None:
    for b in app.gw.runtime.table.backends.values():
        await probe_once(up, b)
    up.calls.clear()


def chat(model: str, chars: int, max_tokens: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "x" * chars}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def posted(up: FakeUpstream) -> list[str]:
    return [c.url for c in up.calls if c.method == "POST"]


async def test_a_request_too_big_for_the_first_choice_goes_to_the_bigger_window() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        small = await client.post("/v1/chat/completions", json=chat("two", 800, max_tokens=100))
        assert small.headers["x-gateway-backend"] == "small"  # fits: the priority order holds
        # floor 3,000 tokens (24,000 bytes / 8) > 2,048: the small window is skipped, not tried
        big = await client.post("/v1/chat/completions", json=chat("two", 24_000))
        assert (big.status_code, big.headers["x-gateway-backend"]) == (200, "big")
        # a prompt that fits plus max_tokens that does not: vLLM counts the output against its window
        out = await client.post("/v1/chat/completions", json=chat("two", 800, max_tokens=4000))
        assert out.headers["x-gateway-backend"] == "big"
    assert posted(up) == [
        "http://small.test/v1/chat/completions",
        "http://big.test/v1/chat/completions",
        "http://big.test/v1/chat/completions",
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_no_deployment_fits_is_400_context_length_exceeded_before_any_engine_is_called(stream: bool) -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("small-only", 24_000, stream=stream))
        with_out = await client.post("/v1/chat/completions", json=chat("small-only", 8000, max_tokens=1500))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["type"], err["param"]) == ("context_length_exceeded", "invalid_request_error", "messages")
    assert "2048 tokens" in err["message"] and "at least 3000 tokens" in err["message"]
    assert "gateway's estimate" in err["message"]
    assert with_out.status_code == 400
    assert "at least 2500 tokens (1000 of prompt and max_tokens 1500)" in with_out.json()["error"]["message"]
    assert posted(up) == []


async def test_a_request_between_the_floor_and_the_window_is_the_engines_to_judge() -> None:
    # 12,000 bytes: some 3,000 tokens by the typical estimate, over 2,048, but the floor is 1,500; the
    # engine is asked to count (routing/prompt_count.py) and, without a /tokenize here (404), the floor decides
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("small-only", 12_000))
    assert r.status_code == 200
    assert posted(up) == ["http://small.test/tokenize", "http://small.test/v1/chat/completions"]


async def test_llama_server_output_is_not_counted_and_its_one_model_takes_the_window() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        ok = await client.post("/v1/chat/completions", json=chat("llama", 800, max_tokens=100_000))
        too_long = await client.post("/v1/chat/completions", json=chat("llama", 40_000))
    assert ok.status_code == 200  # llama-server cuts the generation at the window's end (finish "length")
    assert too_long.status_code == 400 and "4096 tokens" in too_long.json()["error"]["message"]
    assert posted(up) == ["http://llama.test/v1/chat/completions"]


async def test_the_configured_window_overrides_the_probed_one_and_unknown_always_fits() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        over = await client.post("/v1/chat/completions", json=chat("overridden", 9_000))  # floor 1,125 > 1,000
        unknown = await client.post("/v1/chat/completions", json=chat("no-window", 1_000_000))
    assert over.status_code == 400 and "1000 tokens" in over.json()["error"]["message"]
    assert unknown.status_code == 200
    assert posted(up) == ["http://unknown.test/v1/chat/completions"]


async def test_a_fallback_with_a_window_that_fits_serves_what_the_model_cannot() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("with-fallback", 24_000))
    assert (r.status_code, r.headers["x-gateway-backend"]) == (200, "big")
    assert posted(up) == ["http://big.test/v1/chat/completions"]


# -- /v1/models and metrics ------------------------------------------------------------------------------


async def test_models_carry_the_smallest_known_window_and_readiness() -> None:
    up = engines()
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        before = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        await probed(app, up)
        listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        one = (await client.get("/v1/models/two")).json()
        app.gw.runtime.table.backends["small"].state = "down"
        down = (await client.get("/v1/models/small-only")).json()
        metrics = (await client.get("/metrics")).text
    assert "context_length" not in before["two"] and before["two"]["ready"] is False  # not probed yet
    assert listed["two"]["context_length"] == 2048 and listed["two"]["ready"] is True
    assert one == listed["two"] and one["owned_by"] == "llm-gateway" and one["object"] == "model"
    assert listed["overridden"]["context_length"] == 1000
    assert listed["llama"]["context_length"] == 4096
    assert "context_length" not in listed["no-window"] and listed["no-window"]["ready"] is True
    assert down["ready"] is False and down["context_length"] == 2048
    assert 'gateway_deployment_context_length{backend="small",model="two",upstream_model="up"} 2048.0' in metrics
    assert 'gateway_deployment_context_length{backend="big",model="overridden",upstream_model="up"} 1000.0' in metrics
    assert 'backend="unknown"' not in metrics.split("gateway_deployment_context_length")[-1].split("# HELP")[0]
