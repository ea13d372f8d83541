"""The configuration schema: what a config file may say, with defaults and cross-field checks.

Loaded from YAML by `llm_gateway.config_loader` (which adds file/line context to errors and expands
`${VAR}` references); every field can be overridden from the environment as
`GATEWAY_<SECTION>__<FIELD>` (for example `GATEWAY_SERVER__PORT=9000`). Secrets are `SecretStr`:
they print as `**********` and only `.get_secret_value()` reveals them.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from llm_gateway.adapters.registry import formats_for, schedules_by_priority, unsupported_capabilities

EngineKind = Literal["llama-server", "vllm", "sglang", "ollama", "tabbyapi", "lmdeploy", "openai"]
WeightFormat = Literal["gguf", "exl2", "exl3", "awq", "gptq", "fp8", "safetensors"]
Capability = Literal["chat", "completions", "embeddings", "tools", "vision", "json_schema"]
PriorityClass = Literal["interactive", "default", "batch"]
#: the queue rank of each class: higher goes first
PRIORITY_RANKS: dict[str, int] = {"interactive": 2, "default": 1, "batch": 0}
Strategy = Literal["least_load", "round_robin", "weighted", "priority", "prefix_affinity"]

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,127}$"  # no "@": it separates a format suffix
Name = Annotated[str, Field(pattern=_NAME)]


def _dupes(what: str, values: list[str], *, show: bool = True) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ValueError(f"duplicate {what}" + (f": {v!r}" if show else ""))
        seen.add(v)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    connect_s: float = Field(5.0, gt=0)
    first_byte_s: float = Field(120.0, gt=0, description="until the engine's response headers")
    idle_s: float = Field(120.0, gt=0, description="longest silence between two chunks of a body")
    total_s: float = Field(1800.0, gt=0, description="whole upstream exchange, streams included")


class ProbeConfig(_Strict):
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)


class BackendConfig(_Strict):
    name: Name
    engine: EngineKind
    url: str
    api_key: SecretStr | None = None
    timeouts: Timeouts = Timeouts()
    probe: ProbeConfig = ProbeConfig()
    capacity: int = Field(1, ge=1, description="requests the engine runs at once (slots, batch size)")
    max_concurrency: int | None = Field(None, ge=1, description="gateway-side cap per deployment")
    max_queue: int = Field(64, ge=0, description="requests that may wait for a free slot")
    queue_timeout_s: float = Field(30.0, gt=0)

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https"):
            raise ValueError("must be an http:// or https:// URL")
        if not parts.hostname:
            raise ValueError("must name a host")
        if parts.username or parts.password:
            raise ValueError("must not carry credentials; use api_key")
        if parts.query or parts.fragment:
            raise ValueError("must not have a query or fragment")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as e:
            raise ValueError(f"bad port: {e}") from None
        return v.rstrip("/")


class DeploymentConfig(_Strict):
    backend: Name
    model: str = Field(min_length=1, description="the model name the engine knows")
    format: WeightFormat
    capabilities: frozenset[Capability] = frozenset({"chat", "completions"})
    weight: float = Field(1.0, gt=0)
    priority: int = 0
    max_concurrency: int | None = Field(None, ge=1)
    engine_priority: bool = Field(
        False, description="pass the request's class to the engine's scheduler (vLLM/SGLang priority scheduling)"
    )
    context_length: int | None = Field(
        None, ge=1, description="the context window in tokens, over what the engine reports (None: as probed)"
    )


class AffinityConfig(_Strict):
    prefix_chars: int = Field(512, ge=16, description="prompt characters hashed into the affinity key")
    max_load: float = Field(1.5, gt=0, description="leave the sticky deployment above this load per slot")


class ModelConfig(_Strict):
    name: Name
    aliases: tuple[Name, ...] = ()
    strategy: Strategy = "least_load"
    deployments: tuple[DeploymentConfig, ...] = Field(min_length=1)
    fallbacks: tuple[Name, ...] = ()
    affinity: AffinityConfig = AffinityConfig()
    price: Price | None = Field(None, description="for cost budgets and the usage report")


class Budget(_Strict):
    """Tokens and/or cost a key may spend per UTC day or calendar month (reserved up front, settled with
    the real usage, like `tpm`); cost is in the currency of `models[].price`."""

    tokens: int | None = Field(None, ge=0)
    cost: float | None = Field(None, ge=0)
    period: Literal["day", "month"] = "day"

    @model_validator(mode="after")
    def _something(self) -> Budget:
        if self.tokens is None and self.cost is None:
            raise ValueError("a budget needs tokens, cost or both")
        return self


class Price(_Strict):
    """What a model's tokens cost, per million (any one currency across the config)."""

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)


class Limits(_Strict):
    rpm: int | None = Field(None, ge=0)
    tpm: int | None = Field(None, ge=0)
    concurrency: int | None = Field(None, ge=0)
    budget: Budget | None = None


