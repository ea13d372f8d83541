"""TabbyAPI emulator against the reference's documented shapes and the TabbyAPI source."""

from __future__ import annotations

import asyncio
import json

import pytest
from emu_helpers import chat, keys, request, running

pytestmark = pytest.mark.asyncio
ENGINE = "tabbyapi"
KEY = {"x-api-key": "tb-key"}


async def test_crlf_framing_json_dumps_spacing_and_done() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(3, True))
        assert got.header("content-type") == "text/event-stream; charset=utf-8"
        assert got.header("x-accel-buffering") == "no" and got.header("cache-control") == "no-cache"
        assert got.body.count(b"\r\n\r\n") == 5 and b"\n\n" not in got.body.replace(b"\r\n\r\n", b"")
        events = got.events(b"\r\n\r\n")
        assert events[0].startswith(b'data: {"id": "chatcmpl-') and b'"object": "chat.completion.chunk"' in events[0]
        first = json.loads(events[0][6:])
        assert (
            keys(first) == ["id", "object", "created", "choices", "model"]
            and "role" not in first["choices"][0]["delta"]
        )
        fin = json.loads(events[3][6:])["choices"][0]
        assert (fin["delta"], fin["finish_reason"], fin["eos_reason"]) == ({}, "length", "max_new_tokens")
        assert events[-1] == b"data: [DONE]"


async def test_ping_comments() -> None:
    async with running(ENGINE, ping_interval_s=0.05, ttft_ms=220) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2, True))
        pings = [e for e in got.events(b"\r\n\r\n") if e.startswith(b": ping - ")]
        assert len(pings) >= 2 and got.events(b"\r\n\r\n")[-1] == b"data: [DONE]"


async def test_usage_chunk_carries_finish_and_nonstream_usage_only_on_request() -> None:
    async with running(ENGINE) as emu:
        got = await request(
            emu.url, "POST", "/v1/chat/completions", chat(2, True, stream_options={"include_usage": True})
        )
        data = got.data(b"\r\n\r\n")
        assert data[-2]["choices"] == [{"index": 0, "delta": {}, "finish_reason": "length"}]
        assert keys(data[-2]["usage"]) == [
            "prompt_tokens",
            "prompt_time",
            "prompt_tokens_per_sec",
            "completion_tokens",
            "completion_time",
            "completion_tokens_per_sec",
            "total_tokens",
            "total_time",
        ]
        plain = (await request(emu.url, "POST", "/v1/chat/completions", chat(2))).json()
        assert plain["usage"] is None and plain["id"].startswith("cmpl-")
        assert keys(plain) == ["id", "choices", "created", "model", "object", "usage"]
        assert keys(plain["choices"][0]) == ["index", "finish_reason", "eos_reason", "stop_str", "message", "logprobs"]
        asked = await request(emu.url, "POST", "/v1/chat/completions", chat(2, stream_options={"include_usage": True}))
        assert asked.json()["usage"]["completion_tokens"] == 2


async def test_auth_bodies_and_open_health() -> None:
    async with running(ENGINE, api_key="tb-key", admin_key="tb-admin") as emu:
        got = await request(emu.url, path="/v1/models")
        assert (got.status, got.body) == (401, b'{"detail":"Please provide an API key"}')
        got = await request(emu.url, path="/v1/models", headers={"x-api-key": "nope"})
        assert (got.status, got.body) == (401, b'{"detail":"Invalid API key"}')
        assert (await request(emu.url, path="/v1/models", headers=KEY)).status == 200
        assert (await request(emu.url, path="/v1/models", headers={"Authorization": "Bearer tb-key"})).status == 200
        assert (await request(emu.url, path="/health")).json() == {"status": "healthy", "issues": []}
        perm = await request(emu.url, path="/v1/auth/permission", headers={"x-admin-key": "tb-admin"})
        assert perm.json() == {"permission": "admin"}
        assert (await request(emu.url, path="/v1/auth/permission", headers=KEY)).json() == {"permission": "api"}


async def test_loading_health_stays_200_model_503() -> None:
    async with running(ENGINE, load_delay_s=0.3) as emu:
        assert (await request(emu.url, path="/health")).status == 200
        got = await request(emu.url, path="/v1/model")
        assert (got.status, got.body) == (503, b'{"detail":"No models are currently loaded."}')
        assert (await request(emu.url, "POST", "/v1/chat/completions", chat(2))).status == 503
        await asyncio.sleep(0.35)
        card = (await request(emu.url, path="/v1/model")).json()
        assert card["owned_by"] == "tabbyAPI" and card["parameters"]["max_batch_size"] == emu.config.slots


async def test_validation_is_422_and_model_is_ignored() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", {"model": "x"})
        assert got.status == 422 and got.json()["detail"][0]["loc"] == ["body", "messages"]
        got = await request(emu.url, "POST", "/v1/chat/completions", raw_body=b"{bad")
        assert got.status == 422 and got.json()["detail"][0]["type"] == "json_invalid"
        body = (await request(emu.url, "POST", "/v1/chat/completions", chat(2, model="other-model"))).json()
        assert body["model"] == "tiny"
        assert body["choices"][0]["message"]["content"] == "Hello,"
        mct = (await request(emu.url, "POST", "/v1/chat/completions", chat(None, max_completion_tokens=3))).json()
        assert mct["choices"][0]["message"]["content"] == "Hello, this"  # alias of max_tokens


async def test_mid_stream_error_has_trace_null_and_no_done() -> None:
    async with running(ENGINE, fault="mid_stream_error", fault_after_chunks=1) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(5, True))
        events = got.events(b"\r\n\r\n")
        assert events[-1] == (
            b'data: {"error":{"message":"Chat completion aborted. Please check the server console.","trace":null}}'
        )
        assert b"[DONE]" not in got.body


async def test_completions_stream_uses_model_name_key() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 2, "stream": True})
        first = got.data(b"\r\n\r\n")[0]
        assert (
            keys(first) == ["id", "object", "choices", "created", "model_name"] and first["object"] == "text_completion"
        )


async def test_embeddings_need_an_embedding_model() -> None:
    async with running(ENGINE) as emu:
        got = await request(emu.url, "POST", "/v1/embeddings", {"input": "x"})
        assert (got.status, got.json()) == (503, {"detail": "No embedding models are currently loaded."})
    async with running(ENGINE, embeddings=True) as emu:
        got = await request(emu.url, "POST", "/v1/embeddings", {"input": "x"})
        assert got.status == 200 and len(got.json()["data"][0]["embedding"]) == 64
