"""SGLang emulator against the reference's documented shapes (no real SGLang runs on CPU here)."""

from __future__ import annotations

import asyncio
import json

import pytest
from emu_helpers import chat, keys, request, running

pytestmark = pytest.mark.asyncio
ENGINE = "sglang"
KEY = {"Authorization": "Bearer sk-sg"}
FLAT = ["object", "message", "type", "param", "code"]


async def test_health_503_while_starting_then_200_empty_and_ping() -> None:
    async with running(ENGINE, load_delay_s=0.3) as emu:
        for path in ("/health", "/health_generate"):
            got = await request(emu.url, path=path)
            assert (got.status, got.body) == (503, b"")
        assert (await request(emu.url, path="/ping")).status == 200  # liveness only
        await asyncio.sleep(0.35)
        got = await request(emu.url, path="/health_generate")
        assert (got.status, got.body, got.header("content-length")) == (200, b"", "0")


async def test_auth_exact_bearer_and_exemptions() -> None:
    async with running(ENGINE, api_key="sk-sg") as emu:
        got = await request(emu.url, path="/v1/models")
        assert (got.status, got.body) == (401, b'{"error":"Unauthorized"}')
        for hdr in ({"Authorization": "bearer sk-sg"}, {"Authorization": "Bearer  sk-sg"}, {"X-Api-Key": "sk-sg"}):
            assert (await request(emu.url, path="/v1/models", headers=hdr)).status == 401, hdr
        assert (await request(emu.url, path="/v1/models", headers=KEY)).status == 200
        assert (await request(emu.url, path="/ping")).status == 401  # /ping is not exempt
        for path in ("/health", "/health_generate", "/metrics"):
            assert (await request(emu.url, path=path)).status == 200, path


async def test_flat_errors_and_validation_400() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", raw_body=b'{"model":"tiny","messages":[')
        assert got.status == 400 and keys(got.json()) == FLAT
        assert got.json()["type"] == "Bad Request" and got.json()["object"] == "error"
        got = await request(emu.url, "POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
        assert got.status == 400 and "missing" in got.json()["message"]  # model is required
        got = await request(emu.url, path="/v1/models/other")
        assert got.status == 404 and got.json()["error"]["code"] == "model_not_found"
        assert (await request(emu.url, path="/v1/models/tiny")).json()["owned_by"] == "sglang"


async def test_model_not_checked_in_chat_and_echoed() -> None:
    async with running(ENGINE) as emu:
        got = (await request(emu.url, "POST", "/v1/chat/completions", chat(3, model="anything"))).json()
        assert got["model"] == "anything"
        assert keys(got["choices"][0]) == ["index", "message", "logprobs", "finish_reason", "matched_stop"]
        assert keys(got["usage"]) == ["prompt_tokens", "total_tokens", "completion_tokens", "prompt_tokens_details"]
        stop = (await request(emu.url, "POST", "/v1/chat/completions", chat(9, stop=" test"))).json()
        assert (stop["choices"][0]["finish_reason"], stop["choices"][0]["matched_stop"]) == ("stop", " test")
        eos = (await request(emu.url, "POST", "/v1/chat/completions", chat(None))).json()
        assert eos["choices"][0]["finish_reason"] == "stop" and isinstance(eos["choices"][0]["matched_stop"], int)


async def test_stream_layout_and_usage_default_off() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2, True))
        data = got.data()
        assert got.header("content-type") == "text/event-stream; charset=utf-8"
        assert data[0]["choices"][0]["delta"] == {
            "role": "assistant",
            "content": "",
            "reasoning_content": None,
            "tool_calls": None,
        }
        assert [d["choices"][0]["delta"]["content"] for d in data[1:3]] == ["Hello", ","]
        assert data[3]["choices"][0]["finish_reason"] == "length" and data[3]["choices"][0]["delta"]["content"] is None
        assert data[4] == "[DONE]" and all(d["usage"] is None for d in data[:4])
        got = await request(
            emu.url, "POST", "/v1/chat/completions", chat(2, True, stream_options={"include_usage": True})
        )
        assert got.data()[-2]["choices"] == [] and got.data()[-2]["usage"]["completion_tokens"] == 2


async def test_completions_default_16_tokens() -> None:
    async with running(ENGINE) as emu:
        got = (await request(emu.url, "POST", "/v1/completions", {"model": "tiny", "prompt": "x"})).json()
        assert got["usage"]["completion_tokens"] == 16 and got["choices"][0]["finish_reason"] == "length"


async def test_mid_stream_error_is_flat_and_followed_by_done() -> None:
    async with running(ENGINE, fault="mid_stream_error", fault_after_chunks=1) as emu:
        events = (await request(emu.url, "POST", "/v1/chat/completions", chat(6, True))).events()
        assert events[-1] == b"data: [DONE]"
        err = json.loads(events[-2][6:])["error"]
        assert keys(err) == FLAT and events[-2].startswith(b'data: {"error": {"object": "error", ')


async def test_metrics_only_when_enabled_and_load_endpoints() -> None:
    async with running(ENGINE, metrics=False) as emu:
        assert (await request(emu.url, path="/metrics")).status == 404
    async with running(ENGINE, slots=1, tpot_ms=20) as emu:
        tasks = [
            asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(20, True))) for _ in range(3)
        ]
        while emu.stats.active < 1 or emu.stats.waiting < 2:
            await asyncio.sleep(0.01)
        text = (await request(emu.url, path="/metrics")).body.decode()
        assert 'sglang:num_running_reqs{model_name="tiny"} 1.0' in text
        assert 'sglang:num_queue_reqs{model_name="tiny"} 2.0' in text
        assert "# TYPE sglang:token_usage gauge" in text
        load = (await request(emu.url, path="/get_load")).json()
        assert load == [{"dp_rank": 0, "num_reqs": 3, "num_waiting_reqs": 2, "num_tokens": load[0]["num_tokens"]}]
        info = (await request(emu.url, path="/get_model_info")).json()
        assert keys(info) == [
            "model_path",
            "tokenizer_path",
            "is_generation",
            "preferred_sampling_params",
            "weight_version",
        ]
        assert "version" in (await request(emu.url, path="/get_server_info")).json()
        await asyncio.gather(*tasks)


async def test_max_queued_requests_rejects_503_or_in_band() -> None:
    async with running(ENGINE, slots=1, max_queue=0, tpot_ms=20) as emu:
        task = asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(20, True)))
        while emu.stats.active < 1:
            await asyncio.sleep(0.01)
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        assert got.status == 503 and got.json()["message"] == "The request queue is full."
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2, True))
        assert got.status == 200 and got.data()[0]["error"]["code"] == 503 and got.data()[-1] == "[DONE]"
        await task
