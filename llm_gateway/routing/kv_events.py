"""What an engine's own KV-cache events say about its prefix cache, for `cache_aware` routing's record of it.

vLLM and SGLang publish their prefix cache's changes over ZeroMQ when started with `--kv-events-config`
(vLLM `vllm/distributed/kv_events.py` @0181ea31, SGLang `python/sglang/srt/disaggregation/kv_events.py`
@006d053f): a PUB socket sends `(topic, seq, payload)` frames, the payload a msgpack `KVEventBatch` of
`BlockStored` (block hashes, their tokens, `block_size`), `BlockRemoved` (hashes) and `AllBlocksCleared`.
vLLM encodes each event as a map with a `type` tag, SGLang as an array whose first item is the tag; a batch
is `[ts, events(, data_parallel_rank)]` (or a map of those). vLLM also names its publisher at
`GET /kv_event_sources` (one entry per data-parallel rank).

What the gateway takes from them: the blocks are hashes of token ids, and the gateway does not tokenize
(matching a prompt to the engine's blocks would need the engine's tokenizer and chat template on the request
path: README, "Cache-aware routing"). So the prefix match stays the record of what the gateway sent
(prefix_cache.py), and the events keep that record honest: an `AllBlocksCleared`, or a publisher whose
sequence starts again (the engine restarted), empties it; the tokens the engine evicts (`BlockRemoved`)
age the same share out of it, oldest first, in place of the configured cache size's guess alone. Each
backend whose config names `kv_events` gets one `KvEventFeed`: a daemon thread with a SUB socket that
decodes batches and adds to an `EngineKv`'s counters (one writer; the event loop only reads them, in
prefix_cache.settle, so nothing is shared but ints). `/readyz` and `gateway_prefix_cache_source` say per
backend which the record follows: `kv_events` once a batch arrived, else `approximate`.

pyzmq and msgspec are the `kv-events` extra, imported only when a backend names `kv_events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable

from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.engine_kv import EngineKv
from llm_gateway.routing.prober import BackendProbeClient
from llm_gateway.routing.table import Backend, RoutingTable
from llm_gateway.upstream.base import UpstreamClient

log = logging.getLogger("gateway.kv_events")

POLL_MS = 250  # how long the feed's thread waits for a frame before it looks at its stop flag
DISCOVER_S = 5.0  # between tries to read the engine's /kv_event_sources while it is not up


class KvEventFeed:
    """One engine's events: a daemon thread subscribed to its publishers, adding to `state`."""

    def __init__(self, backend: str, endpoints: Iterable[str], metrics: Metrics, state: EngineKv) -> None:
        self.backend = backend
        self.state = state
        state.endpoints = tuple(endpoints)
        self._metrics = metrics
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-events-{backend}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        import msgspec
        import zmq

        decode = msgspec.msgpack.Decoder().decode
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        sock = ctx.socket(zmq.SUB)
        events = self._metrics.kv_events
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SUBSCRIBE, b"")
            for ep in self.state.endpoints:
                sock.connect(ep)
            self._metrics.prefix_cache_source.labels(self.backend).state("approximate")
            while not self._stop.is_set():
                if not sock.poll(POLL_MS):
                    continue
                frames = sock.recv_multipart(zmq.NOBLOCK)
                if len(frames) < 3:
                    events.labels(self.backend, "unreadable").inc()
                    continue
                try:
                    payload = decode(frames[-1])
                except msgspec.DecodeError:
                    events.labels(self.backend, "unreadable").inc()
                    continue
                first = not self.state.batches
                for kind, n in self.state.apply(int.from_bytes(frames[-2], "big", signed=True), payload).items():
                    events.labels(self.backend, kind).inc(n)
                self._metrics.engine_cached_tokens.labels(self.backend).set(self.state.cached_tokens)
                if first and self.state.batches:
                    self._metrics.prefix_cache_source.labels(self.backend).state("kv_events")
                    log.info("backend %s: the prefix cache record follows the engine's KV events", self.backend)
        except Exception:  # the feed is an aid: routing goes on with the record alone
            log.exception("backend %s: KV events feed stopped", self.backend)
        finally:
            sock.close(0)


class KvEvents:
    """The feeds of the table's backends that name `kv_events` (the composition root syncs it after each reload,
    as it does the prober): one per backend, stopped when the backend goes or its `kv_events` changes."""

    def __init__(self, upstream: Callable[[], UpstreamClient], metrics: Metrics) -> None:
        self._upstream = upstream
        self._metrics = metrics
        self._feeds: dict[str, tuple[Backend, str, asyncio.Task[None]]] = {}
        self._threads: dict[str, KvEventFeed] = {}

    def sync(self, table: RoutingTable) -> None:
        for name, (b, setting, task) in list(self._feeds.items()):
            now = table.backends.get(name)
            if now is not b or now.cfg.kv_events != setting:
                task.cancel()
                feed = self._threads.pop(name, None)
                if feed is not None:
                    feed.stop()
                del self._feeds[name]
        loop = asyncio.get_running_loop()
        for name, b in table.backends.items():
            wanted = b.cfg.kv_events
            if wanted is None:
                b.kv = None
                continue
            if name in self._feeds:
                continue
            b.kv = EngineKv()  # a new feed starts from nothing: the record is followed from its first batch
            self._feeds[name] = (b, wanted, loop.create_task(self._follow(b, wanted), name=f"kv-events-{name}"))
        for route in table.models:
            for d in route.deployments:
                d.prefixes.engine = d.backend.kv

    async def _follow(self, b: Backend, setting: str) -> None:
        """Find the engine's publishers (`auto`: ask it until it answers), then start the feed's thread."""
        if setting == "auto":
            while True:
                endpoints = await self._discover(b)
                if endpoints:
                    break
                await asyncio.sleep(DISCOVER_S)
        else:
            endpoints = (setting,)
        assert b.kv is not None  # sync set it, and the records of b's deployments hold it
        feed = KvEventFeed(b.name, endpoints, self._metrics, b.kv)
        self._threads[b.name] = feed
        feed.start()

    async def _discover(self, b: Backend) -> tuple[str, ...]:
        try:
            found = await b.adapter.kv_event_endpoints(BackendProbeClient(self._upstream(), b))
        except Exception as e:  # not up yet: the next try
            log.debug("backend %s: KV event sources: %s", b.name, type(e).__name__)
            return ()
        return found or ()

    async def aclose(self, timeout_s: float = 2.0) -> None:
        for _, _, task in self._feeds.values():
            task.cancel()
        for _, _, task in self._feeds.values():
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        feeds = list(self._threads.values())
        for f in feeds:
            f.stop()
        deadline = time.monotonic() + timeout_s
        for f in feeds:
            await asyncio.to_thread(f.join, max(0.0, deadline - time.monotonic()))
        self._feeds.clear()
        self._threads.clear()
