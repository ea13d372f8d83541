"""A stream's answer ends at the engine's `[DONE]`, before the engine's body has ended; the rest of that
body (its chunked terminator) is read after, so the engine's connection goes back to the pool and the next
request reuses it (service/stream.py)."""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import orjson
import uvicorn

from llm_gateway.app import create_app
from llm_gateway.http.server import uvicorn_config
from llm_gateway.upstream.h1_client import H1Upstream
from tests.conftest import ONE_BACKEND, TEST_KEY, make_config
from tests.unit.test_aiohttp_upstream import TinyEngine, chunked, head

TERMINATOR_DELAY_S = 1.0  # the engine's chunked terminator comes this long after its [DONE]: far over an answer's time


def event(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return event({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]})


async def slow_terminator(req, reader, writer) -> None:
    writer.write(head(content_type="text/event-stream", transfer_encoding="chunked"))
    for part in (chunk("Hel"), chunk("lo"), chunk(None, "stop"), b"data: [DONE]\n\n"):
        writer.write(chunked(part))
        await writer.drain()
    await asyncio.sleep(TERMINATOR_DELAY_S)
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_answer_ends_at_done_and_the_engines_connection_is_reused() -> None:
    async with TinyEngine(slow_terminator) as eng:
        config = make_config(ONE_BACKEND.replace("http://engine-a.test", eng.url))
        port = free_port()
        server = uvicorn.Server(
            uvicorn_config(create_app(config, upstream=H1Upstream(), probes=False), config.server, "127.0.0.1", port)
        )
        serving = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.01)
            headers = {"authorization": f"Bearer {TEST_KEY}"}
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
                body = {"model": "public-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
                for _ in range(3):
                    t0 = time.perf_counter()
                    async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                        text = (await r.aread()).decode()
                    took = time.perf_counter() - t0
                    assert r.status_code == 200 and text.endswith("data: [DONE]\n\n") and '"Hel"' in text
                    assert took < TERMINATOR_DELAY_S, "the answer waited for the engine's terminator"
                    await asyncio.sleep(TERMINATOR_DELAY_S + 0.2)  # the gateway reads the terminator meanwhile
        finally:
            server.should_exit = True
            await serving
    assert len(eng.requests) == 3
    assert eng.connections == 1  # the terminator was read after the answer: the connection was kept
