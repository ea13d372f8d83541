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

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from llm_gateway.limits.store import WINDOW_S, Decision, Quota, Reservation, ScopeLimits, StoreUnavailable

log = logging.getLogger("gateway.limits")

_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rid, tokens, window, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local horizon = now - window
local kind, retry = 0, 0
local rq, tq = {-1, -1, -1}, {-1, -1, -1}
local function oldest_reset(k)
  local o = redis.call('ZRANGE', k, 0, 0, 'WITHSCORES')
  if #o > 0 then return tonumber(o[2]) + window - now end
  return 0
end
for i = 0, n - 1 do
  local a = 5 + i * 4
  local rpm, tpm, conc, lease = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local rk, tk, tw, ts, ck = KEYS[i * 5 + 1], KEYS[i * 5 + 2], KEYS[i * 5 + 3], KEYS[i * 5 + 4], KEYS[i * 5 + 5]
  if rpm >= 0 then
    redis.call('ZREMRANGEBYSCORE', rk, '-inf', horizon)
    local count = redis.call('ZCARD', rk)
    local reset = oldest_reset(rk)
    if kind == 0 and count + 1 > rpm then kind = 1; retry = reset end
    if rq[1] < 0 then rq = {rpm, rpm - count, reset} end
  end
  if tpm >= 0 then
    local old = redis.call('ZRANGEBYSCORE', tk, '-inf', horizon)
    if #old > 0 then
      local ws = redis.call('HMGET', tw, unpack(old))
      local sum = 0
      for j = 1, #ws do sum = sum + (tonumber(ws[j]) or 0) end
      redis.call('HDEL', tw, unpack(old))
      redis.call('ZREMRANGEBYSCORE', tk, '-inf', horizon)
      redis.call('DECRBY', ts, sum)
    end
    local total = tonumber(redis.call('GET', ts) or '0')
    local reset = oldest_reset(tk)
    if kind == 0 and total + tokens > tpm then
      kind = 2
      if tokens > tpm then
        retry = window
      else
        retry = reset
        local free = tpm - total
        local es = redis.call('ZRANGE', tk, 0, -1, 'WITHSCORES')
        for j = 1, #es, 2 do
          free = free + (tonumber(redis.call('HGET', tw, es[j])) or 0)
          if free >= tokens then retry = tonumber(es[j + 1]) + window - now; break end
        end
      end
    end
    if tq[1] < 0 then tq = {tpm, tpm - total, reset} end
  end
  if conc >= 0 then
    redis.call('ZREMRANGEBYSCORE', ck, '-inf', now)
    if kind == 0 and redis.call('ZCARD', ck) + 1 > conc then kind = 3; retry = 1000 end
  end
end
if kind ~= 0 then return {0, kind, retry, rq[1], rq[2], rq[3], tq[1], tq[2], tq[3]} end
for i = 0, n - 1 do
  local a = 5 + i * 4
  local rpm, tpm, conc, lease = tonumber(ARGV[a]), tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  local rk, tk, tw, ts, ck = KEYS[i * 5 + 1], KEYS[i * 5 + 2], KEYS[i * 5 + 3], KEYS[i * 5 + 4], KEYS[i * 5 + 5]
  if rpm >= 0 then
    redis.call('ZADD', rk, now, rid)
    redis.call('PEXPIRE', rk, window * 2)
  end
  if tpm >= 0 then
    redis.call('ZADD', tk, now, rid)
    redis.call('HSET', tw, rid, tokens)
    redis.call('INCRBY', ts, tokens)
    redis.call('PEXPIRE', tk, window * 2)
    redis.call('PEXPIRE', tw, window * 2)
    redis.call('PEXPIRE', ts, window * 2)
  end
  if conc >= 0 then
    redis.call('ZADD', ck, now + lease, rid)
    redis.call('PEXPIRE', ck, lease + window)
  end
end
return {1, 0, 0, rq[1], rq[2], rq[3], tq[1], tq[2], tq[3]}
"""

_FINISH = """
local rid, actual, n = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 0, n - 1 do
  local tw, ts, ck = KEYS[i * 3 + 1], KEYS[i * 3 + 2], KEYS[i * 3 + 3]
  if actual >= 0 then
    local old = redis.call('HGET', tw, rid)
    if old then
      redis.call('HSET', tw, rid, actual)
      redis.call('INCRBY', ts, actual - tonumber(old))
    end
  end
  redis.call('ZREM', ck, rid)
end
return 1
"""

_KINDS = {1: "requests", 2: "tokens", 3: "concurrency"}


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
        t = timeout_ms / 1000
        self._timeout = t
        self._redis = aioredis.Redis.from_url(
            url,
            socket_timeout=t,
            socket_connect_timeout=t,
            retry=Retry(NoBackoff(), 0),
            max_connections=pool_size,
            health_check_interval=0,
        )
        self._reserve = self._redis.register_script(_RESERVE)
        self._finish = self._redis.register_script(_FINISH)
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
                await self._redis.script_load(_RESERVE)
                await self._redis.script_load(_FINISH)
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

    async def reserve(self, rid: str, scopes: Sequence[ScopeLimits], tokens: int) -> tuple[Decision, Reservation]:
        member = uuid.uuid4().hex  # unique even when a client reuses its x-request-id
        res = Reservation(member, tuple(scopes), tokens)
        keys: list[str] = []
        args: list[object] = [member, tokens, int(WINDOW_S * 1000), len(scopes)]
        for s in scopes:
            keys += self._keys(s.scope, "req", "tok", "tokw", "toksum", "conc")
            args += [_n(s.rpm), _n(s.tpm), _n(s.concurrency), int(s.lease_s * 1000)]
        out = await self._call(self._reserve, keys, args)
        allowed, kind, retry_ms = out[0], out[1], out[2]
        rq = Quota(out[3], max(0, out[4] - allowed), (out[5] or 60000) / 1000) if out[3] >= 0 else None
        tq = Quota(out[6], max(0, out[7] - tokens * allowed), (out[8] or 60000) / 1000) if out[6] >= 0 else None
        if allowed:
            return Decision(True, requests=rq, tokens=tq), res
        res.active = False
        k = _KINDS[kind]
        msg = {
            "requests": f"Rate limit reached for requests: {rq.limit if rq else '?'} per minute",
            "tokens": f"Rate limit reached for tokens: {tq.limit if tq else '?'} per minute",
            "concurrency": "Too many concurrent requests for this key",
        }[k]
        if k == "tokens" and tq is not None and tokens > tq.limit:
            msg = f"Request too large: it needs {tokens} tokens, more than the limit of {tq.limit} per minute"
        return Decision(False, k, max(retry_ms, 1) / 1000, msg, rq, tq), res  # type: ignore[arg-type]

    async def finish(self, res: Reservation, actual_tokens: int | None) -> None:
        if not res.active:
            return
        res.active = False
        keys: list[str] = []
        for s in res.scopes:
            keys += self._keys(s.scope, "tokw", "toksum", "conc")
        args: list[object] = [res.request_id, -1 if actual_tokens is None else actual_tokens, len(res.scopes)]
        try:
            await self._call(self._finish, keys, args)
        except StoreUnavailable:
            log.warning("could not settle a reservation with the rate-limit store; its lease expires on its own")

    async def aclose(self) -> None:
        await self._redis.aclose()


def _n(v: int | None) -> int:
    return -1 if v is None else v
