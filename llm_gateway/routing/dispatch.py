"""Getting one request onto a deployment: candidates, selection, admission, retries, failover.

Candidates are the model's deployments that can serve the request at all and that it fits
(candidates.py; a 400 before any engine is called when no deployment of the model or its fallbacks
fits), then those that are routable now (backend not down or loading, breaker not open, model
present). Selection orders them; admission takes a slot (or queues for one, bounded); the exchange
runs. A failure that is the backend's (connection refused or reset, 502/503/504, engine queue full,
timeout) is retried on another deployment, bounded in count and time, with jittered backoff. The rule is
"before the engine's first byte was relayed", not "before the client's first byte": a stream that waited
in a queue has had its 200 and `: queued` comments, and is still retried, since nothing of the failed
attempt reached it (service.py answers only once an exchange succeeded). When every deployment of a model
is unavailable, the model's configured fallbacks are tried in order.
A request waits in a deployment's queue with its `Ticket` (key, class, estimated tokens: see
routing/admission.py for the order); the queue-wait budget (`queue_timeout_s`) is its own, apart from
the engine's timeouts, and a refusal says why (`x-gateway-reject-reason`) and when to come back
(`Retry-After`, from the queue's drain rate).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from llm_gateway.access.keys import Principal
from llm_gateway.errors import (
    BackendFailure,
    ConnectFailed,
    EngineErrorAnswer,
    GatewayError,
    NoHealthyBackend,
    Overloaded,
)
from llm_gateway.observability.metrics import Metrics, inc, observe
from llm_gateway.routing import prefix_cache, selection
from llm_gateway.routing.admission import ANONYMOUS, Ticket
from llm_gateway.routing.candidates import eligible, explain_ineligible, explain_too_long, fits, fits_in_any
from llm_gateway.routing.request_info import RequestInfo, affinity_key
from llm_gateway.routing.table import Deployment, ModelRoute, RoutingTable
from llm_gateway.settings import PRIORITY_RANKS, RoutingConfig

T = TypeVar("T")
REJECT_REASON_HEADER = "x-gateway-reject-reason"  # queue_full or queue_timeout, on a 429 from the queues
CLASS_NAMES = {rank: name for name, rank in PRIORITY_RANKS.items()}
Exchange = Callable[[Deployment, ModelRoute], Awaitable[T]]


@dataclass(slots=True)
class Trace:
    """What happened while dispatching, for metrics, headers and the access log."""

    deployment: Deployment | None = None
    route: ModelRoute | None = None
    attempts: int = 0
    waited_s: float = 0.0  # queueing and backoff: not the gateway's own overhead
    ticket: Ticket = ANONYMOUS  # whose request, its class and estimated tokens, for the queues
    rank: int = 1  # the request's class rank (for engines that schedule by priority)
    #: told (position, eta_s) when the request starts waiting in a queue and then every `progress_s`
    progress: Callable[[int, float | None], Awaitable[None]] | None = None
    progress_s: float = 1.0


def priority_rank(who: Principal, requested: bytes | None) -> int:
    """The request's class rank: the key's class, lowered (never raised) by the priority header."""
    rank = PRIORITY_RANKS.get(who.priority, 1)
    if requested:
        asked = PRIORITY_RANKS.get(requested.decode("latin-1").strip().lower())
        if asked is not None:
            rank = min(rank, asked)
    return rank


def ticket_for(who: Principal, rank: int, cost: int) -> Ticket:
    """The queue ticket of a request: its key, class and estimated tokens, with fair queuing or without (the
    queue's own mode decides the order; the ticket still says whose it is and its class, which is what the
    per-class metrics report and what a reserved slot is kept for)."""
    return Ticket(who.id, rank, float(max(cost, 1)), who.weight, who.name)


async def _wait_reporting(d: Deployment, trace: Trace) -> bool:
    """`wait_enter`, telling `trace.progress` the waiter's place when it queues and every `progress_s`."""
    assert trace.progress is not None
    joined: list[asyncio.Future[None]] = []
    task = asyncio.ensure_future(d.admission.wait_enter(d.backend.cfg.queue_timeout_s, trace.ticket, joined.append))
    try:
        await asyncio.sleep(0)  # let it queue (or enter)
        while not task.done():
            pos = d.admission.position(joined[0]) if joined else None
            if pos is not None:
                await trace.progress(pos, d.admission.eta_s(pos, trace.ticket.priority))
            await asyncio.wait({task}, timeout=trace.progress_s)
        return task.result()
    except BaseException:
        task.cancel()  # the client left (or the report failed): out of the queue at once
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise


