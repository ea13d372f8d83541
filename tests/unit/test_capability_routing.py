"""Capability routing through HTTP: a request that needs vision, tools or json_schema goes only to a
deployment that declares it, and is refused (400 capability_unavailable) before any engine is called
when no deployment of the model declares it. A request that needs nothing special may go anywhere.

Engines are played by a FakeUpstream at the gateway's upstream seam; which backend served a request is
read from the x-gateway-backend header and from the calls each engine URL received.
"""

from __future__ import annotations

from typing import Any

import pytest

from llm_gateway.settings import GatewayConfig
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

A_CHAT = "http://engine-a.test/v1/chat/completions"
B_CHAT = "http://engine-b.test/v1/chat/completions"

CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
backends:
  - {name: engine-a, engine: vllm, url: "http://engine-a.test"}
  - {name: engine-b, engine: vllm, url: "http://engine-b.test"}
models:
  - name: plain
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
      - {backend: engine-b, model: upstream-model, format: safetensors}
  - name: vision-only-on-b
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
      - {backend: engine-b, model: upstream-model, format: safetensors, capabilities: [chat, vision]}
  - name: tools-only-on-b
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
      - {backend: engine-b, model: upstream-model, format: safetensors, capabilities: [chat, tools]}
  - name: json_schema-only-on-b
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
      - {backend: engine-b, model: upstream-model, format: safetensors, capabilities: [chat, json_schema]}
  - name: split-vision-tools
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors, capabilities: [chat, vision]}
      - {backend: engine-b, model: upstream-model, format: safetensors, capabilities: [chat, tools]}
