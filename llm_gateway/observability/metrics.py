"""Prometheus metrics measured at the gateway, the same for every engine.

One registry per app (no module globals). Hot-path series are cached per deployment so a request
pays for a few `inc`/`observe` calls, not for label lookups. State that already lives in the
routing table (in-flight, queue length, backend health, breaker state, engine load signals) is
read at scrape time by a collector, so it costs the request path nothing.

Labels are bounded: public model names and backend names come from the config, key names from the
config, endpoint/outcome/status class from fixed sets. Never a raw key, prompt, request id or any
other string a client chooses (an unknown model is counted as "unknown").

The gateway runs one worker per process (scale out with replicas, limits shared through Redis);
`llm-gateway serve` has no workers option, so there is no multiprocess mode to get wrong. The request path's
series are written without prometheus-client's locks (`child`, `inc`, `observe`, `observe_many`): how, on
prometheus-client's private layout, is prometheus_private.py's alone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

# the request path's writers, made here (prometheus_private.py: prometheus-client's internals) and named from here
from llm_gateway.observability.prometheus_private import inc as inc
from llm_gateway.observability.prometheus_private import loop_values
from llm_gateway.observability.prometheus_private import observe as observe
from llm_gateway.observability.prometheus_private import observe_many as observe_many
from llm_gateway.settings import PRIORITY_RANKS

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
MATCH_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class Metrics:
    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no *_created series: half the series count, nothing a dashboard reads
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "gateway_requests",
            "Requests answered, by public model, backend, engine, endpoint and outcome.",
            ["model", "backend", "engine", "endpoint", "status_class", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "gateway_request_duration_seconds",
            "Time from request to the last byte of the answer.",
            ["model", "backend", "endpoint"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "gateway_time_to_first_token_seconds",
            "Streams: time from the request to the first chunk carrying generated text.",
            ["model", "backend"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "gateway_inter_token_latency_seconds",
            "Streams: time between consecutive chunks from the engine.",
            ["model", "backend"],
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "gateway_prompt_tokens", "Prompt tokens, from the engines' usage.", ["model", "backend"], registry=r
        )
        self.completion_tokens = Counter(
            "gateway_completion_tokens",
            "Completion tokens, from the engines' usage (estimated for streams the engine cut before reporting usage).",
            ["model", "backend"],
            registry=r,
        )
        self.overhead = Histogram(
            "gateway_overhead_seconds",
            "Time spent in the gateway itself (the request minus waiting on engines).",
            ["endpoint"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "gateway_retries",
            "Attempts retried on another deployment, by the backend that failed and why.",
            ["model", "backend", "reason"],
            registry=r,
        )
        self.failovers = Counter(
            "gateway_failovers",
            "Requests answered by another deployment than the first choice.",
            ["model", "backend"],
            registry=r,
        )
        self.model_fallbacks = Counter(
            "gateway_model_fallbacks",
            "Requests served by a fallback model because every deployment of the requested one was unavailable.",
            ["model", "fallback"],
            registry=r,
        )
        self.ratelimit_rejections = Counter(
            "gateway_ratelimit_rejections", "Requests refused by a key's limits.", ["key", "limit"], registry=r
        )
        self.ratelimit_store_errors = Counter(
            "gateway_ratelimit_store_errors",
            "Rate-limit store calls that failed (the on_store_error policy applied).",
            registry=r,
        )
        self.ratelimit_store_up = Gauge(
            "gateway_ratelimit_store_up",
            "1 when the rate-limit store answers (always 1 for the memory store).",
            registry=r,
        )
        self.ratelimit_store_up.set(1)
        self.config_reloads = Counter("gateway_config_reloads", "Config reloads, by result.", ["result"], registry=r)
        for result in ("success", "failure"):  # both series exist from the start, so rate() and alerts work
            self.config_reloads.labels(result)
        self.config_last_reload = Gauge(
            "gateway_config_last_reload_success_timestamp_seconds", "When the running config was loaded.", registry=r
        )
        self.config_last_reload.set(time.time())
        self.probes = Counter("gateway_backend_probes", "Backend probes, by result.", ["backend", "result"], registry=r)
        # the usage ledger (observability/ledger.py): rows buffered behind the request path, written, dropped
        self.usage_rows_buffered = Gauge(
            "gateway_usage_rows_buffered", "Usage-ledger rows waiting to be written to the database.", registry=r
        )
        self.usage_rows_written = Counter(
            "gateway_usage_rows_written", "Usage-ledger rows written to the database.", registry=r
        )
        self.usage_rows_dropped = Counter(
            "gateway_usage_rows_dropped",
            "Usage-ledger rows lost: the buffer was full (database down or slow too long), or unwritten at shutdown.",
            ["reason"],
            registry=r,
        )
        for reason in ("buffer_full", "shutdown"):
            self.usage_rows_dropped.labels(reason)
        self.trace_spans_dropped = Counter(
            "gateway_trace_spans_dropped",
            "Trace spans not exported: the export queue was full (OTEL_BSP_MAX_QUEUE_SIZE), or the OTLP receiver "
            "failed their batch.",
            ["reason"],
            registry=r,
        )
        for reason in ("queue_full", "export_failed"):
            self.trace_spans_dropped.labels(reason)
        self.usage_flush_errors = Counter(
            "gateway_usage_flush_errors", "Usage-ledger writes that failed (the rows stay buffered).", registry=r
        )
        # what a crash (kill -9) can lose, and what the crash spool (observability/spool.py) brought back
        self.usage_requests_open = Gauge(
            "gateway_usage_requests_open",
            "Generation requests in flight whose ledger row is written when they end.",
            registry=r,
        )
        self.usage_rows_at_risk = Gauge(
            "gateway_usage_rows_at_risk",
            "Usage-ledger rows a crash now would lose: finished rows in neither the database nor the local spool, "
            "and requests in flight since the last checkpoint.",
            registry=r,
        )
        self.usage_rows_recovered = Counter(
            "gateway_usage_rows_recovered",
            "Usage-ledger rows written at start from the spool of a process that crashed: finished requests, and "
            "requests in flight at its last checkpoint (outcome interrupted).",
            ["kind"],
            registry=r,
        )
        for kind in ("finished", "interrupted"):
            self.usage_rows_recovered.labels(kind)
        self.usage_spool_errors = Counter(
            "gateway_usage_spool_errors", "Writes to the usage ledger's local crash spool that failed.", registry=r
        )
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # fair sharing of the queues (routing/admission.py): key names are the config's and the admin API's
        self.queue_wait = Histogram(
            "gateway_queue_wait_seconds",
            "Time requests waited in a deployment's queue, by priority class (those that waited at all).",
            ["priority"],
            registry=r,
            buckets=DURATION_BUCKETS,
        )
        for name in PRIORITY_RANKS:  # every class has its series from the start (a panel shows 0, not nothing)
            self.queue_wait.labels(name)
        self.admitted_tokens = Counter(
            "gateway_queue_admitted_tokens",
            "Estimated tokens (prompt + max output) admitted to deployments, by key and class: the fair share.",
            ["key", "priority"],
            registry=r,
        )
        # cache-aware routing (routing/prefix_cache.py): the share of each routed prompt the chosen engine was
        # sent before (what the gateway believes it holds; the engines' own counters are in routing/gauges.py)
        self.prefix_match = Histogram(
            "gateway_prefix_match_ratio",
            "cache_aware routes: share of the prompt's blocks the chosen deployment was sent before, per request.",
            ["model"],
            registry=r,
            buckets=MATCH_BUCKETS,
        )
        # engines' KV-cache events (routing/kv_events.py), per backend that names `kv_events`
        self.kv_events = Counter(
            "gateway_kv_events",
            "KV-cache events received from engines, by kind (BlockStored, BlockRemoved, AllBlocksCleared, restart, "
            "unreadable).",
            ["backend", "event"],
            registry=r,
        )
        self.engine_cached_tokens = Gauge(
            "gateway_engine_kv_cached_tokens",
            "Tokens the engine's prefix cache holds, by its KV-cache events (stored less evicted).",
            ["backend"],
            registry=r,
        )
        self.prefix_cache_source = Enum(
            "gateway_prefix_cache_source",
            "What cache_aware's record of the engine's prefix cache follows: its KV-cache events, or only what the "
            "gateway sent (approximate).",
            ["backend"],
            states=["approximate", "kv_events"],
            registry=r,
        )
        self.prompt_counts = Counter(
            "gateway_prompt_counts",
            "Exact prompt counts for the context-window fit (prompt_count.py), by result: counted, cached, failed.",
            ["result"],
            registry=r,
        )
        # the admin API (admin/gate.py): its traffic, and the admin keys it refused
        self.admin_requests = Counter(
            "gateway_admin_requests", "Admin API requests answered, by status class.", ["status_class"], registry=r
        )
        for status_class in ("2xx", "4xx", "5xx"):
            self.admin_requests.labels(status_class)
        self.admin_auth_failures = Counter(
            "gateway_admin_auth_failures",
            "Admin API requests refused for their admin key: missing_api_key or invalid_api_key.",
            ["reason"],
            registry=r,
        )
        for reason in ("missing_api_key", "invalid_api_key"):  # from the start, so an alert's rate() works
            self.admin_auth_failures.labels(reason)

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)` of a Counter or Histogram, cached (a dict lookup instead of prometheus-client's
        validation and lock), its values made lock-free (`prometheus_private.loop_values`): only the event loop's
        thread may update it."""
        key = (id(metric), labels)
        c = self._children.get(key)
        if c is None:
            c = metric.labels(*labels)
            loop_values(c)
            if len(self._children) < 100_000:  # labels are bounded (config names); this is a safety net
                self._children[key] = c
        return c

    def watch(self, collector: Collector) -> None:
        """Add a collector read at scrape time (the routing table's gauges: `routing/gauges.py`)."""
        self.registry.register(collector)

    def render(self, *, per_key: bool = True) -> bytes:
        """The exposition; without `per_key`, every series labelled by key is left out (the tenants' names and
        usage: what /metrics on the main port shows anyone, red-team L3)."""
        return generate_latest(self.registry if per_key else _WithoutKeys(self.registry))


class _WithoutKeys(Collector):
    """A registry's families less their samples labelled `key`; a family left with none is left out."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():  # each family is built afresh per collect: ours to trim
            if any("key" in s.labels for s in family.samples):
                family.samples = [s for s in family.samples if "key" not in s.labels]
                if not family.samples:
                    continue
            yield family
