"""The metrics of managed engines: loads, unloads (and why), load time, restarts, swaps; and, read at scrape
time, which engines are resident and each host's memory used against its budget. Registered only once a
managed backend is configured (a gateway without one exports none of these families)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from llm_gateway.observability.metrics import Metrics

#: per host: its name, its budget (None: none), and per engine (backend, resident, requests waiting, memory MB)
Snapshot = Callable[[], list[tuple[str, float | None, list[tuple[str, bool, int, float]]]]]

UNLOAD_REASONS = ("idle", "evicted", "over_budget", "shutdown", "removed")  # over_budget: found loaded
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class ManagedMetrics:
    def __init__(self, metrics: Metrics, snapshot: Snapshot) -> None:
        r = metrics.registry
        self.loads = Counter("gateway_managed_loads", "Managed engines started and ready.", ["backend"], registry=r)
        self.load_failures = Counter(
            "gateway_managed_load_failures", "Managed engines not ready in time.", ["backend"], registry=r
        )
        self.unloads = Counter(
            "gateway_managed_unloads", "Managed engines stopped, by reason.", ["backend", "reason"], registry=r
        )
        self.deaths = Counter(
            "gateway_managed_deaths", "Managed engines that exited by themselves.", ["backend"], registry=r
        )
        self.restarts = Counter(
            "gateway_managed_restarts", "Managed engines restarted after dying.", ["backend"], registry=r
        )
        self.swaps = Counter(
            "gateway_managed_swaps", "Engines unloaded to make room for another.", ["host"], registry=r
        )
        self.load_seconds = Histogram(
            "gateway_managed_load_seconds", "From spawn to ready.", ["backend"], buckets=LOAD_BUCKETS, registry=r
        )
        self._snapshot = snapshot
        metrics.watch(self)

    def track(self, backend: str, host: str) -> None:
        """Zero series for a managed backend and its host, so that every family has samples from the start."""
        for c in (self.loads, self.load_failures, self.deaths, self.restarts, self.load_seconds):
            c.labels(backend)
        for reason in UNLOAD_REASONS:
            self.unloads.labels(backend, reason)
        self.swaps.labels(host)

    def loaded(self, backend: str, seconds: float) -> None:
        self.loads.labels(backend).inc()
        self.load_seconds.labels(backend).observe(seconds)

    def load_failed(self, backend: str) -> None:
        self.load_failures.labels(backend).inc()

    def unloaded(self, backend: str, reason: str) -> None:
        self.unloads.labels(backend, reason).inc()

    def died(self, backend: str) -> None:
        self.deaths.labels(backend).inc()

    def restarted(self, backend: str) -> None:
        self.restarts.labels(backend).inc()

    def swapped(self, host: str) -> None:
        self.swaps.labels(host).inc()

    def collect(self) -> Iterator[Metric]:
        resident = GaugeMetricFamily(
            "gateway_managed_resident", "1: the managed engine runs (or starts).", labels=["backend"]
        )
        waiting = GaugeMetricFamily(
            "gateway_managed_waiting", "Requests waiting for a managed engine.", labels=["backend"]
        )
        used = GaugeMetricFamily(
            "gateway_managed_memory_used_mb", "Memory of the resident managed engines.", labels=["host"]
        )
        budget = GaugeMetricFamily("gateway_managed_memory_budget_mb", "A host's memory budget.", labels=["host"])
        for host, cap, engines in self._snapshot():
            total = 0.0
            for name, on, queued, mb in engines:
                resident.add_metric([name], 1.0 if on else 0.0)
                waiting.add_metric([name], float(queued))
                total += mb if on else 0.0
            used.add_metric([host], total)
            if cap is not None:
                budget.add_metric([host], cap)
        yield from (resident, waiting, used, budget)