"""

HELLO = [{"role": "user", "content": "hello"}]
IMAGE_MESSAGES = [
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        ],
    }
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}}}

# what each capability asks of a chat body, and the field the engine must receive intact
NEEDS: dict[str, tuple[dict[str, Any], str]] = {
    "vision": ({"messages": IMAGE_MESSAGES}, "messages"),
    "tools": ({"messages": HELLO, "tools": TOOLS}, "tools"),
    "json_schema": ({"messages": HELLO, "response_format": JSON_SCHEMA}, "response_format"),
}


def chat_json() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }


def engines() -> FakeUpstream:
    return FakeUpstream(
        {("POST", A_CHAT): FakeAnswer.json(chat_json()), ("POST", B_CHAT): FakeAnswer.json(chat_json())}
    )


@pytest.fixture
def cfg() -> GatewayConfig:
    return make_config(CONFIG)


def error_of(r: Any) -> dict[str, Any]:
    assert r.status_code == 400, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


# -- no deployment declares it: refused before any engine is asked -------------------------------------


@pytest.mark.parametrize("capability", sorted(NEEDS))
async def test_a_request_needing_a_capability_no_deployment_declares_is_400_before_any_engine_is_called(
    cfg: GatewayConfig, capability: str
) -> None:
    up = engines()
    fields, _ = NEEDS[capability]
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={"model": "plain", **fields})
        stream = await client.post("/v1/chat/completions", json={"model": "plain", "stream": True, **fields})
    for resp in (r, stream):
        err = error_of(resp)
        assert err == {
            "message": f"model 'plain' has no deployment with the capabilities this request needs: {capability}",
            "type": "invalid_request_error",
            "param": "model",
            "code": "capability_unavailable",
        }
        assert "x-gateway-backend" not in resp.headers
    assert up.calls == []


async def test_the_legacy_functions_field_also_needs_tools() -> None:
    up = engines()
    body = {"model": "plain", "messages": HELLO, "functions": [{"name": "f", "parameters": {}}]}
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json=body)
    err = error_of(r)
    assert err["code"] == "capability_unavailable" and err["message"].endswith("needs: tools")
    assert up.calls == []


async def test_needs_met_only_by_different_deployments_together_are_refused_as_a_combination(
    cfg: GatewayConfig,
) -> None:
    # engine-a has vision, engine-b has tools: no single deployment can serve an image request with tools
    up = engines()
    body = {"model": "split-vision-tools", "messages": IMAGE_MESSAGES, "tools": TOOLS}
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json=body)
    err = error_of(r)
    assert err["code"] == "capability_unavailable" and err["param"] == "model"
    assert err["message"] == (
        "model 'split-vision-tools' has no deployment with the capabilities this request needs: a combination"
    )
    assert up.calls == []


# -- one deployment declares it: every such request lands there ------------------------------------------


@pytest.mark.parametrize("capability", sorted(NEEDS))
async def test_a_request_needing_a_capability_lands_only_on_the_deployment_that_declares_it(
    cfg: GatewayConfig, capability: str
) -> None:
    up = engines()
    fields, field = NEEDS[capability]
    model = f"{capability}-only-on-b"  # engine-a (listed first) lacks it, engine-b declares it
    async with gateway_client(cfg, upstream=up) as (client, _):
        rs = [await client.post("/v1/chat/completions", json={"model": model, **fields}) for _ in range(20)]
    assert [r.status_code for r in rs] == [200] * 20
    assert [r.headers["x-gateway-backend"] for r in rs] == ["engine-b"] * 20
    assert up.calls_to(A_CHAT) == []
    got = up.calls_to(B_CHAT)
    assert len(got) == 20
    assert all(c.json()[field] == fields[field] and c.json()["model"] == "upstream-model" for c in got)


async def test_a_streamed_request_needing_tools_also_lands_only_on_the_declaring_deployment(cfg: GatewayConfig) -> None:
    sse = b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"upstream-model","choices":[]}\n\n'
    answer = FakeAnswer.sse(sse + b"data: [DONE]\n\n")
    up = FakeUpstream({("POST", A_CHAT): answer, ("POST", B_CHAT): answer})
    body = {"model": "tools-only-on-b", "messages": HELLO, "tools": TOOLS, "stream": True}
    async with gateway_client(cfg, upstream=up) as (client, _):
        rs = [await client.post("/v1/chat/completions", json=body) for _ in range(10)]
    assert [(r.status_code, r.headers["x-gateway-backend"]) for r in rs] == [(200, "engine-b")] * 10
    assert up.calls_to(A_CHAT) == [] and len(up.calls_to(B_CHAT)) == 10


@pytest.mark.parametrize("capability", sorted(NEEDS))
async def test_a_request_not_needing_the_capability_may_go_to_either_deployment(capability: str) -> None:
    # least_load, named: identical stateless requests then take turns over both (the default for two deployments,
    # cache_aware, keeps identical prompts on one deployment until it is max_imbalance busier)
    up = engines()
    model = f"  - name: {capability}-only-on-b\n"
    cfg = make_config(CONFIG.replace(model, model + "    strategy: least_load\n"))
    assert cfg.models[[m.name for m in cfg.models].index(f"{capability}-only-on-b")].strategy == "least_load"
    async with gateway_client(cfg, upstream=up) as (client, _):
        rs = [
            await client.post("/v1/chat/completions", json={"model": f"{capability}-only-on-b", "messages": HELLO})
            for _ in range(20)
        ]
    assert [r.status_code for r in rs] == [200] * 20
    served = [r.headers["x-gateway-backend"] for r in rs]
    assert set(served) == {"engine-a", "engine-b"}
    assert len(up.calls_to(A_CHAT)) == served.count("engine-a") > 0
    assert len(up.calls_to(B_CHAT)) == served.count("engine-b") > 0


# -- the default capabilities -----------------------------------------------------------------------------


async def test_by_default_a_deployment_declares_only_chat_and_completions_so_tools_or_embeddings_are_refused() -> None:
    """A deployment with no `capabilities` is `chat, completions` (settings.DeploymentConfig): a tools,
    vision, json_schema or embeddings request to a model made only of such deployments is a 400, even
    when the engine itself could serve it; declare the capability to route such requests there."""
    cfg = make_config(CONFIG)
    assert all(d.capabilities == {"chat", "completions"} for d in cfg.models[0].deployments)
    up = engines()
    up.route("POST", "http://engine-a.test/v1/completions", FakeAnswer.json({"choices": [{"index": 0, "text": "x"}]}))
    up.route("POST", "http://engine-b.test/v1/completions", FakeAnswer.json({"choices": [{"index": 0, "text": "x"}]}))
    async with gateway_client(cfg, upstream=up) as (client, _):
        tools = await client.post("/v1/chat/completions", json={"model": "plain", "messages": HELLO, "tools": TOOLS})
        emb = await client.post("/v1/embeddings", json={"model": "plain", "input": "x"})
        assert up.calls == []
        chat = await client.post("/v1/chat/completions", json={"model": "plain", "messages": HELLO})
        completion = await client.post("/v1/completions", json={"model": "plain", "prompt": "x"})
    assert (
        error_of(tools)["message"] == "model 'plain' has no deployment with the capabilities this request needs: tools"
    )
    assert error_of(emb) == {
        "message": "model 'plain' has no deployment with the capabilities this request needs: embeddings",
        "type": "invalid_request_error",
        "param": "model",
        "code": "capability_unavailable",
    }
    assert chat.status_code == 200 and completion.status_code == 200, (chat.text, completion.text)
    assert [c.path for c in up.calls] == ["/v1/chat/completions", "/v1/completions"]
