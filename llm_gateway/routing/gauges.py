"""The routing table's state as Prometheus gauges, read at scrape time (in-flight, queue length, backend
health, breaker state, context windows, residency, engine load signals): it costs the request path
nothing. The metrics registry (`observability/metrics.py`) holds the collector; it never imports routing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_gateway.routing.breaker import STATE_VALUE
from llm_gateway.routing.table import RoutingTable
from llm_gateway.settings import CLASS_NAMES

BACKEND_STATES = ("unknown", "ready", "busy", "loading", "down", "stopped")  # stopped: a managed one, on demand


class TableGauges(Collector):
    """Gauges read from the routing table at scrape time."""

    def __init__(self, table: Callable[[], RoutingTable]) -> None:
        self.table = table  # the live table (a reload swaps it)

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        table = self.table()
        now = time.monotonic()
        up = GaugeMetricFamily(
            "gateway_backend_up", "1 when the backend is live (ready or busy).", labels=["backend", "engine"]
        )
        state = GaugeMetricFamily(
            "gateway_backend_state", "Backend state (one series per state, 1 = current).", labels=["backend", "state"]
        )
        inflight = GaugeMetricFamily(
            "gateway_in_flight_requests", "Requests the gateway has in flight to the backend.", labels=["backend"]
        )
        waiting = GaugeMetricFamily(
            "gateway_backend_requests_waiting",
            "Requests queued in the engine, as it reports them (NaN: unknown).",
            labels=["backend"],
        )
        running = GaugeMetricFamily(
            "gateway_backend_requests_running",
            "Requests running in the engine, as it reports them (NaN: unknown).",
            labels=["backend"],
        )
        kv = GaugeMetricFamily(
            "gateway_backend_kv_cache_usage_ratio",
            "KV-cache or token-pool fill (0-1), as the engine reports it (NaN: unknown).",
            labels=["backend"],
        )
        age = GaugeMetricFamily(
            "gateway_backend_load_age_seconds", "Age of the engine's last load report.", labels=["backend"]
        )
        # the engines' own counters as of their last probe (cumulative; a restarted engine starts again at 0)
        computed = CounterMetricFamily(
            "gateway_engine_prompt_computed_tokens",
            "Prompt tokens the engine computed, those its cache served not counted (llama-server), as last probed.",
            labels=["backend"],
        )
        queried = CounterMetricFamily(
            "gateway_engine_prefix_cache_queried_tokens",
            "Prompt tokens the engine looked up in its prefix cache (vLLM), as last probed.",
            labels=["backend"],
        )
        hit = CounterMetricFamily(
            "gateway_engine_prefix_cache_hit_tokens",
            "Prompt tokens the engine's prefix cache served (vLLM), as last probed.",
            labels=["backend"],
        )
        for b in table.backends.values():
            h = b.health(now)
            up.add_metric([b.name, b.kind], 1.0 if h in ("ready", "busy") else 0.0)
            for s in BACKEND_STATES:
                state.add_metric([b.name, s], 1.0 if s == h else 0.0)
            inflight.add_metric([b.name], float(b.in_flight))
            load = b.load
            waiting.add_metric([b.name], _num(load.waiting if load else None))
            running.add_metric([b.name], _num(load.running if load else None))
            kv.add_metric([b.name], _num(load.kv if load else None))
            age.add_metric([b.name], now - load.at if load else math.nan)
            if load is not None:
                for family, value in ((computed, load.computed), (queried, load.cache_queries), (hit, load.cache_hits)):
                    if value is not None:
                        family.add_metric([b.name], value)
        labels = ["model", "backend", "upstream_model"]
        breaker = GaugeMetricFamily(
            "gateway_breaker_state", "Circuit breaker per deployment: 0 closed, 1 half-open, 2 open.", labels=labels
        )
        queue = GaugeMetricFamily(
            "gateway_deployment_queue_length", "Requests waiting for a free slot of the deployment.", labels=labels
        )
        window = GaugeMetricFamily(
            "gateway_deployment_context_length",
            "The deployment's context window in tokens (configured, else as its engine reports it); no series"
            " while it is not known.",
            labels=labels,
        )
        resident = GaugeMetricFamily(
            "gateway_deployment_resident",
            "1 while the deployment's model is loaded on its engine, 0 while a request would load it cold; no"
            " series while the engine cannot tell.",
            labels=labels,
        )
        by_class = GaugeMetricFamily(
            "gateway_queue_length",
            "Requests waiting for a free slot, by priority class (all deployments).",
            labels=["priority"],
        )
        waiting_by_class = dict.fromkeys(CLASS_NAMES.values(), 0)
        for m in table.models:
            for d in m.deployments:
                key = [m.name, d.backend.name, d.upstream_model]
                breaker.add_metric(key, float(STATE_VALUE[d.breaker.state]))
                queue.add_metric(key, float(d.admission.queued))
                if (n := d.context_length) is not None:
                    window.add_metric(key, float(n))
                if (r := d.resident) is not None:
                    resident.add_metric(key, 1.0 if r else 0.0)
                for rank, n in d.admission.queued_by_class().items():
                    name = CLASS_NAMES.get(rank, "default")
                    waiting_by_class[name] = waiting_by_class.get(name, 0) + n
        for name, n in waiting_by_class.items():
            by_class.add_metric([name], float(n))
        yield from (up, state, inflight, waiting, running, kv, age)
        yield from (f for f in (computed, queried, hit) if f.samples)  # no engine says: no family
        yield from (breaker, queue, window, resident, by_class)


def _num(v: float | None) -> float:
    return math.nan if v is None else float(v)
