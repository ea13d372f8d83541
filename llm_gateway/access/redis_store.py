"""The shared limits store: the same sliding-window semantics as `MemoryStore`, in Redis.

Each reservation and each settlement is one Lua script, so every replica's check-and-take is atomic
and N replicas together admit exactly the limit. Time comes from Redis (`TIME`), so replicas with
skewed clocks agree. All keys share one hash tag, so the scripts also work on Redis Cluster.

Redis trouble never hangs a request: every call has a hard timeout (`store_timeout_ms`), redis-py's
own retries are off, and after a failure the store is skipped for a second. While Redis is
unreachable the configured policy decides: fail-open admits (counted in a metric, logged once per
outage), fail-closed refuses with 503.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Literal

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from llm_gateway.access.redis_scripts import FINISH, RESERVE
from llm_gateway.access.store import (
    WINDOW_S,
    Decision,
    Quota,
    Reservation,
    ScopeLimits,
    Shrink,
    StoreUnavailable,
    budget_message,
)

log = logging.getLogger("gateway.limits")

_KINDS = {1: "requests", 2: "tokens", 3: "concurrency", 4: "budget", 5: "budget"}


def fail_fast_client(url: str, timeout_ms: int, pool_size: int) -> aioredis.Redis:
    """A Redis client for a shared store on the request path: every call bounded by `timeout_ms` (connect
    included), no retries and no health-check round trips, at most `pool_size` connections. Its callers fall back
    (fail open or closed, as each decides) when it raises, so a slow Redis never stalls a request."""
    t = timeout_ms / 1000
    return aioredis.Redis.from_url(
        url,
        socket_timeout=t,
        socket_connect_timeout=t,
        retry=Retry(NoBackoff(), 0),
        max_connections=pool_size,
        health_check_interval=0,
    )


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        prefix: str = "llmgw",
        timeout_ms: int = 100,
        on_state: Callable[[bool], None] | None = None,
        pool_size: int = 64,
    ) -> None:
        self._timeout = timeout_ms / 1000
        self._redis = fail_fast_client(url, timeout_ms, pool_size)
        self._reserve = self._redis.register_script(RESERVE)
        self._finish = self._redis.register_script(FINISH)
        self._tag = "{" + prefix + "}"
        self._down_until = 0.0
        self._timeouts_in_a_row = 0
        self._on_state = on_state
        self._up = True
        self._warm = False

    def _keys(self, scope: str, *suffixes: str) -> list[str]:
        return [f"{self._tag}:{scope}:{s}" for s in suffixes]

    def _mark(self, up: bool) -> None:
        if up != self._up:
            self._up = up
            if up:
                log.warning("rate-limit store reachable again")
            if self._on_state:
                self._on_state(up)

    async def warm_up(self) -> None:
        """Load the scripts (so the first requests need no NOSCRIPT round trip) and open a connection."""
        try:
            async with asyncio.timeout(self._timeout * 10):
                await self._redis.script_load(RESERVE)
                await self._redis.script_load(FINISH)
            self._warm = True
        except (RedisError, OSError, TimeoutError) as e:
            log.warning("rate-limit store not reachable at startup (%s); will retry per request", type(e).__name__)

    async def _call(self, script: object, keys: list[str], args: list[object]) -> list[int]:
        if time.monotonic() < self._down_until:
            raise StoreUnavailable("store marked down")
        try:
            async with asyncio.timeout(self._timeout * 2):
                out = await script(keys=keys, args=args)  # type: ignore[operator]
        except TimeoutError:
            # slow, not necessarily down: this request gets the policy; three in a row mark it down
            self._timeouts_in_a_row += 1
            if self._timeouts_in_a_row >= 3:
                self._down(f"{self._timeouts_in_a_row} calls in a row timed out")
            raise StoreUnavailable("timeout") from None
        except (RedisError, OSError) as e:
            self._down(type(e).__name__)
            raise StoreUnavailable(type(e).__name__) from None
        self._timeouts_in_a_row = 0
        self._mark(True)
        return [int(x) for x in out] if isinstance(out, list) else [int(out)]

    def _down(self, why: str) -> None:
        self._down_until = time.monotonic() + 1.0
        if self._up:
            log.error("rate-limit store unreachable (%s); applying the on_store_error policy", why)
        self._mark(False)

    async def reserve(
        self, rid: str, scopes: Sequence[ScopeLimits], tokens: int, cost: int = 0, shrink: Shrink | None = None
    ) -> tuple[Decision, Reservation]:
        member = uuid.uuid4().hex  # unique even when a client reuses its x-request-id
        keys: list[str] = []
        args: list[object] = [member, tokens, int(WINDOW_S * 1000), len(scopes), cost]
        for s in scopes:
            keys += self._keys(s.scope, "req", "tok", "tokw", "toksum", "conc", "budget")
            args += [_n(s.rpm), _n(s.tpm), _n(s.concurrency), int(s.lease_s * 1000)]
            args += [_n(s.budget_tokens), _n(s.budget_cost), 0 if s.period == "day" else 1]
        if shrink is None:
            args += [-1, 1, 0, 0]
        else:
            args += [shrink.prompt, shrink.choices, shrink.prompt_cost, repr(float(shrink.unit_cost))]
        out = await self._call(self._reserve, keys, args)
        allowed, kind, retry_ms = out[0], out[1], out[2]
        tokens, cost = out[19], out[20]  # what the budgets granted (all that was asked, unless it shrank)
        res = Reservation(member, tuple(scopes), tokens, cost=cost)
        rq = Quota(out[3], max(0, out[4] - allowed), (out[5] or 60000) / 1000) if out[3] >= 0 else None
        tq = Quota(out[6], max(0, out[7] - tokens * allowed), (out[8] or 60000) / 1000) if out[6] >= 0 else None
        bt = Quota(out[9], max(0, out[10] - tokens * allowed), out[11] / 1000) if out[9] >= 0 else None
        bc = Quota(out[12], max(0, out[13] - cost * allowed), out[14] / 1000) if out[12] >= 0 else None
        for s in scopes:
            if s.has_budget:
                res.periods[s.scope] = f"d{out[15]}" if s.period == "day" else f"m{out[16]}"
        if allowed:
            return Decision(True, requests=rq, tokens=tq, budget_tokens=bt, budget_cost=bc), res
        res.active = False
        k = _KINDS[kind]
        if kind in (4, 5):
            what: Literal["tokens", "cost"] = "tokens" if kind == 4 else "cost"
            msg = budget_message(what, scopes[out[17]], out[18], out[21] if kind == 4 else out[22])
        else:
            msg = {
                "requests": f"Rate limit reached for requests: {rq.limit if rq else '?'} per minute",
                "tokens": f"Rate limit reached for tokens: {tq.limit if tq else '?'} per minute",
                "concurrency": "Too many concurrent requests for this key",
            }[k]
            if k == "tokens" and tq is not None and tokens > tq.limit:
                msg = f"Request too large: it needs {tokens} tokens, more than the limit of {tq.limit} per minute"
        decision = Decision(False, k, max(retry_ms, 1) / 1000, msg, rq, tq)  # type: ignore[arg-type]
        decision.budget_tokens, decision.budget_cost = bt, bc
        return decision, res

    async def finish(self, res: Reservation, actual_tokens: int | None, actual_cost: int | None = None) -> None:
        if not res.active:
            return
        res.active = False
        keys: list[str] = []
        dt = 0 if actual_tokens is None else actual_tokens - res.tokens
        dc = 0 if actual_cost is None else actual_cost - res.cost
        args: list[object] = [res.request_id, -1 if actual_tokens is None else actual_tokens, len(res.scopes), dt, dc]
        for s in res.scopes:
            keys += self._keys(s.scope, "tokw", "toksum", "conc", "budget")
            args += [int(s.budget_tokens is not None), int(s.budget_cost is not None), res.periods.get(s.scope, "")]
        try:
            await self._call(self._finish, keys, args)
        except StoreUnavailable:
            log.warning("could not settle a reservation with the rate-limit store; its lease expires on its own")

    async def aclose(self) -> None:
        await self._redis.aclose()


def _n(v: int | None) -> int:
    return -1 if v is None else v
