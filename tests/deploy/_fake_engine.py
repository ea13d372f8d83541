"""A minimal vLLM-shaped engine for end-to-end tests across processes: health, models, Prometheus
load metrics, and chat completions that stream one token per chunk with real pauses between them.

Runs aiohttp in a thread of the test process (its own event loop), so blocking test code does not
stall it; stopped by `close()`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Self

import orjson
from aiohttp import web

MODEL = "fake-model"


class FakeVllm:
    def __init__(self, *, tokens: int = 5, first_token_s: float = 0.05, between_s: float = 0.01) -> None:
        self.tokens = tokens
        self.first_token_s = first_token_s
        self.between_s = between_s
        self.streamed_tokens = 0  # completion tokens sent, as the usage chunks report them
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-vllm", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Self:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response()

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def _metrics(self, _: web.Request) -> web.Response:
        body = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.1\n'
        )
        return web.Response(text=body, content_type="text/plain")

    def _chunk(self, delta: dict[str, object], finish: str | None = None) -> bytes:
        obj = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = self.tokens
        usage = {"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}
        if not body.get("stream"):
            self.streamed_tokens += n
            return web.json_response(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": MODEL,
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "t" * n}, "finish_reason": "stop"}
                    ],
                    "usage": usage,
                }
            )
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        # like vLLM and SGLang: the role chunk goes out with the first output, after the prefill
        await asyncio.sleep(self.first_token_s)
        await resp.write(self._chunk({"role": "assistant", "content": ""}))
        for i in range(n):
            if i:
                await asyncio.sleep(self.between_s)
            await resp.write(self._chunk({"content": f"t{i}"}))
        await resp.write(self._chunk({}, "stop"))
        usage_chunk = {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": MODEL,
            "choices": [],
            "usage": usage,
        }
        await resp.write(b"data: " + orjson.dumps(usage_chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        self.streamed_tokens += n
        return resp

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
