"""Slots, queue, disconnects, dead/restarted engines, many concurrent streams, control API."""

from __future__ import annotations

import asyncio
import json

import pytest
from emu_helpers import chat, request, running

from llm_gateway_emulators import Emulator, EmulatorConfig, expected_text

pytestmark = pytest.mark.asyncio


async def wait_for(cond: object, timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.005)


async def test_slots_bound_concurrency_and_queue_drains_fifo() -> None:
    async with running("vllm", slots=2, tpot_ms=10) as emu:
        tasks = [
            asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(15, True))) for _ in range(5)
        ]
        await wait_for(lambda: emu.stats.active == 2 and emu.stats.waiting == 3)
        emu.config.slots = 3
        await request(emu.url, "POST", "/_emulator/config", {"slots": 3})  # rebalance now
        await wait_for(lambda: emu.stats.active == 3 and emu.stats.waiting == 2)
        results = await asyncio.gather(*tasks)
        assert all(r.status == 200 and r.data()[-1] == "[DONE]" for r in results)
        assert (emu.stats.active, emu.stats.waiting, emu.stats.completed) == (0, 0, 5)


async def test_client_disconnect_cancels_and_frees_the_slot() -> None:
    async with running("llama-server", slots=1, tpot_ms=20) as emu:
        with pytest.raises(asyncio.TimeoutError):
            await request(emu.url, "POST", "/v1/chat/completions", chat(200, True), timeout=0.2)
        await wait_for(lambda: emu.stats.cancelled == 1 and emu.stats.active == 0)
        slots = (await request(emu.url, path="/slots")).json()
        assert [s["is_processing"] for s in slots] == [False]
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(3))
        assert got.json()["choices"][0]["message"]["content"] == expected_text(3)


async def test_queued_request_whose_client_leaves_is_cancelled() -> None:
    async with running("sglang", slots=1, tpot_ms=20) as emu:
        first = asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(20, True)))
        await wait_for(lambda: emu.stats.active == 1)
        with pytest.raises(asyncio.TimeoutError):
            await request(emu.url, "POST", "/v1/chat/completions", chat(5, True), timeout=0.1)
        await wait_for(lambda: emu.stats.cancelled == 1 and emu.stats.waiting == 0)
        assert (await first).status == 200


async def test_stop_and_start_listening_refuses_in_between() -> None:
    async with running("lmdeploy", tpot_ms=50) as emu:
        port = emu.port
        streaming = asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(50, True)))
        await wait_for(lambda: emu.stats.active == 1)
        await emu.stop_listening()
        got = await streaming
        assert got.reset or got.eof  # open connections die with the engine
        with pytest.raises(OSError):
            await asyncio.open_connection(emu.host, port)
        emu.config.load_delay_s = 0.2
        await emu.start_listening()
        assert emu.port == port
        assert (await request(emu.url, path="/health")).json()["status"] == "initializing"
        await asyncio.sleep(0.25)
        assert (await request(emu.url, path="/health")).status == 200


async def test_many_concurrent_streams_one_process() -> None:
    n = 1500
    async with running("vllm", slots=n, ttft_ms=50, tpot_ms=50) as emu:
        tasks = [
            asyncio.ensure_future(request(emu.url, "POST", "/v1/chat/completions", chat(10, True), timeout=60))
            for _ in range(n)
        ]
        await wait_for(lambda: emu.stats.active == n, timeout=30)
        results = await asyncio.gather(*tasks)
        assert all(r.data()[-1] == "[DONE]" for r in results) and emu.stats.completed == n


async def test_ttft_and_tpot_pacing() -> None:
    async with running("vllm", ttft_ms=100, tpot_ms=40) as emu:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(6, True))
        elapsed = loop.time() - t0
        assert 0.1 + 5 * 0.04 - 0.02 <= elapsed < 0.1 + 5 * 0.04 + 1.0 and got.data()[-1] == "[DONE]"
        t0 = loop.time()
        await request(emu.url, "POST", "/v1/chat/completions", chat(6))
        assert loop.time() - t0 >= 0.28  # non-stream holds the slot for the whole generation


async def test_kv_usage_and_report_knobs() -> None:
    async with running("vllm", report_kv_usage=0.42, report_waiting=5) as emu:
        text = (await request(emu.url, path="/metrics")).body.decode()
        assert 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.42' in text
        assert 'vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0' in text


async def test_control_endpoints_and_last_request() -> None:
    async with running("ollama", api_key=None) as emu:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": False}
        await request(emu.url, "POST", "/api/chat", body, headers={"X-Trace": "abc"})
        stats = (await request(emu.url, path="/_emulator/stats")).json()
        assert stats["last_request"]["path"] == "/api/chat" and stats["last_request"]["json"] == body
        assert stats["last_request"]["headers"]["x-trace"] == "abc"
        assert emu.stats.last_request == stats["last_request"] and stats["requests_total"] == 1
        cfg = (await request(emu.url, "POST", "/_emulator/config", {"tpot_ms": 5, "model": "tiny"})).json()
        assert cfg["tpot_ms"] == 5 and emu.config.tpot_ms == 5
        bad = await request(emu.url, "POST", "/_emulator/config", {"nope": 1})
        assert bad.status == 400
        assert (await request(emu.url, "POST", "/_emulator/reset")).json()["requests_total"] == 0


async def test_config_validation() -> None:
    with pytest.raises(ValueError):
        EmulatorConfig(engine="nope")
    with pytest.raises(ValueError):
        EmulatorConfig(fault="error_status:abc")
    cfg = EmulatorConfig(engine="vllm")
    with pytest.raises(ValueError):
        cfg.merge({"engine": "sglang"})
    emu = Emulator(cfg)
    assert emu.config is cfg and json.dumps(cfg.to_dict())


async def test_idle_keep_alive_timeout_closes_connection_and_head_has_no_body() -> None:
    async with running("llama-server", keepalive_timeout_s=0.15) as emu:
        reader, writer = await asyncio.open_connection(emu.host, emu.port)
        writer.write(f"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1:{emu.port}\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
        assert b"Content-Length: 15" in head and b"Keep-Alive: timeout=0, max=100" in head
        assert await asyncio.wait_for(reader.read(100), 2) == b""  # no body; closed after 0.15 s idle
        writer.close()
