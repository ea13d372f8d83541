"""Every fault, on the engines where it behaves differently."""

from __future__ import annotations

import asyncio
import json

import pytest
from emu_helpers import chat, request, running

pytestmark = pytest.mark.asyncio
ENGINES = ("llama-server", "vllm", "sglang", "ollama", "tabbyapi", "lmdeploy")


def tokens_in(data: list[object]) -> int:
    n = 0
    for d in data:
        if isinstance(d, dict) and d.get("choices"):
            c = d["choices"][0]
            if (c.get("delta") or {}).get("content") or c.get("text"):
                n += 1
    return n


async def wait_for(cond: object, timeout: float = 3.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < end, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("engine", ENGINES)
async def test_reset_mid_stream_sends_k_chunks_then_rst(engine: str) -> None:
    async with running(engine, fault="reset_mid_stream", fault_after_chunks=2) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(10, True))
        assert got.status == 200 and got.reset  # RST, not a clean close
        sep = b"\r\n\r\n" if engine == "tabbyapi" else b"\n\n"
        assert tokens_in(got.data(sep)) == 2 and b"[DONE]" not in got.body
        assert emu.stats.faulted == 1 and emu.stats.cancelled == 0


async def test_reset_on_nonstream_sends_nothing() -> None:
    async with running("vllm", fault="reset_mid_stream") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(4))
        assert got.status == 0 and got.reset


async def test_garbage_sse_then_stream_continues() -> None:
    async with running("vllm", fault="garbage_sse", fault_after_chunks=1) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(4, True))
        assert b"data: {not json at all\n\n" in got.body and got.body.endswith(b"data: [DONE]\n\n")
        bad = [d for d in got.data() if isinstance(d, str) and d != "[DONE]"]
        assert bad and tokens_in(got.data()) == 4
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(4))
        assert got.status == 200  # fault applies to every request while fault_count is None
        with pytest.raises(ValueError):
            json.loads(got.body)


async def test_truncated_sse_ends_mid_event() -> None:
    async with running("llama-server", fault="truncated_sse", fault_after_chunks=2) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(8, True))
        last = got.events()[-1]
        assert last.startswith(b'data: {"choices"') and not last.endswith(b"}")
        with pytest.raises(ValueError):
            json.loads(last[6:])


async def test_huge_chunk_is_one_valid_event() -> None:
    async with running("vllm", fault="huge_chunk", huge_chunk_bytes=3 * 1024 * 1024, fault_after_chunks=1) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(3, True))
        sizes = [len(e) for e in got.events()]
        assert max(sizes) > 3 * 1024 * 1024 and got.body.endswith(b"data: [DONE]\n\n")
        big = max(got.data()[:-1], key=lambda d: len(json.dumps(d)))
        assert len(big["choices"][0]["delta"]["content"]) == 3 * 1024 * 1024


async def test_stall_stream_holds_and_client_leaving_counts_cancelled() -> None:
    async with running("sglang", fault="stall_stream", fault_after_chunks=1) as emu:
        with pytest.raises(asyncio.TimeoutError):
            await request(emu.url, "POST", "/v1/chat/completions", chat(5, True), timeout=0.3)
        await wait_for(lambda: emu.stats.cancelled == 1)
        assert emu.stats.active == 0 and emu.stats.connections_open == 0


async def test_stall_body_sends_half_a_body() -> None:
    async with running("vllm", fault="stall_body") as emu:
        reader, writer = await asyncio.open_connection(emu.host, emu.port)
        body = json.dumps(chat(4)).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        data = b""
        with pytest.raises(asyncio.TimeoutError):
            while True:
                data += await asyncio.wait_for(reader.read(65536), 0.3)
        head, partial = data.split(b"\r\n\r\n", 1)
        length = int(head.split(b"content-length: ")[1].split(b"\r\n")[0])
        assert 0 < len(partial) < length
        writer.close()


async def test_html_200_and_no_answer() -> None:
    async with running("ollama", fault="html_200", fault_count=1) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        assert got.status == 200 and got.header("Content-Type") == "text/html" and b"<html>" in got.body
        assert emu.config.fault is None  # fault_count used up
        assert (await request(emu.url, "POST", "/v1/chat/completions", chat(2))).json()["object"] == "chat.completion"
    async with running("lmdeploy", fault="no_answer") as emu:
        with pytest.raises(asyncio.TimeoutError):
            await request(emu.url, "POST", "/v1/chat/completions", chat(2), timeout=0.3)
        await wait_for(lambda: emu.stats.cancelled == 1)


