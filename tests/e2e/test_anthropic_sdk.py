"""Anthropic's Messages API end to end with the unmodified `anthropic` SDK as the caller: the SDK -> the
gateway as a real process -> (a) a vLLM emulator (whole, streamed with `messages.stream`, system prompt,
stop sequences, a tool use round trip, thinking, count_tokens, and errors as the SDK's typed exceptions) and
(b) the real llama-server with the tiny model (whole, streamed, count_tokens by its own tokenizer).
The emulator never calls tools, so the SDK's reading of tool_use answers (whole and streamed) is shown
against the gateway in-process, the engine played by a FakeUpstream."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import orjson
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.app import create_app
from llm_gateway_emulators import EmulatorConfig, EmulatorThread, expected_text
from tests.conftest import ONE_BACKEND, TEST_KEY, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

ALICE = "sk-e2e-alice-0123456789"
BOB = "sk-e2e-bob-0123456789"  # one request a minute
CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{alice}"}}
    - {{name: bob, sha256: "{bob}", limits: {{rpm: 1}}}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", api_key: emu-key, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny-public
    aliases: [tiny-alias]
    deployments: [{{backend: emu, model: tiny, format: safetensors, capabilities: [chat, tools]}}]
"""
USER = [{"role": "user", "content": "Hello"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture(scope="module")
def emulator() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", api_key="emu-key")) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(emulator: EmulatorThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(alice=digest_of(ALICE), bob=digest_of(BOB), url=emulator.url)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-anthropic")) as gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key=ALICE, max_retries=0, timeout=30)


def sent(emulator: EmulatorThread) -> dict[str, Any]:
    """The OpenAI chat body the engine got for the last request."""
    last = emulator.stats.last_request
    assert last is not None and last["path"] == "/v1/chat/completions", last
    body: dict[str, Any] = last["json"]
    return body


# -- (a) the vLLM emulator --------------------------------------------------------------------------------


def test_a_whole_message(client: anthropic.Anthropic, emulator: EmulatorThread) -> None:
    msg = client.messages.create(model="tiny-public", max_tokens=8, messages=USER)
    assert isinstance(msg, anthropic.types.Message)
    assert msg.id.startswith("msg_") and msg.role == "assistant" and msg.model == "tiny-public"
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == expected_text(8)  # type: ignore[union-attr]
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 8 and msg.usage.input_tokens > 0
    assert sent(emulator)["model"] == "tiny" and sent(emulator)["max_tokens"] == 8


def test_a_streamed_message(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="tiny-alias", max_tokens=12, messages=USER) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) == 12  # one delta per token, not one buffered blob
    assert "".join(pieces) == expected_text(12)
    assert final.content[0].text == expected_text(12)  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12 and final.usage.input_tokens > 0
    assert final.model == "tiny-public"


def test_raw_stream_events_are_in_anthropics_order(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="tiny-public", max_tokens=3, messages=USER) as stream:
        kinds = [e.type for e in stream if e.type not in ("text",)]  # "text" is the SDK's own convenience event
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]


def test_a_system_prompt_and_sampling_fields(client: anthropic.Anthropic, emulator: EmulatorThread) -> None:
    client.messages.create(
        model="tiny-public",
        max_tokens=4,
        system=[{"type": "text", "text": "You are terse."}, {"type": "text", "text": "No lists."}],
        messages=USER,
        metadata={"user_id": "u-1"},
        extra_body={"temperature": 0.2, "top_k": 5},  # sampling fields this SDK no longer types; older ones send them
    )
    body = sent(emulator)
    assert body["messages"] == [{"role": "system", "content": "You are terse.\n\nNo lists."}, *USER]
    assert (body["temperature"], body["top_k"], body["user"]) == (0.2, 5, "u-1")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_stop_sequences(client: anthropic.Anthropic, stream: bool) -> None:
    args: dict[str, Any] = {"model": "tiny-public", "max_tokens": 30, "messages": USER, "stop_sequences": [" test"]}
    if stream:
        with client.messages.stream(**args) as s:
            msg = s.get_final_message()
    else:
        msg = client.messages.create(**args)
    assert msg.content[0].text == "Hello, this is a"  # type: ignore[union-attr]
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == " test"