class KeyConfig(_Strict):
    name: Name
    sha256: str = Field(description="hex SHA-256 digest of the key; the key itself is never stored")
    models: tuple[str, ...] = ("*",)
    limits: Limits = Limits()
    model_limits: dict[str, Limits] = Field(default_factory=dict)
    budget: Budget | None = Field(None, description="the key's token/cost budget (the same as limits.budget)")
    priority: PriorityClass = Field(
        "default", description="queue class: interactive before default before batch (a request may lower it)"
    )
    weight: float = Field(1.0, gt=0, le=1000, description="share of the slots against other keys of its class")

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
        if not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("must be 64 hex characters (sha256 of the key; see `llm-gateway keys new`)")
        return v.lower()


class AuthConfig(_Strict):
    mode: Literal["keys", "none"] = "keys"
    keys: tuple[KeyConfig, ...] = ()

    @model_validator(mode="after")
    def _unique(self) -> AuthConfig:
        _dupes("auth.keys name", [k.name for k in self.keys])
        _dupes("auth.keys sha256", [k.sha256 for k in self.keys], show=False)
        return self


class AdminKeyConfig(_Strict):
    name: Name
    sha256: str = Field(description="hex SHA-256 digest of the admin key; the key itself is never stored")

    @field_validator("sha256")
    @classmethod
    def _check_digest(cls, v: str) -> str:
        if not re.fullmatch(r"[0-9a-fA-F]{64}", v):
            raise ValueError("must be 64 hex characters (sha256 of the admin key; see `llm-gateway keys new`)")
        return v.lower()


class AdminConfig(_Strict):
    """The admin API (/admin: keys at runtime, audit log). On when at least one admin key is configured;
    admin keys are a role of their own: never a client key, and a client key never reaches /admin."""

    keys: tuple[AdminKeyConfig, ...] = ()
    key_poll_s: float = Field(
        1.0, gt=0, le=10, description="how often each replica checks the keys table for changes made elsewhere"
    )

    @model_validator(mode="after")
    def _unique(self) -> AdminConfig:
        _dupes("admin.keys name", [k.name for k in self.keys])
        _dupes("admin.keys sha256", [k.sha256 for k in self.keys], show=False)
        return self


class LimitsConfig(_Strict):
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


class RoutingConfig(_Strict):
    retries: int = Field(2, ge=0, le=10)
    retry_budget_s: float = Field(10.0, gt=0)
    backoff_base_ms: float = Field(25.0, ge=0)
    breaker_failures: int = Field(5, ge=1)
    breaker_cooldown_s: float = Field(10.0, gt=0)
    stale_after_probes: float = Field(3.0, gt=0, description="a load signal older than this many intervals is unknown")
    prefer_resident: bool = Field(
        True, description="a deployment whose model would load cold counts a full slot of load; false: load alone"
    )
    format_header: str = "x-gateway-format"
    session_header: str = "x-session-id"
    priority_header: str = Field("x-gateway-priority", description="a request may lower its key's class with it")
    fair_queuing: bool = Field(True, description="order queues by class and fair share; false: FIFO")
    starvation_s: float = Field(10.0, gt=0, description="a lower class waiting this long goes before a higher one")
    queue_progress_s: float = Field(
        1.0, ge=0, description="a queued stream gets an SSE comment with its place this often; 0: never"
    )
    reserved_slots: dict[PriorityClass, int] = Field(
        default_factory=dict,
        description="per deployment with a concurrency limit: its last N slots are kept for this class and above",
    )


class CorsConfig(_Strict):
    """CORS for browser clients; off (no CORS headers at all) while `allow_origins` is empty."""

    allow_origins: tuple[str, ...] = Field((), description='origins allowed, e.g. "https://app.example.com"; "*": any')
    allow_headers: tuple[str, ...] = (
        "authorization",
        "content-type",
        "x-api-key",
        "x-request-id",
        "anthropic-version",
        "anthropic-beta",
        "x-session-id",
        "x-gateway-format",
    )
    max_age_s: int = Field(600, ge=0, description="how long a browser may cache a preflight answer")

    @field_validator("allow_origins")
    @classmethod
    def _check_origins(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        out = []
        for origin in v:
            origin = origin.rstrip("/").lower()
            if origin != "*":
                parts = urlsplit(origin)
                if parts.scheme not in ("http", "https") or not parts.netloc or parts.path or parts.query:
                    raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], no path) or '*'")
            out.append(origin)
        return tuple(out)

    @field_validator("allow_headers")
    @classmethod
    def _lower(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.lower() for h in v)


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    metrics_port: int | None = Field(None, ge=0, le=65535, description="also serve /metrics on this port")
    metrics_on_main_port: bool = True
    admin_port: int | None = Field(
        None, ge=0, le=65535, description="serve the admin API (/admin) on this port alone, not on the main port"
    )
    cors: CorsConfig = CorsConfig()
    max_body_bytes: int = Field(8 * 1024 * 1024, ge=1024)
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    header_timeout_s: float = Field(15.0, gt=0)
    body_timeout_s: float = Field(60.0, gt=0)
    keepalive_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(16384, ge=1)
    graceful_shutdown_s: float = Field(30.0, ge=0)
    access_log: bool = True
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    upstream_client: Literal["h1", "aiohttp", "httpx"] = Field(
        "h1", description="the HTTP client to engines: the gateway's own HTTP/1.1 client, or aiohttp or httpx"
    )
    reasoning_field: Literal["reasoning_content", "reasoning"] = Field(
        "reasoning_content", description="the one name reasoning text gets in answers, whatever the engine calls it"
    )
    reload_poll_s: float = Field(2.0, ge=0, description="config file check interval; 0 turns watching off")
    data_dir: str = Field("data", description="where the embedded database lives (relative: to the working directory)")


