"""The gateway's shared objects, and the swappable part that a config reload replaces.

`Gateway` lives as long as the process: upstream client, metrics, access log, limits store, the
current `Runtime`. A `Runtime` is everything derived from one config: routing table, key table,
limiter, dispatcher. A reload builds a complete new Runtime from a validated config and swaps one
reference; a request holds the Runtime it started with until it ends.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from llm_gateway.access.keys import Authenticator
from llm_gateway.access.limiter import Limiter
from llm_gateway.access.memory import MemoryStore
from llm_gateway.access.store import LimitStore
from llm_gateway.observability.ledger import UsageLedger
from llm_gateway.observability.logs import AccessLog
from llm_gateway.observability.metrics import Metrics
from llm_gateway.observability.tracing import Tracing, make_tracing
from llm_gateway.routing.dispatch import Dispatcher
from llm_gateway.routing.gauges import TableGauges
from llm_gateway.routing.lora import LoraMetrics, LoraPlacer
from llm_gateway.routing.placements import SessionPlacements
from llm_gateway.routing.table import RoutingTable, build_table
from llm_gateway.settings import GatewayConfig, LimitsConfig
from llm_gateway.upstream.base import UpstreamClient

log = logging.getLogger("gateway")


@dataclass(eq=False)
class Runtime:
    config: GatewayConfig
    table: RoutingTable
    auth: Authenticator
    limiter: Limiter
    dispatcher: Dispatcher
    session_header: bytes
    format_header: bytes
    priority_header: bytes


def make_store(cfg: LimitsConfig, metrics: Metrics) -> LimitStore:
    if cfg.store == "redis":
        assert cfg.redis_url is not None
        from llm_gateway.access.redis_store import RedisStore  # redis is imported only when configured

        return RedisStore(
            cfg.redis_url.get_secret_value(),
            prefix=cfg.key_prefix,
            timeout_ms=cfg.store_timeout_ms,
            on_state=lambda up: metrics.ratelimit_store_up.set(1 if up else 0),
        )
    return MemoryStore()


def make_placements(cfg: LimitsConfig) -> SessionPlacements | None:
    """cache_aware's shared session placements live in the Redis the limits use (None: none shared)."""
    if cfg.store != "redis":
        return None
    assert cfg.redis_url is not None
    from llm_gateway.routing.placements import RedisPlacements

    return RedisPlacements(cfg.redis_url.get_secret_value(), prefix=cfg.key_prefix, timeout_ms=cfg.store_timeout_ms)


def make_upstream(kind: str) -> UpstreamClient:
    if kind == "httpx":
        from llm_gateway.upstream.httpx_client import HttpxUpstream

        return HttpxUpstream()
    if kind == "aiohttp":
        from llm_gateway.upstream.aiohttp_client import AiohttpUpstream

        return AiohttpUpstream()
    from llm_gateway.upstream.h1_client import H1Upstream

    return H1Upstream()


class Gateway:
    def __init__(
        self,
        config: GatewayConfig,
        *,
        upstream: UpstreamClient | None = None,
        store: LimitStore | None = None,
        config_path: str | None = None,
    ) -> None:
        self.metrics = Metrics()
        self.access = AccessLog(config.server.access_log)
        self.usage = UsageLedger(self.metrics, config.usage)  # ledger buffer + recent activity (status page)
        self.config_path = config_path
        self.server = config.server  # fixed for the process (host, port, limits of the HTTP server)
        #: OpenTelemetry traces, fixed for the process (None: off, nothing of OpenTelemetry imported)
        dropped = self.metrics.trace_spans_dropped
        self.tracing: Tracing | None = make_tracing(config.tracing, lambda why, n: dropped.labels(why).inc(n))
        self._upstream = upstream
        self.store = store or make_store(config.limits, self.metrics)
        self.placements = make_placements(config.limits)  # fixed for the process, as the limits store is
        #: loads models' LoRA adapters where requests need them (routing/lora.py); its metrics from the start
        self.loras = LoraPlacer(lambda: self.upstream, lambda: LoraMetrics(self.metrics, lambda: self.runtime.table))
        self.runtime = self.build_runtime(config, None)
        self.metrics.watch(TableGauges(lambda: self.runtime.table))

    @property
    def upstream(self) -> UpstreamClient:
        if self._upstream is None:  # created inside the running loop (aiohttp needs one)
            self._upstream = make_upstream(self.server.upstream_client)
        return self._upstream

    def build_runtime(self, config: GatewayConfig, previous: Runtime | None) -> Runtime:
        m = self.metrics
        limiter = Limiter(
            self.store,
            fail_open=config.limits.on_store_error == "open",
            on_reject=lambda key, kind: m.ratelimit_rejections.labels(key, kind).inc(),
            on_store_error=m.ratelimit_store_errors.inc,
            lease_s=max(b.timeouts.total_s for b in config.backends) + 60 if config.backends else 3600.0,
            prices={m.name: m.price for m in config.models if m.price is not None},
            aliases={m.name: m.aliases for m in config.models if m.aliases},
        )
        return Runtime(
            config=config,
            table=build_table(config, previous.table if previous else None),
            auth=Authenticator(config.auth),
            limiter=limiter,
            dispatcher=Dispatcher(config.routing, m, placements=self.placements, loras=self.loras),
            session_header=config.routing.session_header.lower().encode(),
            format_header=config.routing.format_header.lower().encode(),
            priority_header=config.routing.priority_header.lower().encode(),
        )

    def apply(self, config: GatewayConfig) -> Runtime:
        """Swap in a new config (already validated). Settings that need a restart are reported."""
        old = self.runtime
        for what, a, b in (
            ("server", old.config.server, config.server),
            ("limits.store", old.config.limits.store, config.limits.store),
            ("limits.redis_url", old.config.limits.redis_url, config.limits.redis_url),
            ("tracing", old.config.tracing, config.tracing),
        ):
            if a != b:
                log.warning("config reload: changes to %s take effect only after a restart", what)
        self.runtime = self.build_runtime(config, old)
        self.access.enabled = self.server.access_log
        return self.runtime

    async def aclose(self) -> None:
        if self._upstream is not None:
            await self._upstream.aclose()
        await self.store.aclose()
        if self.placements is not None:
            await self.placements.aclose()
        if self.tracing is not None:  # the spans still batched go out (blocking: off the loop)
            await asyncio.to_thread(self.tracing.shutdown)
