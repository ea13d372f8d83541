"""Who may call and how much: client keys with their limits, budgets and priority, the prices cost
budgets are counted in, admin keys, and where the limiter keeps its counts (memory or Redis).

Every number here is bounded and finite (`allow_inf_nan=False`): the same models check the config file
and the admin API's bodies, and both limit stores must count each value exactly. Redis runs its scripts
in Lua, whose numbers are doubles: exact up to 2**53, so counts stay below 10**15 and a cost budget,
counted in 1e-9 units of the currency (`limits.store.COST_UNITS`), below `MAX_COST`.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from llm_gateway.settings.vocabulary import Name, PriorityClass, Strict, dupes


def _sha256_hex(v: str, of: str) -> str:
    """A key's configured digest, lower-cased; 64 hex characters or an error naming what it digests."""
    if not re.fullmatch(r"[0-9a-fA-F]{64}", v):
        raise ValueError(f"must be 64 hex characters (sha256 of {of}; see `llm-gateway keys new`)")
    return v.lower()


#: the most a count (tokens, a rate) may be: below 2**53, where doubles stop counting exactly
MAX_COUNT = 10**15
#: the most requests a minute or at once a limit may allow
MAX_RATE = 10**9
#: the largest cost budget in the price's currency: 9e6 * 1e9 units stays below 2**53
MAX_COST = 9_000_000.0
#: the largest price per million tokens
MAX_PRICE = 1_000_000.0


class Budget(Strict):
    """Tokens and/or cost a key may spend per UTC day or calendar month (reserved up front, settled with
    the real usage, like `tpm`); cost is in the currency of `models[].price`."""

    tokens: int | None = Field(None, ge=0, le=MAX_COUNT)
    cost: float | None = Field(None, ge=0, le=MAX_COST, allow_inf_nan=False)
    period: Literal["day", "month"] = "day"

    @model_validator(mode="after")
    def _something(self) -> Budget:
        if self.tokens is None and self.cost is None:
            raise ValueError("a budget needs tokens, cost or both")
        return self


class Price(Strict):
    """What a model's tokens cost, per million (any one currency across the config)."""

    input_per_million: float = Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)
    output_per_million: float = Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)


class Limits(Strict):
    rpm: int | None = Field(None, ge=0, le=MAX_RATE)
    tpm: int | None = Field(None, ge=0, le=MAX_COUNT)
    concurrency: int | None = Field(None, ge=0, le=MAX_RATE)
    budget: Budget | None = None


class KeyConfig(Strict):
    name: Name
    sha256: str = Field(description="hex SHA-256 digest of the key; the key itself is never stored")
    models: tuple[str, ...] = ("*",)
    limits: Limits = Limits()
    model_limits: dict[str, Limits] = Field(default_factory=dict)
    budget: Budget | None = Field(None, description="the key's token/cost budget (the same as limits.budget)")
    priority: PriorityClass = Field(
        "default", description="queue class: interactive before default before batch (a request may lower it)"
    )
    weight: float = Field(
        1.0, gt=0, le=1000, allow_inf_nan=False, description="share of the slots against other keys of its class"
    )

    @model_validator(mode="after")
    def _budget_is_a_limit(self) -> KeyConfig:
        if self.budget is not None:
            if self.limits.budget is not None and self.limits.budget != self.budget:
                raise ValueError("budget and limits.budget say different things: give one")
            # the key's principal carries its limits, budget included (frozen: set once, here)
            object.__setattr__(self, "limits", self.limits.model_copy(update={"budget": self.budget}))
        return self

    @field_validator("sha256")
    @classmethod
    def _check_digest(cls, v: str) -> str:
        return _sha256_hex(v, "the key")


class AuthConfig(Strict):
    mode: Literal["keys", "none"] = "keys"
    keys: tuple[KeyConfig, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        dupes("auth.keys name", [k.name for k in self.keys])
        dupes("auth.keys sha256", [k.sha256 for k in self.keys], show=False)
        return self


class AdminKeyConfig(Strict):
    name: Name
    sha256: str = Field(description="hex SHA-256 digest of the admin key; the key itself is never stored")

    @field_validator("sha256")
    @classmethod
    def _check_digest(cls, v: str) -> str:
        return _sha256_hex(v, "the admin key")


class AdminConfig(Strict):
    """The admin API (/admin: keys at runtime, audit log). On when at least one admin key is configured;
    admin keys are a role of their own: never a client key, and a client key never reaches /admin."""

    keys: tuple[AdminKeyConfig, ...] = ()
    key_poll_s: float = Field(
        1.0, gt=0, le=10, description="how often each replica checks the keys table for changes made elsewhere"
    )
    docs: bool = Field(
        False,
        description="serve /admin/docs: the admin routes on a page of the gateway's own (offline, no script); "
        "/admin/openapi.json is served either way, to admin keys",
    )

    @model_validator(mode="after")
    def _unique(self) -> AdminConfig:
        dupes("admin.keys name", [k.name for k in self.keys])
        dupes("admin.keys sha256", [k.sha256 for k in self.keys], show=False)
        return self


class LimitsConfig(Strict):
    store: Literal["memory", "redis"] = "memory"
    redis_url: SecretStr | None = None
    key_prefix: str = "llmgw"
    on_store_error: Literal["open", "closed"] = "open"
    store_timeout_ms: int = Field(250, ge=1, description="per store call; past it the on_store_error policy applies")
    default_max_tokens: int = Field(1024, ge=1, description="reserved when a request sets no max_tokens")

    @model_validator(mode="after")
    def _redis_needs_url(self) -> LimitsConfig:
        if self.store == "redis" and self.redis_url is None:
            raise ValueError("store 'redis' needs redis_url")
        return self
