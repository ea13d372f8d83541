"""Short calls to one backend outside a generation: the POSTs an adapter counts prompt tokens through.

`BackendPoster` is the `TokenizeClient` of adapters/base.py for one backend: its own URL and short
timeouts (never longer than the backend's), the body read up to `ERROR_BODY_LIMIT`, the response
always closed. Counting is a courtesy: at most `COUNT_ATTEMPTS` engines are asked before the
gateway's estimate is answered.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import astuple

from llm_gateway.routing.table import Backend
from llm_gateway.upstream.base import UpstreamClient, UpstreamTimeouts

ERROR_BODY_LIMIT = 256 * 1024
COUNT_TIMEOUTS = UpstreamTimeouts(connect_s=2.0, first_byte_s=5.0, idle_s=5.0, total_s=10.0)
COUNT_ATTEMPTS = 2  # engines that failed to count before the estimate is answered


class BackendPoster:
    """POSTs to one backend, with short timeouts."""

    __slots__ = ("_backend", "_limit", "_timeouts", "_upstream", "statuses")

    def __init__(
        self,
        upstream: UpstreamClient,
        backend: Backend,
        timeouts: UpstreamTimeouts | None = None,
        answer_limit: int | None = None,
    ) -> None:
        """`timeouts` (default: counting's short ones) and `answer_limit` (default `ERROR_BODY_LIMIT`): a longer
        call's (rerank, audio: service/engine_call.py); the backend's own timeouts cap them either way."""
        self._upstream = upstream
        self._backend = backend
        self._timeouts = timeouts or COUNT_TIMEOUTS
        self._limit = answer_limit or ERROR_BODY_LIMIT
        self.statuses: list[int] = []  # of each answer, in order: what the caller may learn of the engine

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]:
        b = self._backend
        timeouts = UpstreamTimeouts(*map(min, astuple(b.timeouts), astuple(self._timeouts)))
        resp = await self._upstream.send("POST", b.cfg.url + path, headers, body, timeouts)
        self.statuses.append(resp.status)
        try:
            return resp.status, await resp.read(self._limit)
        finally:
            resp.close()
