"""Rate limits per key (and per key and model): requests/min, tokens/min, concurrent requests.

Semantics, identical in both stores: a *sliding window log* of 60 s. A request is admitted only if,
counting it, no scope exceeds its limit over the last 60 s; so N replicas sharing a store admit
exactly the limit, never N times it. Tokens are reserved up front (prompt estimate + max_tokens or
the configured default) and settled with the real usage when the request ends (a client that
aborts pays for what was generated). Concurrency is a lease per request, released at the end and
expiring on its own if a replica dies. All scopes of a request are checked and taken atomically.

This module holds the vocabulary both stores share (scopes, decisions, reservations, the store
protocol and `StoreUnavailable`); `MemoryStore` (memory.py) is for one process, `RedisStore`
(redis_store.py, imported only when configured) shares state across replicas.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

WINDOW_S = 60.0
LimitKind = Literal["requests", "tokens", "concurrency"]


@dataclass(frozen=True, slots=True)
class ScopeLimits:
    """One scope to check: a key, or a key and model."""

    scope: str
    rpm: int | None
    tpm: int | None
    concurrency: int | None
    lease_s: float = 3600.0


@dataclass(slots=True)
class Quota:
    """What the x-ratelimit-* headers report for one dimension."""

    limit: int
    remaining: int
    reset_s: float


@dataclass(slots=True)
class Decision:
    allowed: bool
    kind: LimitKind | None = None  # what refused it
    retry_after_s: float = 0.0
    message: str = ""
    requests: Quota | None = None
    tokens: Quota | None = None
    store_error: bool = False


@dataclass(slots=True)
class Reservation:
    request_id: str
    scopes: tuple[ScopeLimits, ...]
    tokens: int
    handles: list[object] = field(default_factory=list)  # store-specific
    active: bool = True


class LimitStore(Protocol):
    async def reserve(self, rid: str, scopes: Sequence[ScopeLimits], tokens: int) -> tuple[Decision, Reservation]: ...

    async def finish(self, res: Reservation, actual_tokens: int | None) -> None:
        """Settle the token reservation with the real count (None: keep the estimate) and release
        the concurrency lease."""
        ...

    async def aclose(self) -> None: ...


def format_reset(seconds: float) -> str:
    """OpenAI's reset format: "1s", "6m0s", "1m30.5s", "250ms" (rounded up to a tenth of a second)."""
    if seconds <= 0:
        return "0s"
    if seconds < 1 and math.ceil(seconds * 1000) < 1000:
        return f"{max(1, math.ceil(seconds * 1000))}ms"
    tenths = math.ceil(round(seconds * 10, 6))
    m, t = divmod(tenths, 600)
    text = f"{t / 10:g}s"
    return f"{m}m{text}" if m else text


class StoreUnavailable(Exception):
    """The shared store could not be asked in time; the policy (open/closed) decides."""
