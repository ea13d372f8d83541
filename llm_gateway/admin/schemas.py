"""The admin API's wire models (pydantic): what a request may say, and what is answered.

Times are ISO 8601 with a time zone on the wire (stored as unix seconds). A key's digest is never
answered whole: `sha256_prefix` (its first 8 hex digits) is enough to tell keys apart; the key itself
is answered once, by the call that creates or rotates it (`KeyCreated.key`).

Every field is bounded: names and globs by pattern and length, lists and maps by count, numbers by the
limits' own bounds (llm_gateway/settings/access.py: finite, exact in both limit stores), times to what a
datetime can hold; anything else is a 422, never a value stored to fail later. A key's `id` is its
identity (stored responses, limits, budgets, usage rows and audit entries name it); `name` is a label,
unique across the config file's keys and the runtime keys.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from llm_gateway.settings import Limits

#: runtime key names: the config's names without "/" (a name is a path segment of /admin/keys/{name})
KeyName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:+-]{0,127}$", examples=["team-a-ci"])]
ModelGlob = Annotated[str, Field(min_length=1, max_length=256)]
DIGEST_PREFIX_CHARS = 8


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _future(v: datetime) -> datetime:
    try:
        in_utc = v.astimezone(UTC)
    except OverflowError:  # past 9999-12-31 in UTC: no datetime (and no answer) can hold it
        raise ValueError("must be before the year 10000 (UTC)") from None
    if in_utc <= datetime.now(UTC):
        raise ValueError("must be in the future")
    return v


Expiry = Annotated[AwareDatetime, AfterValidator(_future)]


class KeyCreate(_In):
    name: KeyName
    models: list[ModelGlob] = Field(
        max_length=100,
        description="globs of the public models it may use, matched against each model's own name (an alias "
        'written out whole stands for its model); required: send ["*"] for every model, [] for none',
        examples=[["llama-*"]],
    )
    limits: Limits = Limits()
    model_limits: dict[ModelGlob, Limits] = Field(default_factory=dict, max_length=100)
    expires_at: Expiry | None = Field(None, description="when it stops working (ISO 8601 with a zone)")


class KeyUpdate(_In):
    """Only the fields sent change; `expires_at: null` removes the expiry."""

    models: list[ModelGlob] | None = Field(None, max_length=100)
    limits: Limits | None = None
    model_limits: dict[ModelGlob, Limits] | None = Field(None, max_length=100)
    expires_at: Expiry | None = None

    @model_validator(mode="after")
    def _only_expiry_is_nullable(self) -> KeyUpdate:
        for name in ("models", "limits", "model_limits"):
            if name in self.model_fields_set and getattr(self, name) is None:
                raise ValueError(f"{name} cannot be null (send [] or {{}} for none)")
        return self


Status = Literal["active", "revoked", "expired", "conflict", "malformed"]


class KeyOut(BaseModel):
    id: str = Field(description="the key's identity, fixed for its life (a config key's follows its digest)")
    name: str
    source: Literal["config", "runtime"] = Field(description="config: from the config file, read-only")
    read_only: bool
    status: Status = Field(
        description="conflict: a config-file key has its name, so it is refused (delete it); malformed: "
        "stored by an older version in a form this one cannot use, so it is refused (PATCH it)"
    )
    sha256_prefix: str = Field(description=f"the first {DIGEST_PREFIX_CHARS} hex digits of the key's SHA-256")
    models: list[str]
    limits: Limits
    model_limits: dict[str, Limits]
    expires_at: datetime | None = None
    revoked_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None


class KeyCreated(KeyOut):
    key: str = Field(description="the key itself: shown this once, only its digest is stored")


class KeyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[KeyOut]


class AuditEntry(BaseModel):
    id: int
    at: datetime
    actor: str = Field(description="the admin key's name")
    action: str = Field(examples=["key.create", "key.update", "key.revoke", "key.rotate", "key.delete"])
    target: str | None = Field(None, description="the name of the key acted on")
    target_id: str | None = Field(None, description="the id of the key acted on")
    changes: dict[str, Any] | None = Field(None, description="the fields set (for an update: from and to)")


class AuditList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AuditEntry]
    has_more: bool
    next_before: int | None = Field(None, description="pass as `before` for the next (older) page")


def from_unix(ts: int) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


def to_time(ts: int | None) -> datetime | None:
    return None if ts is None else from_unix(ts)


def to_unix(dt: datetime | None) -> int | None:
    return None if dt is None else int(dt.timestamp())
