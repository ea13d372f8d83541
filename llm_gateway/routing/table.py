"""The routing table: public model names -> deployments -> backends, with their live state.

Built from a validated config. On a reload the new table takes over the live state of what did not
change (a backend with the same name, engine and URL keeps its health, load and in-flight count; a
deployment keeps its breaker and admission queue), so requests in flight finish against the objects
they hold and nothing is counted twice or lost.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from llm_gateway.adapters.base import Adapter
from llm_gateway.adapters.registry import adapter_for
from llm_gateway.routing.admission import Admission
from llm_gateway.routing.breaker import Breaker
from llm_gateway.routing.engine_kv import EngineKv
from llm_gateway.routing.lora_book import LoraBook
from llm_gateway.routing.prefix_cache import PrefixRecord
from llm_gateway.routing.slots import SlotBook
from llm_gateway.settings import (
    PRIORITY_RANKS,
    AdapterConfig,
    BackendConfig,
    DeploymentConfig,
    GatewayConfig,
    ModelConfig,
)
from llm_gateway.types import BackendInfo, LoadSnapshot
from llm_gateway.upstream.base import UpstreamTimeouts

ROUTABLE = frozenset({"unknown", "ready", "busy"})
Progress = Callable[[int, float | None], Awaitable[None]]  # told (position, eta_s) while a request waits


class OnDemand(Protocol):
    """A managed backend's engine (routing/managed.py): started on demand, so routable while it is stopped."""

    def startable(self) -> bool:
        """False once it failed to start or kept dying (for a cooldown): not routable then."""

    def running(self) -> bool:
        """Its process is up and ready: the prober's view of it means something."""

    async def gate(self, timeout_s: float, progress: Progress | None, progress_s: float) -> bool:
        """Wait until it is ready and the request may go on (False: the time ran out)."""

    def describe(self) -> dict[str, object]: ...


@dataclass(eq=False)
class Backend:
    cfg: BackendConfig
    adapter: Adapter
    timeouts: UpstreamTimeouts
    state: str = "unknown"  # unknown | ready | loading | down
    detail: str = ""
    load: LoadSnapshot | None = None
    own_at_probe: int = 0
    models: frozenset[str] | None = None
    #: the context window of each served model, as last probed (None: not known)
    context_lengths: dict[str, int] | None = None
    #: which served models are loaded (resident), as the last probe said; None: the engine cannot tell
    resident: dict[str, bool] | None = None
    in_flight: int = 0
    busy_until: float = 0.0
    #: the engine the gateway starts and stops (a backend with `managed`), set by routing/managed.py
    managed: OnDemand | None = None
    #: the LoRA adapters its engine holds (routing/lora.py)
    loras: LoraBook = field(default_factory=LoraBook)
    #: the engine's KV-cache events (routing/kv_events.py), for a backend whose config names `kv_events`
    kv: EngineKv | None = None
    #: the config's name and the adapter's engine kind, read on every request: plain attributes, not
    #: properties over the pydantic config (a Python call each); a reload keeps a backend only with the
    #: same name and engine, so they never change
    name: str = field(init=False)
    kind: str = field(init=False)

    def __post_init__(self) -> None:
        self.name = self.cfg.name
        self.kind = self.adapter.kind

    def routable(self) -> bool:
        return self.state in ROUTABLE or (self.managed is not None and self.managed.startable())

    def health(self, now: float) -> str:
        """ready / busy / loading / down / unknown: busy is a live backend with no free slot."""
        if self.state != "ready":
            return self.state
        if self.busy_until > now or self.in_flight >= self.cfg.capacity:
            return "busy"
        load = self.load
        if load is not None and (load.waiting or 0) > 0:
            return "busy"
        return "ready"


@dataclass(eq=False)
class Deployment:
    model: str
    backend: Backend
    cfg: DeploymentConfig
    admission: Admission
    breaker: Breaker
    key: str
    #: the LoRA adapter this deployment serves on top of its model (a model's `adapters`); None: the model itself
    adapter: AdapterConfig | None = None
    #: the model itself, of a model with adapters: its engine is told to apply none (adapters/lora.py)
    base_of_adapters: bool = False
    #: the engine's name for the model (the config's `model`), fixed: it is part of the deployment's key
    upstream_model: str = field(init=False)
    #: what cache_aware routing sent it (prefix_cache.py); kept across reloads with the deployment
    prefixes: PrefixRecord = field(default_factory=PrefixRecord)
    #: which engine slot holds which conversation (slots.py), for engines that take a slot; kept likewise
    slots: SlotBook = field(default_factory=SlotBook)

    def __post_init__(self) -> None:
        self.upstream_model = self.cfg.model

    @property
    def capacity(self) -> int:
        return self.admission.limit or self.backend.cfg.capacity

    @property
    def context_length(self) -> int | None:
        """The deployment's context window in tokens: the configured one, else the engine's for this model
        (for an engine that serves whatever it has loaded, its one model's), else None (not known)."""
        if self.cfg.context_length is not None:
            return self.cfg.context_length
        known = self.backend.context_lengths
        if not known:
            return None
        found = known.get(self.upstream_model)
        if found is None and self.backend.adapter.ignores_model_name and len(known) == 1:
            return next(iter(known.values()))
        return found

    @property
    def resident(self) -> bool | None:
        """Is the deployment's model loaded on its engine (no cold load ahead)? None: the engine cannot tell.
        Looked up like the context window: by the upstream model's name, else an engine's one model."""
        known = self.backend.resident
        found = None
        if known:
            found = known.get(self.upstream_model)
            if found is None and self.backend.adapter.ignores_model_name and len(known) == 1:
                found = next(iter(known.values()))
        if self.adapter is not None and found is not False:  # an adapter: resident where its engine holds it
            return self.backend.loras.holds(self.adapter.name)
        return found

    def model_present(self) -> bool:
        models = self.backend.models
        if models is None or self.backend.adapter.ignores_model_name:
            return True
        return self.upstream_model in models


