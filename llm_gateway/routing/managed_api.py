"""The HTTP client of API-managed backends: the `LoaderClient` (adapters/model_loaders.py) that
routing/managed_engine.py hands an engine's loader, over the gateway's upstream client, relative to one
backend's URL and with its key."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from llm_gateway.routing.table import Backend
from llm_gateway.upstream.base import UpstreamClient, UpstreamTimeouts

BODY_LIMIT = 4 * 1024 * 1024


class BackendLoaderClient:
    """GETs and JSON POSTs to a backend, each bounded by `timeout_s` (the caller bounds the whole load)."""

    def __init__(self, upstream: Callable[[], UpstreamClient], backend: Backend, timeout_s: float) -> None:
        self._upstream = upstream
        self._backend = backend
        self._timeouts = UpstreamTimeouts(timeout_s, timeout_s, timeout_s, timeout_s)

    def _headers(self, json: bool) -> dict[str, str]:
        h = {"content-type": "application/json"} if json else {}
        key = self._backend.adapter.backend.api_key
        if key:
            h["authorization"] = f"Bearer {key}"
        return h

    async def _send(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        url = self._backend.cfg.url + path
        resp = await self._upstream().send(method, url, self._headers(body is not None), body, self._timeouts)
        try:
            return resp.status, await resp.read(BODY_LIMIT)
        finally:
            resp.close()

    async def get(self, path: str) -> tuple[int, bytes]:
        return await self._send("GET", path, None)

    async def post(self, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]:
        return await self._send("POST", path, orjson.dumps(body) if body is not None else b"")