class UsageConfig(_Strict):
    """The usage ledger: one row per generation request in the database, written in batches behind the
    request path (a bounded buffer; past it rows are counted as dropped)."""

    ledger: bool = Field(False, description="keep the ledger in the database (database.url or server.data_dir)")
    buffer_rows: int = Field(10_000, ge=1, description="rows held while the database is slow or down")
    batch_rows: int = Field(500, ge=1, description="rows per INSERT")
    flush_interval_s: float = Field(1.0, gt=0)


DATABASE_SCHEMES = ("postgresql+asyncpg", "sqlite+aiosqlite")


class DatabaseConfig(_Strict):
    url: SecretStr | None = Field(
        None,
        description="postgresql+asyncpg://user:password@host:5432/db for a database the replicas share; "
        "unset: the embedded SQLite file in server.data_dir",
    )
    pool_size: int = Field(5, ge=1, le=100, description="connections each replica keeps to a shared database")
    connect_timeout_s: float = Field(5.0, gt=0, description="to connect; past it the database is unavailable (503)")
    statement_timeout_s: float = Field(
        10.0, gt=0, description="per statement, lock waits included, before it is cancelled (SQLite: the busy timeout)"
    )

    @field_validator("url", mode="before")
    @classmethod
    def _empty_url_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("url")
    @classmethod
    def _check_scheme(cls, v: SecretStr | None) -> SecretStr | None:
        # the message never echoes the value: it is a secret (and without "://" it could be all password)
        if v is not None and v.get_secret_value().partition("://")[0] not in DATABASE_SCHEMES:
            raise ValueError("must start with postgresql+asyncpg:// (a shared Postgres) or sqlite+aiosqlite://")
        return v


class GatewayConfig(BaseSettings):
    """The whole configuration. Environment overrides: GATEWAY_SERVER__PORT=9000 and so on."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", env_nested_delimiter="__", extra="forbid", frozen=True)

    server: ServerConfig = ServerConfig()
    auth: AuthConfig = AuthConfig()
    admin: AdminConfig = AdminConfig()
    limits: LimitsConfig = LimitsConfig()
    routing: RoutingConfig = RoutingConfig()
    database: DatabaseConfig = DatabaseConfig()
    usage: UsageConfig = UsageConfig()
    backends: tuple[BackendConfig, ...] = ()
    models: tuple[ModelConfig, ...] = ()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # the environment wins over the file (init kwargs come from the YAML file)
        return (env_settings, init_settings)

    @model_validator(mode="after")
    def _cross_check(self) -> GatewayConfig:
        _dupes("backends name", [b.name for b in self.backends])
        if {k.sha256 for k in self.admin.keys} & {k.sha256 for k in self.auth.keys}:
            raise ValueError("admin.keys: an admin key must not also be a client key (auth.keys)")
        backends = {b.name: b for b in self.backends}
        public: list[str] = []
        for m in self.models:
            public.append(m.name)
            public.extend(m.aliases)
        _dupes("model name or alias", public)
        names = {m.name for m in self.models}
        for mi, m in enumerate(self.models):
            for di, d in enumerate(m.deployments):
                where = f"models[{mi}].deployments[{di}]"
                b = backends.get(d.backend)
                if b is None:
                    raise ValueError(f"{where}.backend: no backend named {d.backend!r}")
                allowed = formats_for(b.engine)
                if allowed is not None and d.format not in allowed:
                    raise ValueError(
                        f"{where}.format: engine {b.engine!r} (backend {b.name!r}) cannot load "
                        f"{d.format!r} weights; it loads {', '.join(sorted(allowed))}"
                    )
                bad = d.capabilities & unsupported_capabilities(b.engine)
                if bad:
                    raise ValueError(f"{where}.capabilities: engine {b.engine!r} cannot serve {', '.join(sorted(bad))}")
                if d.engine_priority and not schedules_by_priority(b.engine):
                    raise ValueError(f"{where}.engine_priority: engine {b.engine!r} does not schedule by priority")
            for f in m.fallbacks:
                if f not in names:
                    raise ValueError(f"models[{mi}].fallbacks: no model named {f!r}")
                if f == m.name:
                    raise ValueError(f"models[{mi}].fallbacks: a model cannot fall back to itself")
        if not any(m.price for m in self.models):
            for ki, k in enumerate(self.auth.keys):
                for lim in (k.limits, *k.model_limits.values()):
                    if lim.budget is not None and lim.budget.cost is not None:
                        raise ValueError(f"auth.keys[{ki}]: a cost budget needs models[].price on the models it uses")
        return self
