"""The engines and the models they serve (backends, deployments, probing, timeouts), routing, and
`GatewayConfig`, the whole configuration with the checks that span sections.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from llm_gateway.adapters.registry import formats_for, schedules_by_priority, serves_lora, unsupported_capabilities
from llm_gateway.settings.access import AdminConfig, AuthConfig, LimitsConfig, Price
from llm_gateway.settings.managed import ManagedConfig, ManagedHosts
from llm_gateway.settings.server import BatchesConfig, DatabaseConfig, ServerConfig, TracingConfig, UsageConfig
from llm_gateway.settings.vocabulary import (
    Capability,
    EngineKind,
    Name,
    PriorityClass,
    Strategy,
    Strict,
    WeightFormat,
    dupes,
)


class Timeouts(Strict):
    connect_s: float = Field(5.0, gt=0)
    first_byte_s: float = Field(120.0, gt=0, description="until the engine's response headers")
    idle_s: float = Field(120.0, gt=0, description="longest silence between two chunks of a body")
    total_s: float = Field(1800.0, gt=0, description="whole upstream exchange, streams included")


class ProbeConfig(Strict):
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(2.0, gt=0)


class BackendConfig(Strict):
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
    managed: ManagedConfig | None = Field(None, description="the gateway starts and stops this engine on demand")
    max_adapters: int | None = Field(
        None,
        ge=1,
        description="LoRA adapters the gateway keeps loaded on this engine at once (vLLM --max-cpu-loras, SGLang "
        "--max-loaded-loras); the least recently used idle one is unloaded to make room; None: no cap",
    )
    kv_events: str | None = Field(
        None,
        description="vLLM/SGLang: the engine's KV-cache event publisher (its --kv-events-config), as "
        "tcp://host:port, or `auto` (vLLM: the one it names at /kv_event_sources). cache_aware's record of the "
        "engine's prefix cache then empties when the engine clears or restarts and ages as it evicts "
        "(routing/kv_events.py); needs the `kv-events` extra",
    )

    @field_validator("api_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, v: object) -> object:
        return None if v == "" else v

    @field_validator("kv_events")
    @classmethod
    def _check_kv_events(cls, v: str | None) -> str | None:
        if v is None or v == "auto":
            return v
        parts = urlsplit(v)
        try:
            port = parts.port
        except ValueError:
            port = None
        if parts.scheme != "tcp" or not parts.hostname or port is None or parts.path not in ("", "/"):
            raise ValueError("must be tcp://host:port (the engine's ZeroMQ publisher) or 'auto'")
        if parts.hostname in ("*", "0.0.0.0"):
            raise ValueError("must name the engine's host (the engine binds '*'; the gateway connects to it)")
        return v.rstrip("/")

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


class DeploymentConfig(Strict):
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


class AffinityConfig(Strict):
    """prefix_affinity's and cache_aware's knobs (routing/selection.py, routing/prefix_cache.py)."""

    prefix_chars: int = Field(512, ge=16, description="prefix_affinity: prompt characters hashed into its key")
    max_load: float = Field(1.5, gt=0, description="prefix_affinity: leave the sticky deployment above this load")
    block_bytes: int = Field(1024, ge=64, le=1 << 20, description="cache_aware: bytes of prompt per hashed block")
    cache_tokens: int = Field(
        1_000_000, ge=1, description="cache_aware: the prefix cache of one deployment's engine, in tokens"
    )
    ttl_s: float = Field(3600.0, gt=0, description="cache_aware: a prefix or session not sent for this long is gone")
    load_weight: float = Field(
        0.5, ge=0, description="cache_aware: beta in matched/prompt - beta * (load - lowest load), load per slot"
    )
    max_imbalance: float = Field(
        2.0,
        gt=0,
        description="cache_aware: a deployment this much load per slot above the lowest yields (2.0: README's "
        "agent runs moved no conversation and matched the oracle; 1.0 moved long ones late, 1.18x on vLLM)",
    )
    new_conversations: Literal["auto", "hash", "load"] = Field(
        "auto",
        description="cache_aware: where a new conversation goes: `load`, the deployment holding the fewest of this "
        "replica's live conversations, then least load; or the rendezvous hash of its key (the same on every replica): "
        "set `hash` for several replicas without a shared Redis; auto: load (with or without Redis)",
    )
    engine_slots: bool = Field(
        False,
        description="cache_aware: ask engines that take one (llama-server id_slot) for the conversation's slot "
        "(off by default: no gain measured, README)",
    )


class AdapterConfig(Strict):
    """A LoRA adapter of a model, served as the model `<model>:<name>` (and its aliases) by the model's deployments
    whose engine serves adapters (routing/lora.py; adapters/lora.py says how each engine does)."""

    name: Name
    path: str = Field(
        min_length=1,
        description="where the engine finds it: a PEFT directory (vLLM, SGLang) or the GGUF file llama-server was "
        "started with (--lora)",
    )
    aliases: tuple[Name, ...] = ()
    scale: float = Field(1.0, description="llama-server: the scale it is applied at")


class ModelConfig(Strict):
    name: Name
    aliases: tuple[Name, ...] = ()
    strategy: Strategy = Field(
        "least_load",
        description="unset: cache_aware for a model with more than one deployment (README: it recomputed what the "
        "oracle did, least_load 1.25-1.6x that), least_load for one",
    )
    deployments: tuple[DeploymentConfig, ...] = Field(min_length=1)
    fallbacks: tuple[Name, ...] = ()
    affinity: AffinityConfig = AffinityConfig()
    price: Price | None = Field(None, description="for cost budgets and the usage report")
    adapters: tuple[AdapterConfig, ...] = Field((), description="LoRA adapters of this model, each a model of its own")

    @model_validator(mode="before")
    @classmethod
    def _default_strategy(cls, data: object) -> object:
        """A model that names no strategy: cache_aware where there is a choice of deployment (an explicit one wins)."""
        if isinstance(data, dict) and "strategy" not in data:
            deployments = data.get("deployments")
            if isinstance(deployments, list | tuple) and len(deployments) > 1:
                return {**data, "strategy": "cache_aware"}
        return data

    def adapter_names(self, a: AdapterConfig) -> tuple[str, ...]:
        """The public names of one of its adapters: `<model>:<adapter>`, then its aliases."""
        return (f"{self.name}:{a.name}", *a.aliases)


class RoutingConfig(Strict):
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
    batches: BatchesConfig = BatchesConfig()
    tracing: TracingConfig = TracingConfig()
    managed: ManagedHosts = ManagedHosts()
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
        dupes("backends name", [b.name for b in self.backends])
        if {k.sha256 for k in self.admin.keys} & {k.sha256 for k in self.auth.keys}:
            raise ValueError("admin.keys: an admin key must not also be a client key (auth.keys)")
        backends = {b.name: b for b in self.backends}
        public: list[str] = []
        for m in self.models:
            public.append(m.name)
            public.extend(m.aliases)
            dupes(f"adapter name of model {m.name!r}", [a.name for a in m.adapters])
            for a in m.adapters:
                public.extend(m.adapter_names(a))
        dupes("model name or alias", public)
        names = {m.name for m in self.models}
        for bi, bc in enumerate(self.backends):
            if bc.managed is not None and urlsplit(bc.url).port is None:
                raise ValueError(
                    f"backends[{bi}].url: a managed backend's URL must name its port (the command's {{port}})"
                )
        grouped: dict[str, str] = {}
        for g, members in self.managed.swap_groups.items():
            where = f"managed.swap_groups.{g}"
            if len(set(members)) < 2:
                raise ValueError(f"{where}: a swap group needs at least two backends (distinct)")
            hosts: set[str] = set()
            for name in members:
                bg = backends.get(name)
                if bg is None:
                    raise ValueError(f"{where}: no backend named {name!r}")
                if bg.managed is None:
                    raise ValueError(f"{where}: backend {name!r} is not managed (a swap group starts and stops them)")
                if grouped.setdefault(name, g) != g:
                    raise ValueError(f"{where}: backend {name!r} is already in swap group {grouped[name]!r}")
                hosts.add(bg.managed.host)
            if len(hosts) > 1:
                raise ValueError(f"{where}: its backends must share one host (managed.host), not {sorted(hosts)}")
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
            if m.adapters and not any(serves_lora(backends[d.backend].engine) for d in m.deployments):
                raise ValueError(
                    f"models[{mi}].adapters: no deployment of model {m.name!r} is on an engine that serves LoRA "
                    "adapters (vllm, sglang, llama-server)"
                )
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
        if self.limits.store == "memory" and not self.usage.ledger:
            for ki, k in enumerate(self.auth.keys):
                if any(lim.budget is not None for lim in (k.limits, *k.model_limits.values())):
                    raise ValueError(
                        f"auth.keys[{ki}]: a budget must outlive the process: on the memory store it is restored "
                        "from the usage ledger at start, so set usage.ledger: true (or use limits.store: redis)"
                    )
        return self