def test_a_tool_use_round_trip(client: anthropic.Anthropic, emulator: EmulatorThread) -> None:
    first = client.messages.create(
        model="tiny-public", max_tokens=5, messages=USER, tools=[WEATHER], tool_choice={"type": "auto"}
    )
    assert first.stop_reason == "max_tokens"
    body = sent(emulator)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER["input_schema"],
                "description": "The weather in a city",
            },
        }
    ]
    assert body["tool_choice"] == "auto"
    # the client ran the tool the model asked for, and sends the result back
    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_01", "content": "18C, sunny"}]},
    ]
    with client.messages.stream(model="tiny-public", max_tokens=5, messages=history, tools=[WEATHER]) as s:
        answer = s.get_final_message()
    assert answer.content[0].text == expected_text(5)  # type: ignore[union-attr]
    assert sent(emulator)["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "18C, sunny"},
    ]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_thinking_the_engines_reasoning_becomes_thinking_blocks(
    client: anthropic.Anthropic, emulator: EmulatorThread, stream: bool
) -> None:
    args: dict[str, Any] = {
        "model": "tiny-public",
        "max_tokens": 7,  # the budget is checked (>= 1024) but not enforced: engines have none
        "messages": USER,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
    }
    emulator.config.reasoning_tokens = 3  # the first 3 of the 7 tokens are reasoning
    try:
        if stream:
            with client.messages.stream(**args) as s:
                kinds = [e.delta.type for e in s if e.type == "content_block_delta"]
                msg = s.get_final_message()
            assert kinds == ["thinking_delta"] * 3 + ["text_delta"] * 4
        else:
            msg = client.messages.create(**args)
    finally:
        emulator.config.reasoning_tokens = 0
    assert sent(emulator)["chat_template_kwargs"] == {"enable_thinking": True}
    assert [b.type for b in msg.content] == ["thinking", "text"]
    thinking, text = msg.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock) and thinking.thinking == expected_text(3)
    assert isinstance(text, anthropic.types.TextBlock) and text.text
    assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == 7


def test_count_tokens_by_the_engines_tokenizer(client: anthropic.Anthropic) -> None:
    raw = client.messages.with_raw_response.count_tokens(model="tiny-public", messages=USER, system="Be brief.")
    assert raw.headers["x-gateway-token-count"] == "engine"
    # the emulator's chat count: 3 + per message (4 + ceil(len / 4))
    assert raw.parse().input_tokens == 3 + (4 + 3) + (4 + 2)


def test_errors_are_the_sdks_typed_exceptions(gateway: GatewayProcess, client: anthropic.Anthropic) -> None:
    bad_key = anthropic.Anthropic(base_url=gateway.url, api_key="sk-wrong-000000000", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as auth:
        bad_key.messages.create(model="tiny-public", max_tokens=5, messages=USER)
    assert auth.value.status_code == 401 and auth.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
    with pytest.raises(anthropic.NotFoundError) as nf:
        client.messages.create(model="no-such-model", max_tokens=5, messages=USER)
    assert nf.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as br:
        client.messages.create(model="tiny-public", max_tokens=5, messages=USER, extra_body={"temperature": 1.5})
    assert "temperature" in br.value.message
    with pytest.raises(anthropic.BadRequestError) as unsupported:
        client.messages.create(model="tiny-public", max_tokens=5, messages=USER, extra_body={"mcp_servers": []})
    assert "not supported by this gateway" in unsupported.value.message
    bob = anthropic.Anthropic(base_url=gateway.url, auth_token=BOB, max_retries=0)  # Authorization: Bearer
    bob.messages.create(model="tiny-public", max_tokens=2, messages=USER)
    with pytest.raises(anthropic.RateLimitError) as rl:
        bob.messages.create(model="tiny-public", max_tokens=2, messages=USER)
    assert (
        rl.value.response.headers["retry-after"] and rl.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    )


# -- the SDK reading tool_use answers (the engine played in-process) -----------------------------------------


async def test_the_sdk_reads_tool_use_answers_whole_and_streamed() -> None:
    call = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}
    whole = {
        "id": "chatcmpl-t",
        "object": "chat.completion",
        "model": "upstream-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "On it.", "tool_calls": [call]},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39},
    }
    head = {"id": "chatcmpl-t", "object": "chat.completion.chunk", "model": "upstream-model"}

    def ev(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        return b"data: " + orjson.dumps({**head, "choices": choices, **extra}) + b"\n\n"

    frag = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    streamed = FakeAnswer.sse(
        ev([{"index": 0, "delta": {"role": "assistant", "content": "On it."}, "finish_reason": None}]),
        ev([{"index": 0, "delta": {"tool_calls": [frag]}, "finish_reason": None}]),
        ev(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
                    "finish_reason": None,
                }
            ]
        ),
        ev(
            [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '"Rome"}'}}]},
                    "finish_reason": None,
                }
            ]
        ),
        ev([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]),
        ev([], usage={"prompt_tokens": 30, "completion_tokens": 9, "total_tokens": 39}),
        b"data: [DONE]\n\n",
    )
    up = FakeUpstream({("POST", "http://engine-a.test/v1/chat/completions"): [FakeAnswer.json(whole), streamed]})
    # the translated path: a generic OpenAI-compatible engine (vLLM would be asked its own /v1/messages)
    cfg = ONE_BACKEND.replace("embeddings]}", "embeddings, tools]}").replace("engine: vllm", "engine: openai")
    app = create_app(make_config(cfg), upstream=up, probes=False)
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://gateway.test")
    sdk = anthropic.AsyncAnthropic(base_url="http://gateway.test", api_key=TEST_KEY, http_client=http, max_retries=0)
    try:
        msg = await sdk.messages.create(model="public-model", max_tokens=50, messages=USER, tools=[WEATHER])
        async with sdk.messages.stream(model="public-model", max_tokens=50, messages=USER, tools=[WEATHER]) as s:
            final = await s.get_final_message()
    finally:
        await http.aclose()
        await app.gw.aclose()
    for m in (msg, final):
        assert m.stop_reason == "tool_use"
        assert [b.type for b in m.content] == ["text", "tool_use"]
        tool = m.content[1]
        assert isinstance(tool, anthropic.types.ToolUseBlock)
        assert (tool.id, tool.name, tool.input) == ("call_7", "get_weather", {"city": "Rome"})
        assert (m.usage.input_tokens, m.usage.output_tokens) == (30, 9)
    up.assert_all_closed()