def _refused(message: str, reason: str, deps: list[Deployment]) -> Overloaded:
    """429 queue_full, with a Retry-After from the queues' drain rate and the reason in a header."""
    wait = min(d.admission.retry_after_s() for d in deps) if deps else 1
    return Overloaded(message, headers={"retry-after": str(wait), REJECT_REASON_HEADER: reason})


# the engine lacks this route or model: a config mismatch for one endpoint, not ill health (its chat may
# work fine), so it must not open the breaker for every endpoint
ENDPOINT_MISMATCH = frozenset({"upstream_model_not_found", "upstream_not_supported"})


def judge(dep: Deployment, err: GatewayError, now: float) -> None:
    """Book an attempt's failure against the deployment's breaker and the backend's state: a failed
    connection marks the backend down at once, until a probe finds it up again."""
    b = dep.backend
    if isinstance(err, EngineErrorAnswer) and err.busy:
        b.busy_until = now + 1.0
        dep.breaker.neutral()
    elif isinstance(err, EngineErrorAnswer) and err.code in ENDPOINT_MISMATCH:
        dep.breaker.neutral()
    elif isinstance(err, BackendFailure) or (isinstance(err, EngineErrorAnswer) and err.status >= 500):
        dep.breaker.failure(now)
        if isinstance(err, ConnectFailed):
            b.state, b.detail = "down", err.message
    else:
        dep.breaker.success()  # the engine answered (a client error): it is alive


def release(dep: Deployment) -> None:
    dep.admission.leave()
    dep.backend.in_flight -= 1


