"""Where each conversation was placed, shared by the gateway replicas through the Redis they already use.

`cache_aware` (selection.py) keeps a conversation on the deployment that served it last. One replica's record
(prefix_cache.py) sees only its own traffic: behind a Service that spreads requests over several replicas, turn 5
may reach a replica that never saw turns 1-4. Two things keep the turns together:

- a conversation nobody has placed goes where the rendezvous hash of its placement key says (selection.py, rule 3),
  which every replica derives alike;
- where the limits store is Redis (`limits.store: redis`), the placement itself is shared: one key per model and
  conversation, `{prefix}:place:<blake2b(model, placement key)>` -> the deployment's key, with the cache's
  `ttl_s`. A replica reads it before ordering (`assigned`) and writes it when it placed the conversation
  elsewhere (a hot replica yielded, a deployment went away) or found none: the others follow the move instead
  of sending the next turn back to an engine that no longer holds the conversation's newest turns.

The placement key is hashed before it is stored, so no session id reaches Redis. Redis trouble never delays a
request for long: each call has the store's timeout, and after a failure the store is skipped for a second; the
order then falls back to this replica's record and the rendezvous hash (the same everywhere).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Protocol

log = logging.getLogger("gateway.routing")

DOWN_S = 1.0  # after a failed call, the store is skipped this long


class SessionPlacements(Protocol):
    async def get(self, model: str, key: str) -> str | None: ...

    async def put(self, model: str, key: str, deployment: str, ttl_s: float) -> None: ...

    async def aclose(self) -> None: ...


class RedisPlacements:
    """The shared placements in Redis (one GET per cache_aware request, one SET when the placement changed)."""

    def __init__(self, url: str, *, prefix: str = "llmgw", timeout_ms: int = 100) -> None:
        from redis.exceptions import RedisError  # imported only when the limits store is Redis

        from llm_gateway.access.redis_store import fail_fast_client

        self._timeout = timeout_ms / 1000
        self._redis = fail_fast_client(url, timeout_ms, 32)
        self._tag = "{" + prefix + "}:place:"
        self._down_until = 0.0
        self._errors: tuple[type[BaseException], ...] = (RedisError, OSError, TimeoutError)

    def _key(self, model: str, key: str) -> str:
        return self._tag + hashlib.blake2b(f"{model}\0{key}".encode(), digest_size=16).hexdigest()

    def _failed(self, e: BaseException) -> None:
        if time.monotonic() >= self._down_until:
            log.warning("shared session placements unreachable (%s); placing by hash for %gs", type(e).__name__, DOWN_S)
        self._down_until = time.monotonic() + DOWN_S

    async def get(self, model: str, key: str) -> str | None:
        if time.monotonic() < self._down_until:
            return None
        try:
            async with asyncio.timeout(self._timeout * 2):
                value = await self._redis.get(self._key(model, key))
        except self._errors as e:  # any trouble: place without the shared record
            self._failed(e)
            return None
        return value.decode() if isinstance(value, bytes) else None

    async def put(self, model: str, key: str, deployment: str, ttl_s: float) -> None:
        if time.monotonic() < self._down_until:
            return
        try:
            async with asyncio.timeout(self._timeout * 2):
                await self._redis.set(self._key(model, key), deployment, px=max(1, int(ttl_s * 1000)))
        except self._errors as e:
            self._failed(e)

    async def aclose(self) -> None:
        await self._redis.aclose()
