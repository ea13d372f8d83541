"""Applying a key's limits to one request: which scopes, the store-outage policy, the headers.

A key's own limits form one scope; a matching `model_limits` entry adds a second (key and model).
`admit` reserves in the store (or raises `RateLimited` / `ServiceUnavailable`), `finish` settles.
Headers follow OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens}.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from llm_gateway.auth import Principal
from llm_gateway.errors import RateLimited, ServiceUnavailable
from llm_gateway.exchange import Headers
from llm_gateway.limits.store import (
    Decision,
    LimitStore,
    Quota,
    Reservation,
    ScopeLimits,
    StoreUnavailable,
    format_reset,
)


class Limiter:
    def __init__(
        self,
        store: LimitStore,
        *,
        fail_open: bool,
        on_reject: Callable[[str, str], None] | None = None,
        on_store_error: Callable[[], None] | None = None,
        lease_s: float = 3600.0,
    ) -> None:
        self.store = store
        self._fail_open = fail_open
        self._on_reject = on_reject
        self._on_store_error = on_store_error
        self._lease_s = lease_s
        # keyed by the Principal itself (hashed by identity, kept alive by the key), never by id()
        self._scopes: dict[tuple[Principal, str], tuple[ScopeLimits, ...]] = {}

    def scopes(self, who: Principal, model: str) -> tuple[ScopeLimits, ...]:
        key = (who, model)
        found = self._scopes.get(key)
        if found is None:
            out = []
            lim = who.limits
            if lim.rpm is not None or lim.tpm is not None or lim.concurrency is not None:
                out.append(ScopeLimits(f"k:{who.name}", lim.rpm, lim.tpm, lim.concurrency, self._lease_s))
            ml = who.limits_for(model)
            if ml is not None and (ml.rpm is not None or ml.tpm is not None or ml.concurrency is not None):
                out.append(ScopeLimits(f"k:{who.name}:m:{model}", ml.rpm, ml.tpm, ml.concurrency, self._lease_s))
            found = tuple(out)
            if len(self._scopes) < 100_000:
                self._scopes[key] = found
        return found

    async def admit(
        self, who: Principal, model: str, tokens: int, rid: str
    ) -> tuple[Decision | None, Reservation | None]:
        scopes = self.scopes(who, model)
        if not scopes:
            return None, None
        try:
            decision, res = await self.store.reserve(rid, scopes, tokens)
        except StoreUnavailable:
            if self._on_store_error:
                self._on_store_error()
            if self._fail_open:
                return None, None
            raise ServiceUnavailable(
                "The rate-limit store is unavailable and this gateway is configured to refuse requests "
                "until it is back.",
                code="limits_unavailable",
                headers={"retry-after": "1"},
            ) from None
        if not decision.allowed:
            kind = decision.kind or "requests"
            if self._on_reject:
                self._on_reject(who.name, kind)
            headers = {"retry-after": str(max(1, math.ceil(decision.retry_after_s)))}
            for name, value in quota_headers(decision):
                headers[name.decode()] = value.decode()
            raise RateLimited(
                f"{decision.message} (key '{who.name}'). Retry after {headers['retry-after']}s.",
                type_="tokens" if kind == "tokens" else "requests",
                headers=headers,
            )
        return decision, res

    async def finish(self, res: Reservation | None, actual_tokens: int | None) -> None:
        if res is not None and res.active:
            await self.store.finish(res, actual_tokens)


def quota_headers(d: Decision | None) -> Headers:
    if d is None:
        return []
    out: Headers = []
    _add(out, b"requests", d.requests)
    _add(out, b"tokens", d.tokens)
    return out


def _add(out: Headers, what: bytes, q: Quota | None) -> None:
    if q is None:
        return
    out.append((b"x-ratelimit-limit-" + what, str(q.limit).encode()))
    out.append((b"x-ratelimit-remaining-" + what, str(max(0, q.remaining)).encode()))
    out.append((b"x-ratelimit-reset-" + what, format_reset(q.reset_s).encode()))