# -- (b) the real llama-server ------------------------------------------------------------------------------

LLAMA_CONFIG = """
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: llama, engine: llama-server, url: "{url}", api_key: "{key}", capacity: 1, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments: [{{backend: llama, model: "{model}", format: gguf}}]
"""


@pytest.fixture(scope="module")
def llama_gateway(llama_server: RealEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = LLAMA_CONFIG.format(url=llama_server.url, key=llama_server.api_key, model=llama_server.model)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-anthropic-llama")) as gw:
        yield gw


@pytest.fixture
def llama_client(llama_gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=llama_gateway.url, api_key="unused", max_retries=0, timeout=60)


@pytest.mark.real_engine
def test_llama_server_whole_and_streamed(llama_client: anthropic.Anthropic) -> None:
    msg = llama_client.messages.create(model="tiny", max_tokens=12, system="Be brief.", messages=USER)
    assert msg.model == "tiny" and msg.stop_reason == "max_tokens"
    assert msg.content[0].type == "text" and msg.content[0].text
    assert msg.usage.output_tokens == 12
    with llama_client.messages.stream(model="tiny", max_tokens=20, messages=USER) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) >= 15 and "".join(pieces) == final.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 20


@pytest.mark.real_engine
def test_llama_server_counts_tokens_as_its_generation_does(llama_client: anthropic.Anthropic) -> None:
    messages = [{"role": "user", "content": "Count the tokens of this short prompt, please."}]
    raw = llama_client.messages.with_raw_response.count_tokens(model="tiny", system="Be brief.", messages=messages)
    assert raw.headers["x-gateway-token-count"] == "engine"
    counted = raw.parse().input_tokens
    msg = llama_client.messages.create(model="tiny", max_tokens=1, system="Be brief.", messages=messages)
    # the engine's own prompt count, whatever part of it came from its prompt cache
    assert counted == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)


@pytest.mark.real_engine
def test_a_client_that_leaves_mid_stream_frees_the_engine(
    llama_gateway: GatewayProcess, llama_server: RealEngine
) -> None:
    before = _predicted(llama_server)
    body = {"model": "tiny", "max_tokens": 3500, "stream": True, "messages": USER}
    with httpx.Client(timeout=30) as c, c.stream("POST", llama_gateway.url + "/v1/messages", json=body) as r:
        assert r.status_code == 200
        deltas = 0
        for line in r.iter_lines():
            deltas += line == "event: content_block_delta"
            if deltas >= 5:
                break
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        slots = httpx.get(llama_server.url + "/slots", headers=llama_server.headers, timeout=5).json()
        if not any(s["is_processing"] for s in slots):
            break
        time.sleep(0.05)
    else:
        pytest.fail("llama-server still generating 3 s after the client left a /v1/messages stream")
    generated = _predicted(llama_server) - before
    assert generated < 3500 / 2, f"the engine generated {generated} tokens: the upstream was not closed"


def _predicted(engine: RealEngine) -> float:
    text = httpx.get(engine.url + "/metrics", headers=engine.headers, timeout=5).text
    for line in text.splitlines():
        if line.startswith("llamacpp:tokens_predicted_total"):
            return float(line.split()[-1])
    raise AssertionError("llamacpp:tokens_predicted_total missing")