class Dispatcher:
    def __init__(self, routing: RoutingConfig, metrics: Metrics, rng: random.Random | None = None) -> None:
        self.cfg = routing
        self.metrics = metrics
        self.rng = rng or random.Random()

    def _order(
        self, route: ModelRoute, deps: list[Deployment], info: RequestInfo, session: str | None
    ) -> list[Deployment]:
        if len(deps) == 1:
            return deps
        now = time.monotonic()
        interval = 0.0  # the longest probe interval among them (a loop: no generator per request)
        for d in deps:
            if d.backend.cfg.probe.interval_s > interval:
                interval = d.backend.cfg.probe.interval_s
        stale = self.cfg.stale_after_probes * interval
        views = [
            selection.CandidateView(
                d.key,
                d.backend.in_flight,
                d.capacity,
                d.backend.adapter.reports_load,
                d.backend.load,
                d.backend.own_at_probe,
                d.cfg.weight,
                d.cfg.priority,
                d.resident,
            )
            for d in deps
        ]
        key = None
        aff = route.cfg.affinity
        if route.cfg.strategy == "prefix_affinity":
            key = session or affinity_key(info.affinity_text, aff.prefix_chars)
        elif route.cfg.strategy == "cache_aware":
            prefix_cache.annotate(views, [d.prefixes for d in deps], info, session, aff, now)
        route.rotation += 1
        idx = selection.order(
            route.cfg.strategy,
            views,
            now=now,
            stale_s=stale,
            rotation=route.rotation,
            affinity_key=key,
            max_affinity_load=aff.max_load,
            rng=self.rng,
            prefer_resident=self.cfg.prefer_resident,
            fresh=info.fresh,
            load_weight=aff.load_weight,
            max_imbalance=aff.max_imbalance,
        )
        return [deps[i] for i in idx]

    async def _enter(self, ordered: list[Deployment], trace: Trace) -> Deployment:
        ticket = trace.ticket
        for d in ordered:
            if d.admission.try_enter(ticket):
                self._admitted(ticket)
                return d
        queueable = [d for d in ordered if d.admission.can_queue()]
        if not queueable:
            raise _refused(
                "every deployment of this model is at its concurrency limit and its wait queue is full",
                "queue_full",
                ordered,
            )
        d = min(queueable, key=lambda x: x.admission.queued)
        t = time.monotonic()
        if trace.progress is None:
            ok = await d.admission.wait_enter(d.backend.cfg.queue_timeout_s, ticket)
        else:
            ok = await _wait_reporting(d, trace)
        waited = time.monotonic() - t
        trace.waited_s += waited
        observe(self.metrics.child(self.metrics.queue_wait, CLASS_NAMES.get(ticket.priority, "default")), waited)
        if not ok:
            raise _refused(
                f"no slot of a deployment freed up within {d.backend.cfg.queue_timeout_s:g}s", "queue_timeout", [d]
            )
        self._admitted(ticket)
        return d

    def _admitted(self, ticket: Ticket) -> None:
        if ticket.key:
            inc(
                self.metrics.child(
                    self.metrics.admitted_tokens,
                    ticket.label or ticket.key,
                    CLASS_NAMES.get(ticket.priority, "default"),
                ),
                ticket.cost,
            )

    async def run(
        self,
        table: RoutingTable,
        route: ModelRoute,
        info: RequestInfo,
        session: str | None,
        exchange: Exchange[T],
        trace: Trace,
    ) -> T:
        """Run `exchange` on a deployment until one succeeds; on success the caller owns the slot
        (and must `release()` it and report to the breaker)."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.retry_budget_s
        groups = [route] + [r for f in route.cfg.fallbacks if (r := table.resolve(f)) is not None]
        last: GatewayError | None = None
        tried: set[int] = set()
        first_choice: Deployment | None = None
        for gi, group in enumerate(groups):
            static = eligible(group, info)
            if gi == 0 and not static:
                raise explain_ineligible(group, info)
            fitting = [d for d in static if fits(d, info)]
            if gi == 0 and not fitting and not fits_in_any(groups[1:], info):
                raise explain_too_long(group, static, info)
            static = fitting
            while True:
                now = time.monotonic()
                live = [
                    d
                    for d in static
                    if id(d) not in tried and d.backend.routable() and d.breaker.available(now) and d.model_present()
                ]
                if not live:
                    break
                ordered = self._order(group, live, info, session)
                if first_choice is None:
                    first_choice = ordered[0]
                dep = await self._enter(ordered, trace)
                tried.add(id(dep))
                if not dep.breaker.acquire(time.monotonic()):
                    dep.admission.leave()
                    continue
                if group.cfg.strategy == "cache_aware":  # what its engine now holds, and how much it held
                    share = prefix_cache.placed(dep.prefixes, info, session, group.cfg.affinity, time.monotonic())
                    observe(self.metrics.child(self.metrics.prefix_match, group.name), share)
                dep.backend.in_flight += 1
                trace.attempts += 1
                trace.deployment, trace.route = dep, group
                try:
                    result = await exchange(dep, group)
                except GatewayError as e:
                    release(dep)
                    judge(dep, e, time.monotonic())
                    if not e.retryable:
                        raise
                    last = e
                    if trace.attempts > cfg.retries or time.monotonic() >= deadline:
                        raise
                    if not _more_to_try(groups, gi, static, tried, info):
                        raise  # nothing left to retry on: answer now, without a pause or a retry counted
                    pause = self.rng.uniform(0, cfg.backoff_base_ms * (2 ** (trace.attempts - 1))) / 1000
                    if time.monotonic() + pause >= deadline:
                        raise  # the pause would spend the budget, and no attempt may start once it is spent
                    self.metrics.retries.labels(route.name, dep.backend.name, type(e).__name__).inc()
                    if pause > 0:
                        trace.waited_s += pause
                        await asyncio.sleep(pause)
                    continue
                except BaseException:
                    release(dep)
                    dep.breaker.neutral()
                    raise
                if dep is not first_choice:
                    self.metrics.failovers.labels(route.name, dep.backend.name).inc()
                if gi > 0:
                    self.metrics.model_fallbacks.labels(route.name, group.name).inc()
                return result
        if last is not None:
            raise last
        raise NoHealthyBackend(
            f"no healthy backend for model '{route.name}': " + _why_unavailable(groups[0], time.monotonic()),
            headers={"retry-after": "2"},
        )


def _more_to_try(
    groups: list[ModelRoute], gi: int, static: list[Deployment], tried: set[int], info: RequestInfo
) -> bool:
    """Is any deployment left that a retry could go to (in this model, or a later fallback)?"""
    now = time.monotonic()
    for d in static:
        if id(d) not in tried and d.backend.routable() and d.breaker.available(now) and d.model_present():
            return True
    return any(id(d) not in tried and fits(d, info) for g in groups[gi + 1 :] for d in eligible(g, info))


def _why_unavailable(route: ModelRoute, now: float) -> str:
    parts = []
    for d in route.deployments:
        b = d.backend
        if not b.routable():
            parts.append(f"backend '{b.name}' is {b.state}" + (f" ({b.detail})" if b.detail else ""))
        elif not d.breaker.available(now):
            parts.append(f"backend '{b.name}': circuit breaker open after {d.breaker.failures} failures")
        elif not d.model_present():
            parts.append(f"backend '{b.name}' does not list model '{d.upstream_model}'")
    return "; ".join(parts) or "every deployment is busy or failed"
