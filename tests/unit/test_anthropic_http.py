"""`POST /v1/messages` and `/v1/messages/count_tokens` in-process (ASGI), the engine played by a
FakeUpstream: the request reaches the engine as an OpenAI chat body through the chat path's service
(keys, limits, routing, usage), the answer comes back as Anthropic's message or event stream, and every
error is Anthropic's envelope with Anthropic's status and the gateway's headers. Also the engines' own
token counting (vLLM `/tokenize`, llama-server `/apply-template` + `/tokenize`) behind count_tokens."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from llm_gateway.adapters.base import TokenizeClient
from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.types import BackendInfo
from tests.conftest import ONE_BACKEND, OTHER_KEY, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, Stall, cut, refused, timed_out

ENGINE = "http://engine-a.test"
ENGINE_CHAT = f"{ENGINE}/v1/chat/completions"
MESSAGES = {"model": "public-model", "max_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}
ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


def whole(content: str = "hi there", finish: str = "stop", **message: Any) -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-7",
            "object": "chat.completion",
            "created": 1,
            "model": "upstream-model",
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content, **message}, "finish_reason": finish}
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
        }
    )


def ev(obj: dict[str, Any] | str) -> bytes:
    return b"data: " + (obj.encode() if isinstance(obj, str) else orjson.dumps(obj)) + b"\n\n"


HEAD = {"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1, "model": "upstream-model"}


def delta(d: dict[str, Any], finish: str | None = None) -> bytes:
    return ev({**HEAD, "choices": [{"index": 0, "delta": d, "finish_reason": finish}]})


USAGE = ev({**HEAD, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}})


def streamed(*tail: bytes | Stall | BaseException) -> FakeAnswer:
    return FakeAnswer.sse(
        delta({"role": "assistant", "content": ""}), delta({"content": "hi"}), delta({"content": " there"}), *tail
    )


def events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.split("\n\n"):
        if frame:
            name, data = frame.split("\n")
            out.append((name.removeprefix("event: "), orjson.loads(data.removeprefix("data: "))))
    return out


def engine(answer: Any) -> FakeUpstream:
    return FakeUpstream({("POST", ENGINE_CHAT): answer})


def assert_anthropic_error(r: httpx.Response, status: int, etype: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == etype, body
    assert body["request_id"] == r.headers["x-request-id"]
    assert set(body) == {"type", "error", "request_id"} and set(body["error"]) == {"type", "message"}
    return body["error"]  # type: ignore[no-any-return]


#: these cases are the translated path: a generic OpenAI-compatible engine (vLLM serves Messages itself,
#: see test_anthropic_native.py)
TRANSLATED = ONE_BACKEND.replace("engine: vllm", "engine: openai")


def config(extra_key: str = "", server: str = "{access_log: false}", backend: str = "") -> Any:
    text = TRANSLATED.replace("server: {access_log: false}", f"server: {server}")
    if extra_key:
        text = text.replace(
            '{name: alice, sha256: "${ALICE_SHA}"}', f'{{name: alice, sha256: "${{ALICE_SHA}}", {extra_key}}}'
        )
    if backend:
        text = text.replace("    api_key: engine-secret-a\n", f"    api_key: engine-secret-a\n{backend}")
    return make_config(text)


# -- whole and streamed answers ------------------------------------------------------------------------------


async def test_a_whole_message_goes_through_the_chat_path_and_comes_back_as_anthropics_message() -> None:
    up = engine(whole())
    async with gateway_client(config(), upstream=up, key=None) as (client, _):
        r = await client.post(
            "/v1/messages",
            json={**MESSAGES, "system": "Be brief.", "stop_sequences": ["END"]},
            headers={"x-api-key": TEST_KEY, **ANTHROPIC_HEADERS, "x-request-id": "req-42"},
        )
    assert r.status_code == 200, r.text
    assert r.json() == {
        "id": "msg_7",
        "type": "message",
        "role": "assistant",
        "model": "public-model",
        "content": [{"type": "text", "text": "hi there"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 5,
            "output_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert r.headers["x-request-id"] == r.headers["request-id"] == "req-42"
    assert r.headers["x-gateway-backend"] == "engine-a" and r.headers["x-gateway-model"] == "public-model"
    (call,) = up.calls_to(ENGINE_CHAT)
    assert call.headers["authorization"] == "Bearer engine-secret-a"  # the engine's key, never the client's
    assert call.json() == {
        "model": "upstream-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
        "max_tokens": 100,
        "max_completion_tokens": 100,
        "stop": ["END"],
    }


async def test_a_stream_is_anthropics_event_order_and_the_engine_is_asked_for_usage() -> None:
    up = engine(streamed(delta({}, "stop"), USAGE, b"data: [DONE]\n\n"))
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "stream": True}, headers=ANTHROPIC_HEADERS)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    evs = events(r.text)
    assert [n for n, _ in evs] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert evs[0][1]["message"]["model"] == "public-model"
    assert [e["delta"]["text"] for n, e in evs if n == "content_block_delta"] == ["hi", " there"]
    assert evs[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None},
        "usage": {
            "input_tokens": 5,
            "output_tokens": 2,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert "[DONE]" not in r.text
    assert up.calls_to(ENGINE_CHAT)[0].json()["stream_options"] == {"include_usage": True}


async def test_a_tool_call_answer_whole_and_streamed() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}}
    frag = [
        {"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city":"Paris"}'}},
    ]
    up = FakeUpstream(
        {
            ("POST", ENGINE_CHAT): [
                whole("", "tool_calls", tool_calls=[call]),
                FakeAnswer.sse(
                    delta({"role": "assistant", "tool_calls": [frag[0]]}),
                    delta({"tool_calls": [frag[1]]}),
                    delta({}, "tool_calls"),
                    USAGE,
                    b"data: [DONE]\n\n",
                ),
            ]
        }
    )
    tools = [{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    cfg = make_config(TRANSLATED.replace("embeddings]}", "embeddings, tools]}"))
    async with gateway_client(cfg, upstream=up) as (client, _):
        r1 = await client.post("/v1/messages", json={**MESSAGES, "tools": tools})
        r2 = await client.post("/v1/messages", json={**MESSAGES, "tools": tools, "stream": True})
    assert r1.json()["content"] == [{"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}}]
    assert r1.json()["stop_reason"] == "tool_use"
    evs = events(r2.text)
    assert evs[2][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "weather", "input": {}}
    assert evs[3][1]["delta"] == {"type": "input_json_delta", "partial_json": '{"city":"Paris"}'}
    assert evs[-2][1]["delta"]["stop_reason"] == "tool_use"
    sent = up.calls_to(ENGINE_CHAT)[0].json()
    assert sent["tools"] == [
        {"type": "function", "function": {"name": "weather", "parameters": tools[0]["input_schema"]}}
    ]


async def test_an_engine_failure_mid_stream_is_anthropics_error_event() -> None:
    up = engine(streamed(cut()))
    async with gateway_client(config(), upstream=up) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
    assert r.status_code == 200
    evs = events(r.text)
    assert [n for n, _ in evs][-2:] == ["content_block_delta", "error"]
    assert evs[-1][1]["type"] == "error" and evs[-1][1]["error"]["type"] == "api_error"
    assert "closed the connection" in evs[-1][1]["error"]["message"]


# -- keys, limits, usage, metrics: the chat path's ----------------------------------------------------------


@pytest.mark.parametrize("auth", ["x-api-key", "bearer"])
async def test_keys_come_as_x_api_key_or_bearer(auth: str) -> None:
    headers = {"x-api-key": TEST_KEY} if auth == "x-api-key" else {"authorization": f"Bearer {TEST_KEY}"}
    async with gateway_client(config(), upstream=engine(whole()), key=None) as (client, _):
        ok = await client.post("/v1/messages", json=MESSAGES, headers={**headers, **ANTHROPIC_HEADERS})
        missing = await client.post("/v1/messages", json=MESSAGES, headers=ANTHROPIC_HEADERS)
        wrong = await client.post("/v1/messages", json=MESSAGES, headers={"x-api-key": OTHER_KEY})
    assert ok.status_code == 200, ok.text
    assert "API key" in assert_anthropic_error(missing, 401, "authentication_error")["message"]
    assert_anthropic_error(wrong, 401, "authentication_error")
    assert OTHER_KEY not in wrong.text


async def test_limits_headers_and_usage_accounting_are_the_chat_paths() -> None:
    # reserved: the estimate (16 + 5) // 4 + 1 = 6 plus max_tokens 100; settled with the engine's 7
    up = FakeUpstream({("POST", ENGINE_CHAT): [whole(), streamed(delta({}, "stop"), USAGE, b"data: [DONE]\n\n")]})
    async with gateway_client(config("limits: {rpm: 2, tpm: 10000}"), upstream=up) as (client, _):
        r1 = await client.post("/v1/messages", json=MESSAGES)
        r2 = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
        r3 = await client.post("/v1/messages", json=MESSAGES)
        metrics = (await client.get("/metrics")).text
    assert (r1.status_code, r2.status_code) == (200, 200)
    assert r1.headers["x-ratelimit-remaining-requests"] == "1"
    assert r1.headers["x-ratelimit-remaining-tokens"] == str(10000 - 106)
    assert r2.headers["x-ratelimit-remaining-tokens"] == str(10000 - 7 - 106)
    err = assert_anthropic_error(r3, 429, "rate_limit_error")
    assert "limit" in err["message"]
    assert r3.headers["retry-after"] and r3.headers["x-ratelimit-remaining-requests"] == "0"
    assert len(up.calls_to(ENGINE_CHAT)) == 2  # the refused one never reached the engine
    series = 'gateway_requests_total{backend="engine-a",endpoint="messages",engine="openai",model="public-model"'
    assert series in metrics
    assert 'gateway_completion_tokens_total{backend="engine-a",model="public-model"} 4.0' in metrics


# -- errors: Anthropic's envelope and statuses ----------------------------------------------------------------


async def test_request_errors() -> None:
    no_max = {k: v for k, v in MESSAGES.items() if k != "max_tokens"}
    async with gateway_client(config("models: [other-*]"), upstream=engine(whole())) as (client, _):
        r_400 = await client.post("/v1/messages", json=no_max)
        r_json = await client.post("/v1/messages", content=b"{not json", headers={"content-type": "application/json"})
        r_403 = await client.post("/v1/messages", json=MESSAGES)
        r_404 = await client.post("/v1/messages", json={**MESSAGES, "model": "nope"})
        r_405 = await client.get("/v1/messages")
        r_mcp = await client.post("/v1/messages", json={**MESSAGES, "mcp_servers": []})
    assert assert_anthropic_error(r_400, 400, "invalid_request_error")["message"] == "max_tokens: Field required"
    assert_anthropic_error(r_json, 400, "invalid_request_error")
    assert_anthropic_error(r_403, 403, "permission_error")
    assert_anthropic_error(r_404, 404, "not_found_error")
    assert_anthropic_error(r_405, 405, "invalid_request_error")
    assert r_405.headers["allow"] == "POST"
    assert "MCP" in assert_anthropic_error(r_mcp, 400, "invalid_request_error")["message"]


async def test_a_body_over_the_limit_is_413_request_too_large() -> None:
    async with gateway_client(config(server="{access_log: false, max_body_bytes: 1024}")) as (client, _):
        r = await client.post("/v1/messages", json={**MESSAGES, "system": "x" * 2000})
    assert_anthropic_error(r, 413, "request_too_large")


async def test_no_capacity_is_529_overloaded_with_retry_after() -> None:
    cfg = config(backend="    max_concurrency: 1\n    max_queue: 0\n")
    async with gateway_client(cfg, upstream=engine(whole())) as (client, app):
        dep = app.gw.runtime.table.resolve("public-model").deployments[0]  # type: ignore[union-attr]
        assert dep.admission.try_enter()  # the one slot is taken
        full = await client.post("/v1/messages", json=MESSAGES)
        dep.admission.leave()
        app.gw.runtime.table.backends["engine-a"].state = "down"
        down = await client.post("/v1/messages", json=MESSAGES)
        metrics = (await client.get("/metrics")).text
    assert "concurrency limit" in assert_anthropic_error(full, 529, "overloaded_error")["message"]
    assert full.headers["retry-after"] == "1"
    assert "no healthy backend" in assert_anthropic_error(down, 529, "overloaded_error")["message"]
    assert down.headers["retry-after"] == "2"
    assert 'status_class="5xx"' in metrics  # the status the client saw


async def test_engine_failures_are_api_and_timeout_errors() -> None:
    async with gateway_client(config(), upstream=engine(refused())) as (client, _):
        r_502 = await client.post("/v1/messages", json=MESSAGES)
    async with gateway_client(config(), upstream=engine(timed_out())) as (client, _):
        r_504 = await client.post("/v1/messages", json=MESSAGES)
    async with gateway_client(config(), upstream=engine(timed_out())) as (client, _):
        r_504s = await client.post("/v1/messages", json={**MESSAGES, "stream": True})
    assert_anthropic_error(r_502, 502, "api_error")
    assert_anthropic_error(r_504, 504, "timeout_error")
    assert_anthropic_error(r_504s, 504, "timeout_error")  # before the first byte: a status, not an event


async def test_openai_routes_keep_openais_envelope() -> None:
    async with gateway_client(config()) as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]}
        )
        r405 = await client.get("/v1/chat/completions")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert r405.status_code == 405 and r405.json()["error"]["code"] == "method_not_allowed"


# -- count_tokens -------------------------------------------------------------------------------------------


NO_ROUTE = FakeAnswer.json({"detail": "Not Found"}, 404)  # a vLLM before its Anthropic router


async def test_count_tokens_asks_the_engines_tokenizer() -> None:
    up = FakeUpstream(
        {
            ("POST", f"{ENGINE}/v1/messages/count_tokens"): NO_ROUTE,
            ("POST", f"{ENGINE}/tokenize"): FakeAnswer.json({"count": 17, "max_model_len": 4096}),
        }
    )
    body = {"model": "pm", "messages": [{"role": "user", "content": "hello"}], "system": "s"}
    async with gateway_client(make_config(ONE_BACKEND), upstream=up) as (client, _):
        r = await client.post("/v1/messages/count_tokens", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"input_tokens": 17}
    assert r.headers["x-gateway-token-count"] == "engine" and r.headers["x-gateway-backend"] == "engine-a"
    (call,) = up.calls_to(f"{ENGINE}/tokenize")
    assert call.json() == {
        "model": "upstream-model",
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}],
        "add_generation_prompt": True,
    }
    assert call.headers["authorization"] == "Bearer engine-secret-a"


async def test_count_tokens_falls_back_to_the_estimate_and_says_so() -> None:
    up = FakeUpstream(
        {
            ("POST", f"{ENGINE}/v1/messages/count_tokens"): NO_ROUTE,
            ("POST", f"{ENGINE}/tokenize"): FakeAnswer.json({"error": "nope"}, 404),
        }
    )
    async with gateway_client(make_config(ONE_BACKEND), upstream=up) as (client, _):
        r = await client.post("/v1/messages/count_tokens", json={"model": "pm", "messages": MESSAGES["messages"]})
        bad = await client.post("/v1/messages/count_tokens", json={"model": "nope", "messages": MESSAGES["messages"]})
    assert r.json() == {"input_tokens": (16 + 5) // 4 + 1}
    assert r.headers["x-gateway-token-count"] == "estimate"
    assert_anthropic_error(bad, 404, "not_found_error")
    down = FakeUpstream(default=refused())
    async with gateway_client(make_config(ONE_BACKEND), upstream=down) as (client, _):
        r = await client.post("/v1/messages/count_tokens", json={"model": "pm", "messages": MESSAGES["messages"]})
    assert r.status_code == 200 and r.headers["x-gateway-token-count"] == "estimate"
    assert len(down.calls) == 1


TOOLS = [
    {
        "name": f"tool_{i}",
        "description": "Looks a thing up in a long catalogue of things, by name and by kind, " * 3,
        "input_schema": {"type": "object", "properties": {"name": {"type": "string"}, "kind": {"type": "string"}}},
    }
    for i in range(2)
]


async def test_the_estimate_counts_tools_and_tool_calls() -> None:
    """No tokenizer reachable: the estimate still grows with the tool definitions and the tool calls, the
    bytes the engine's template renders too (issue 34: two tools estimated the same as none)."""
    plain = {"model": "pm", "messages": MESSAGES["messages"]}
    use = {"type": "tool_use", "id": "toolu_1", "name": "tool_0", "input": {"name": "a" * 400, "kind": "b"}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
    called = {
        "model": "pm",
        "messages": [
            *MESSAGES["messages"],
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
        ],
    }
    down = FakeUpstream(default=refused())
    async with gateway_client(make_config(ONE_BACKEND), upstream=down) as (client, _):
        counts = []
        for body in (plain, {**plain, "tools": TOOLS}, called):
            r = await client.post("/v1/messages/count_tokens", json=body)
            assert r.status_code == 200 and r.headers["x-gateway-token-count"] == "estimate", r.text
            counts.append(r.json()["input_tokens"])
        tool = {"type": "function", "name": "t", "description": "d " * 300, "parameters": {"type": "object"}}
        sizes = []
        for extra in ({}, {"tools": [tool, {**tool, "name": "u"}]}):
            r = await client.post("/v1/responses/input_tokens", json={"model": "pm", "input": "hello", **extra})
            assert r.status_code == 200 and r.headers["x-gateway-token-count"] == "estimate", r.text
            sizes.append(r.json()["input_tokens"])
    tools_bytes = len(orjson.dumps([{"type": "function", "function": {"name": t["name"]}} for t in TOOLS]))
    assert counts[1] >= counts[0] + tools_bytes // 4  # the definitions, at least their names' JSON
    assert counts[1] >= counts[0] + 2 * len(TOOLS[0]["description"]) // 4
    assert counts[2] >= counts[0] + 400 // 4  # the tool call's arguments
    assert sizes[1] >= sizes[0] + 2 * 600 // 4


# -- the adapters' token counting -----------------------------------------------------------------------------


class Poster:
    def __init__(self, answers: dict[str, tuple[int, Any]]) -> None:
        self.answers = answers
        self.posts: list[tuple[str, Any]] = []

    async def post(self, path: str, body: bytes, headers: Any) -> tuple[int, bytes]:
        self.posts.append((path, orjson.loads(body)))
        status, obj = self.answers[path]
        return status, orjson.dumps(obj)


CHAT_BODY = {
    "model": "public",
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 5,
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "chat_template_kwargs": {"enable_thinking": False},
}
BACKEND = BackendInfo("b", "http://b.test", "k")


async def test_vllm_counts_with_tokenize_on_the_chat_messages() -> None:
    p = Poster({"/tokenize": (200, {"count": 11, "max_model_len": 4096, "tokens": [1] * 11})})
    client: TokenizeClient = p
    assert await VLLMAdapter(BACKEND).count_prompt_tokens(client, CHAT_BODY, "up") == 11
    assert p.posts == [
        (
            "/tokenize",
            {
                "model": "up",
                "messages": CHAT_BODY["messages"],
                "tools": CHAT_BODY["tools"],
                "chat_template_kwargs": {"enable_thinking": False},
                "add_generation_prompt": True,
            },
        )
    ]
    assert (
        await VLLMAdapter(BACKEND).count_prompt_tokens(Poster({"/tokenize": (400, {"error": "x"})}), CHAT_BODY, "up")
        is None
    )


async def test_llama_server_renders_the_template_then_tokenizes() -> None:
    p = Poster({"/apply-template": (200, {"prompt": "<|user|>hi"}), "/tokenize": (200, {"tokens": [5, 6, 7]})})
    assert await LlamaServerAdapter(BACKEND).count_prompt_tokens(p, CHAT_BODY, "up") == 3
    assert p.posts == [
        (
            "/apply-template",
            {
                "messages": CHAT_BODY["messages"],
                "tools": CHAT_BODY["tools"],
                "chat_template_kwargs": {"enable_thinking": False},
            },
        ),
        ("/tokenize", {"content": "<|user|>hi", "add_special": True, "parse_special": True}),
    ]
    no_template = Poster({"/apply-template": (404, {"error": "no"})})
    assert await LlamaServerAdapter(BACKEND).count_prompt_tokens(no_template, CHAT_BODY, "up") is None
    assert [path for path, _ in no_template.posts] == ["/apply-template"]


async def test_an_engine_without_a_tokenizer_endpoint_does_not_count() -> None:
    p = Poster({})
    assert await OllamaAdapter(BackendInfo("o", "http://o.test")).count_prompt_tokens(p, CHAT_BODY, "up") is None
    assert p.posts == []
