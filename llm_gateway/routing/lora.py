"""LoRA adapters as models: loading a model's adapter on the replica a request went to, and making room for it.

A model's adapter (settings `models[].adapters`) is a model of its own, `<model>:<adapter>`, whose deployments
are the model's on engines that serve adapters (routing/table.py). Selection sends its request to a replica
that holds the adapter already: such a deployment counts as resident, one that would load it as a cold load
(routing/selection.py), so a loaded adapter's replica is chosen until it is saturated. Once dispatch has a
deployment, `LoraPlacer.acquire` makes sure its engine holds the adapter (routing/lora_book.py's rules):
- held: the request pins it (in flight) and goes on;
- being loaded by another request: it waits for that load;
- not held, and room on the engine (`max_adapters`): loaded through the engine's API (adapters/lora.py);
- no room: the least recently used idle adapter is unloaded first; with every one busy, the request waits
  for one to be idle, within its deployment's queue timeout (then 429 `queue_timeout`).
A failed load is the attempt's failure (`AdapterLoadFailed`, 502): dispatch retries it on another replica.
The pin is the attempt's, given back when the attempt is released. An engine that answers that it does not
know the adapter (it restarted) has it forgotten, so the next request loads it again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily, Metric

from llm_gateway.errors import AdapterLoadFailed, Overloaded
from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.lora_book import Held, has_room, victim
from llm_gateway.routing.managed_api import BackendLoaderClient
from llm_gateway.routing.table import Deployment, RoutingTable
from llm_gateway.types import LoraCall
from llm_gateway.upstream.base import UpstreamClient

log = logging.getLogger("gateway.lora")
CALL_TIMEOUT_S = 120.0  # one load or unload call (vLLM reads the adapter from disk)
REJECT_REASON_HEADER = "x-gateway-reject-reason"


class LoraMetrics:
    """Adapter loads, load failures and unloads (why) per backend and adapter; resident adapters at scrape time."""

    def __init__(self, metrics: Metrics, table: Callable[[], RoutingTable]) -> None:
        r = metrics.registry
        labels = ["backend", "adapter"]
        self.loads = Counter("gateway_lora_loads", "LoRA adapters loaded on an engine.", labels, registry=r)
        self.failures = Counter("gateway_lora_load_failures", "LoRA adapter loads that failed.", labels, registry=r)
        self.unloads = Counter(
            "gateway_lora_unloads", "LoRA adapters unloaded, by reason.", [*labels, "reason"], registry=r
        )
        self._table = table
        metrics.watch(self)

    def describe(self) -> list[Metric]:
        return []  # (read at scrape time: the table may not exist yet when registered)

    def collect(self) -> list[Metric]:
        g = GaugeMetricFamily(
            "gateway_lora_resident", "1: the engine holds the LoRA adapter.", labels=["backend", "adapter"]
        )
        for b in self._table().backends.values():
            for name in b.loras.resident():
                g.add_metric([b.name, name], 1.0)
        return [g]


class LoraPlacer:
    def __init__(self, upstream: Callable[[], UpstreamClient], metrics: Callable[[], LoraMetrics]) -> None:
        self.upstream = upstream
        self._make_metrics = metrics
        self._metrics: LoraMetrics | None = None  # registered with the first adapter asked for

    @property
    def metrics(self) -> LoraMetrics:
        """The LoRA metric families, registered on first use: a gateway that serves no adapters exports none
        (an empty family would be a series nobody can ever see move)."""
        if self._metrics is None:
            self._metrics = self._make_metrics()
        return self._metrics

    async def acquire(self, dep: Deployment, timeout_s: float) -> LoraCall:
        """Make sure `dep`'s engine holds its adapter, pinned for this request (the caller unpins it through its
        attempt). Raises AdapterLoadFailed, or Overloaded when no room came free within `timeout_s`."""
        a, b = dep.adapter, dep.backend
        driver = b.adapter.lora
        assert a is not None and driver is not None
        book = b.loras
        limit = book.limit if driver.runtime else None  # an engine's start-up adapters take no room
        deadline = time.monotonic() + timeout_s
        client = BackendLoaderClient(self.upstream, b, CALL_TIMEOUT_S)
        while True:
            now = time.monotonic()
            h = book.held.get(a.name)
            if h is not None and h.state == "ready":
                book.pin(h, now)
                return LoraCall(a.name, h.engine_id, a.scale)
            if h is not None:  # loading or unloading: wait for it, then look again
                await _wait(h, deadline)
                if h.error is not None and h.state == "loading":
                    raise AdapterLoadFailed(h.error, backend=b.name)
                continue
            if has_room(len(book.held), limit):
                h = book.held[a.name] = Held(a.name)
                t0 = time.monotonic()
                try:
                    h.engine_id = await driver.load(client, a.name, a.path)
                except Exception as e:  # LoadFailed, the upstream client's failures, a timeout
                    h.error = f"backend '{b.name}' could not load LoRA adapter '{a.name}': {e}"
                    del book.held[a.name]
                    self.metrics.failures.labels(b.name, a.name).inc()
                    log.error("%s", h.error)
                    raise AdapterLoadFailed(h.error, backend=b.name) from None
                finally:
                    h.done.set()
                    book.notify()
                h.state = "ready"
                self.metrics.loads.labels(b.name, a.name).inc()
                log.info("LoRA adapter %s loaded on %s in %.2fs", a.name, b.name, time.monotonic() - t0)
                continue
            v = victim(book.held.values())
            if v is None:  # every adapter busy: wait for one to finish
                if not await book.changed(deadline - now):
                    raise Overloaded(
                        f"backend '{b.name}' holds {limit} LoRA adapters, each with requests in flight, "
                        f"and none came free within {timeout_s:g}s",
                        headers={"retry-after": "1", REJECT_REASON_HEADER: "queue_timeout"},
                    )
                continue
            await self._unload(client, dep, v, "evicted")
            book.notify()

    async def _unload(self, client: BackendLoaderClient, dep: Deployment, h: Held, reason: str) -> None:
        """The engine's unload call; a failure is logged (the adapter counts as gone: the engine may still hold
        it in its own cache, which its own limit bounds)."""
        b = dep.backend
        driver = b.adapter.lora
        assert driver is not None
        h.state, h.done = "unloading", asyncio.Event()
        try:
            await driver.unload(client, h.name)
        except Exception as e:
            log.warning("LoRA adapter %s: unload from %s failed: %s", h.name, b.name, e)
        finally:
            b.loras.held.pop(h.name, None)
            h.done.set()
            self.metrics.unloads.labels(b.name, h.name, reason).inc()
            log.info("LoRA adapter %s unloaded from %s (%s)", h.name, b.name, reason)


async def _wait(h: Held, deadline: float) -> None:
    try:
        async with asyncio.timeout(max(deadline - time.monotonic(), 0.0)):
            await h.done.wait()
    except TimeoutError:
        raise Overloaded(
            f"LoRA adapter '{h.name}' was still {h.state} when the queue timeout ran out",
            headers={"retry-after": "1", REJECT_REASON_HEADER: "queue_timeout"},
        ) from None