@dataclass(eq=False)
class ModelRoute:
    cfg: ModelConfig
    deployments: list[Deployment]
    rotation: int = 0
    eligible: dict[tuple[str | None, frozenset[str]], list[Deployment]] = field(default_factory=dict)
    name: str = field(init=False)  # the public name (a route is built anew on every reload)

    def __post_init__(self) -> None:
        self.name = self.cfg.name


@dataclass(eq=False)
class RoutingTable:
    config: GatewayConfig
    backends: dict[str, Backend]
    routes: dict[str, ModelRoute]  # canonical names and aliases
    models: list[ModelRoute]

    def resolve(self, name: str) -> ModelRoute | None:
        return self.routes.get(name)

    def public_names(self) -> Iterable[tuple[str, ModelRoute]]:
        for m in self.models:
            yield m.name, m
            for a in m.cfg.aliases:
                yield a, m


def _timeouts(b: BackendConfig) -> UpstreamTimeouts:
    t = b.timeouts
    return UpstreamTimeouts(t.connect_s, t.first_byte_s, t.idle_s, t.total_s)


def _with_adapters(models: Iterable[ModelConfig]) -> Iterable[tuple[ModelConfig, AdapterConfig | None]]:
    """Each model, then one model per LoRA adapter of it: named `<model>:<adapter>` with the adapter's aliases and
    the model's deployments (those on engines that serve adapters), each deployment serving that adapter."""
    for mc in models:
        yield mc, None
        for a in mc.adapters:
            name, *aliases = mc.adapter_names(a)
            yield mc.model_copy(update={"name": name, "aliases": tuple(aliases), "adapters": (), "fallbacks": ()}), a


def build_table(cfg: GatewayConfig, previous: RoutingTable | None = None) -> RoutingTable:
    old_backends = previous.backends if previous else {}
    old_deps: dict[tuple[str, str], Deployment] = {}
    if previous:
        for m in previous.models:
            for d in m.deployments:
                old_deps[(m.name, d.key)] = d

    backends: dict[str, Backend] = {}
    for bc in cfg.backends:
        key = bc.api_key.get_secret_value() if bc.api_key else None
        adapter = adapter_for(bc.engine, BackendInfo(bc.name, bc.url, key))
        old = old_backends.get(bc.name)
        if old is not None and old.cfg.engine == bc.engine and old.cfg.url == bc.url:
            old.cfg, old.adapter, old.timeouts = bc, adapter, _timeouts(bc)
            backends[bc.name] = old
        else:
            backends[bc.name] = Backend(bc, adapter, _timeouts(bc))
        backends[bc.name].loras.limit = bc.max_adapters

    routes: dict[str, ModelRoute] = {}
    models: list[ModelRoute] = []
    r = cfg.routing
    reserved = {PRIORITY_RANKS[c]: n for c, n in r.reserved_slots.items()}
    for mc, lora in _with_adapters(cfg.models):
        deps = []
        for dc in mc.deployments:
            b = backends[dc.backend]
            if lora is not None and b.adapter.lora is None:
                continue  # an engine that serves no adapters serves only the model itself
            key = f"{b.name}/{dc.model}" + (f":{lora.name}" if lora is not None else "")
            limit = dc.max_concurrency or b.cfg.max_concurrency
            prev = old_deps.get((mc.name, key))
            if prev is not None and prev.backend is b:
                prev.cfg, prev.adapter = dc, lora
                prev.base_of_adapters = lora is None and bool(mc.adapters)
                prev.admission.limit, prev.admission.max_queue = limit, b.cfg.max_queue
                prev.admission.starvation_s = r.starvation_s
                prev.admission.reserved = reserved
                prev.admission.fair = r.fair_queuing
                prev.breaker.threshold, prev.breaker.cooldown_s = r.breaker_failures, r.breaker_cooldown_s
                deps.append(prev)
            else:
                deps.append(
                    Deployment(
                        mc.name,
                        b,
                        dc,
                        Admission(
                            limit,
                            b.cfg.max_queue,
                            starvation_s=r.starvation_s,
                            reserved=reserved,
                            fair=r.fair_queuing,
                        ),
                        Breaker(r.breaker_failures, r.breaker_cooldown_s),
                        key,
                        lora,
                        lora is None and bool(mc.adapters),
                    )
                )
        route = ModelRoute(mc, deps)
        models.append(route)
        routes[mc.name] = route
        for a in mc.aliases:
            routes[a] = route
    return RoutingTable(cfg, backends, routes, models)