@pytest.mark.parametrize(
    ("engine", "code", "expect"),
    [
        ("llama-server", 503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}),
        (
            "vllm",
            500,
            {
                "error": {
                    "message": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            },
        ),
        ("vllm", 401, {"error": "Unauthorized"}),
        (
            "sglang",
            503,
            {"object": "error", "message": "The request queue is full.", "type": "503", "param": None, "code": 503},
        ),
        ("ollama", 503, {"error": "server busy, please try again.  maximum pending requests exceeded"}),
        ("tabbyapi", 503, {"detail": "No models are currently loaded."}),
        (
            "lmdeploy",
            429,
            {
                "message": "The request is invalid.",
                "type": "invalid_request_error",
                "code": 429,
                "param": None,
                "object": "error",
            },
        ),
    ],
)
async def test_error_status_uses_engine_envelope(engine: str, code: int, expect: object) -> None:
    async with running(engine, fault=f"error_status:{code}") as emu:
        path = "/api/chat" if engine == "ollama" else "/v1/chat/completions"
        got = await request(emu.url, "POST", path, chat(2))
        assert got.status == code and got.json() == expect


async def test_tabby_error_status_422_is_validation_shape() -> None:
    async with running("tabbyapi", fault="error_status:422") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        assert got.status == 422 and got.json()["detail"][0]["msg"] == "Field required"


@pytest.mark.parametrize(
    ("engine", "done", "sep"),
    [
        ("llama-server", False, b"\n\n"),
        ("vllm", True, b"\n\n"),
        ("sglang", True, b"\n\n"),
        ("tabbyapi", False, b"\r\n\r\n"),
        ("lmdeploy", True, b"\n\n"),
    ],
)
async def test_mid_stream_error_terminators(engine: str, done: bool, sep: bytes) -> None:
    async with running(engine, fault="mid_stream_error", fault_after_chunks=2) as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(8, True))
        data = got.data(sep)
        errors = [d for d in data if isinstance(d, dict) and "error" in d]
        assert len(errors) == 1 and tokens_in(data) == 2
        assert (data[-1] == "[DONE]") is done


async def test_mid_stream_error_on_nonstream_is_engine_500() -> None:
    async with running("tabbyapi", fault="mid_stream_error") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        assert got.status == 503 and "aborted. Maybe the model was unloaded?" in got.json()["detail"]
    async with running("lmdeploy", fault="mid_stream_error") as emu:
        got = await request(emu.url, "POST", "/v1/chat/completions", chat(2))
        assert got.status == 500 and got.json()["type"] == "server_error"


async def test_slow_first_byte_delays_status_line_of_stream() -> None:
    async with running("vllm", fault="slow_first_byte", ttft_ms=600) as emu:
        reader, writer = await asyncio.open_connection(emu.host, emu.port)
        body = json.dumps(chat(2, True)).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = await reader.read(1)
        assert first == b"H" and loop.time() - t0 >= 0.59
        writer.close()
    async with running("vllm", ttft_ms=600) as emu:  # without the fault, vLLM sends headers at once
        reader, writer = await asyncio.open_connection(emu.host, emu.port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        t0 = loop.time()
        await reader.read(1)
        assert loop.time() - t0 < 0.4
        writer.close()


async def test_fault_count_and_runtime_config_change() -> None:
    async with running("vllm") as emu:
        emu.config.fault, emu.config.fault_count = "error_status:500", 2
        codes = [(await request(emu.url, "POST", "/v1/chat/completions", chat(1))).status for _ in range(3)]
        assert codes == [500, 500, 200] and emu.config.fault is None and emu.stats.faulted == 2
        r = await request(emu.url, "POST", "/_emulator/config", {"fault": "error_status:429", "fault_count": 1})
        assert r.json()["fault"] == "error_status:429"
        assert (await request(emu.url, "POST", "/v1/chat/completions", chat(1))).status == 429
        bad = await request(emu.url, "POST", "/_emulator/config", {"fault": "explode"})
        assert bad.status == 400 and "unknown fault" in bad.json()["error"]
