"""Getting one request onto a deployment: candidates, selection, admission, retries, failover.

Candidates are the model's deployments that can serve the request at all and that it fits
(candidates.py; a 400 before any engine is called when no deployment of the model or its fallbacks
fits), then those that are routable now (backend not down or loading, breaker not open, model
present). Selection orders them; admission takes a slot (or queues for one, bounded); the exchange
runs. A failure that is the backend's (connection refused or reset, 502/503/504, engine queue full,
timeout) is retried on another deployment, bounded in count and time, with jittered backoff. The rule is
"before the engine's first byte was relayed", not "before the client's first byte": a stream that waited
in a queue has had its 200 and `: queued` comments, and is still retried, since nothing of the failed
attempt reached it (service/pipeline.py answers only once an exchange succeeded). When every deployment of a
model is unavailable, the model's configured fallbacks are tried in order.
Each try is an `Attempt` (attempt.py) that holds the deployment's slot and reports to its breaker once; a
failed one is reported and released here, the one that succeeded is handed to the caller. The request is
read through `Dispatched` (service/request.py's `Job`), which is told each attempt and each wait.
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
from typing import Protocol, TypeVar

from llm_gateway.access.keys import Principal
from llm_gateway.errors import GatewayError, NoHealthyBackend, Overloaded
from llm_gateway.observability.metrics import Metrics, inc, observe
from llm_gateway.routing import prefix_cache, selection
from llm_gateway.routing.admission import Ticket
from llm_gateway.routing.attempt import Attempt
from llm_gateway.routing.candidates import eligible, explain_ineligible, explain_too_long, fits, fits_in_any
from llm_gateway.routing.lora import LoraPlacer
from llm_gateway.routing.placements import SessionPlacements
from llm_gateway.routing.request_info import RequestInfo, affinity_key
from llm_gateway.routing.table import Deployment, ModelRoute, RoutingTable
from llm_gateway.settings import CLASS_NAMES, PRIORITY_RANKS, RoutingConfig

T = TypeVar("T")
REJECT_REASON_HEADER = "x-gateway-reject-reason"  # queue_full or queue_timeout, on a 429 from the queues
Exchange = Callable[[Attempt], Awaitable[T]]


Progress = Callable[[int, float | None], Awaitable[None]]


class Dispatched(Protocol):
    """One request as dispatch sees it (service/request.py's `Job`): what it asks, whose it is, and where
    what happens to it is told."""

    @property
    def route(self) -> ModelRoute:
        """The public model it asked for."""

    @property
    def info(self) -> RequestInfo: ...

    @property
    def who(self) -> Principal:
        """Its key: the owner, weight and class of its queue ticket."""

    @property
    def budget(self) -> int:
        """The tokens it may spend: its ticket's estimated cost."""

    @property
    def asked_priority(self) -> bytes | None:
        """The class the client asked for: it may lower its key's class, never raise it."""

    @property
    def progress(self) -> Progress | None:
        """Told (position, eta_s) when it starts waiting in a queue, then every `progress_s`; None: not told."""

    @property
    def progress_s(self) -> float: ...

    def session(self) -> str | None:
        """The client's session id, for prefix affinity."""

    def took(self, attempt: Attempt) -> None:
        """An attempt starts (the last one taken is the request's)."""

    def waited(self, seconds: float) -> None:
        """Time spent in a queue or a backoff pause: not the gateway's own overhead."""


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


async def _wait_reporting(d: Deployment, ticket: Ticket, job: Dispatched) -> bool:
    """`wait_enter`, telling `job.progress` the waiter's place when it queues and every `progress_s`."""
    progress = job.progress
    assert progress is not None
    joined: list[asyncio.Future[None]] = []
    task = asyncio.ensure_future(d.admission.wait_enter(d.backend.cfg.queue_timeout_s, ticket, joined.append))
    try:
        await asyncio.sleep(0)  # let it queue (or enter)
        while not task.done():
            pos = d.admission.position(joined[0]) if joined else None
            if pos is not None:
                await progress(pos, d.admission.eta_s(pos, ticket.priority))
            await asyncio.wait({task}, timeout=job.progress_s)
        return task.result()
    except BaseException:
        task.cancel()  # the client left (or the report failed): out of the queue at once
        with contextlib.suppress(asyncio.CancelledError):
            if await task:  # it had entered already (the slot came as the client left): the slot goes back
                d.admission.leave()
        raise


def _refused(message: str, reason: str, deps: list[Deployment]) -> Overloaded:
    """429 queue_full, with a Retry-After from the queues' drain rate and the reason in a header."""
    wait = min(d.admission.retry_after_s() for d in deps) if deps else 1
    return Overloaded(message, headers={"retry-after": str(wait), REJECT_REASON_HEADER: reason})


#: the strategies that place a request by its session (routing/session_key.py)
SESSION_STRATEGIES = frozenset(("prefix_affinity", "cache_aware"))


class Dispatcher:
    def __init__(
        self,
        routing: RoutingConfig,
        metrics: Metrics,
        rng: random.Random | None = None,
        placements: SessionPlacements | None = None,
        loras: LoraPlacer | None = None,
    ) -> None:
        self.cfg = routing
        self.metrics = metrics
        self.rng = rng or random.Random()
        self.placements = placements  # cache_aware's placements shared by the replicas (routing/placements.py)
        self.loras = loras  # loads a model's LoRA adapter where a request needs it (routing/lora.py)

    def _order(
        self,
        route: ModelRoute,
        deps: list[Deployment],
        info: RequestInfo,
        session: str | None,
        assigned: str | None = None,
    ) -> list[Deployment]:
        """`session`: cache_aware's placement key; `assigned`: the deployment the shared record places it on."""
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
            key = session
            if assigned is not None:
                for d, v in zip(deps, views, strict=True):
                    v.assigned = d.key == assigned
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
            spread_new=aff.new_conversations != "hash",
        )
        return [deps[i] for i in idx]

    async def _enter(self, ordered: list[Deployment], ticket: Ticket, job: Dispatched) -> Deployment:
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
        if job.progress is None:
            ok = await d.admission.wait_enter(d.backend.cfg.queue_timeout_s, ticket)
        else:
            ok = await _wait_reporting(d, ticket, job)
        waited = time.monotonic() - t
        job.waited(waited)
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

    async def run(self, table: RoutingTable, job: Dispatched, exchange: Exchange[T]) -> tuple[Attempt, T]:
        """Run `exchange` on a deployment until one succeeds, each try an `Attempt` (told to `job.took`).
        A failed attempt is reported and released here; the one that succeeded is returned with the
        exchange's result: the caller's, its slot taken until the caller's `release()`."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.retry_budget_s
        route, info, who = job.route, job.info, job.who
        ticket = ticket_for(who, priority_rank(who, job.asked_priority), job.budget)
        groups = [route] + [r for f in route.cfg.fallbacks if (r := table.resolve(f)) is not None]
        # the session key is read only where a strategy uses it (five headers and two body fields otherwise)
        uses = route.cfg.strategy in SESSION_STRATEGIES or any(g.cfg.strategy in SESSION_STRATEGIES for g in groups[1:])
        session = job.session() if uses else None
        last: GatewayError | None = None
        tried: set[int] = set()
        first_choice: Deployment | None = None
        attempts = 0
        for gi, group in enumerate(groups):
            static = eligible(group, info)
            if gi == 0 and not static:
                raise explain_ineligible(group, info)
            fitting = [d for d in static if fits(d, info)]
            if gi == 0 and not fitting and not fits_in_any(groups[1:], info):
                raise explain_too_long(group, static, info)
            static = fitting
            # cache_aware: the placement key (session, else first question's block key), the shared placement
            place = assigned = None
            if group.cfg.strategy == "cache_aware":
                place = session or prefix_cache.anchor_key(info, group.cfg.affinity.block_bytes)
                if place is not None and self.placements is not None:
                    assigned = await self.placements.get(group.name, place)
            while True:
                now = time.monotonic()
                live = [
                    d
                    for d in static
                    if id(d) not in tried and d.backend.routable() and d.breaker.available(now) and d.model_present()
                ]
                if not live:
                    break
                ordered = self._order(
                    group, live, info, place if group.cfg.strategy == "cache_aware" else session, assigned
                )
                if first_choice is None:
                    first_choice = ordered[0]
                entered = time.monotonic()
                dep = await self._enter(ordered, ticket, job)
                tried.add(id(dep))
                if dep.backend.managed is not None:
                    await _await_managed(dep, job, entered)
                if not dep.breaker.acquire(time.monotonic()):
                    dep.admission.leave()
                    continue
                if group.cfg.strategy == "cache_aware":  # what its engine now holds, and how much it held
                    others = [d.prefixes for d in static if d is not dep]  # no longer count this conversation
                    share = prefix_cache.placed(dep.prefixes, others, info, place, group.cfg.affinity, time.monotonic())
                    observe(self.metrics.child(self.metrics.prefix_match, group.name), share)
                    if place is not None and self.placements is not None and dep.key != assigned:
                        await self.placements.put(group.name, place, dep.key, group.cfg.affinity.ttl_s)
                        assigned = dep.key
                attempt = Attempt(dep, group, ticket)
                adapter = dep.backend.adapter
                if place is not None and adapter.slot_field is not None and group.cfg.affinity.engine_slots:
                    attempt.slot = dep.slots.take(place, adapter.slot_count)
                attempts += 1
                job.took(attempt)
                try:
                    if dep.adapter is not None and self.loras is not None:  # its engine must hold the adapter
                        t = time.monotonic()
                        attempt.lora = await self.loras.acquire(dep, dep.backend.cfg.queue_timeout_s)
                        job.waited(time.monotonic() - t)  # a load is a wait, not the gateway's overhead
                    result = await exchange(attempt)
                except GatewayError as e:
                    attempt.failed(e)
                    attempt.release()
                    if attempt.lora is not None and e.code == "upstream_model_not_found":
                        dep.backend.loras.forget(attempt.lora.name)  # the engine lost it (a restart): load it again
                    if not e.retryable:
                        raise
                    last = e
                    if attempts > cfg.retries or time.monotonic() >= deadline:
                        raise
                    if not _more_to_try(groups, gi, static, tried, info):
                        raise  # nothing left to retry on: answer now, without a pause or a retry counted
                    pause = self.rng.uniform(0, cfg.backoff_base_ms * (2 ** (attempts - 1))) / 1000
                    if time.monotonic() + pause >= deadline:
                        raise  # the pause would spend the budget, and no attempt may start once it is spent
                    self.metrics.retries.labels(route.name, dep.backend.name, type(e).__name__).inc()
                    if pause > 0:
                        job.waited(pause)
                        await asyncio.sleep(pause)
                    continue
                except BaseException:
                    attempt.release()  # the client left (cancelled), or a bug: nothing learnt of the backend
                    raise
                if dep is not first_choice:
                    self.metrics.failovers.labels(route.name, dep.backend.name).inc()
                if gi > 0:
                    self.metrics.model_fallbacks.labels(route.name, group.name).inc()
                return attempt, result
        if last is not None:
            raise last
        raise NoHealthyBackend(
            f"no healthy backend for model '{route.name}': " + _why_unavailable(groups[0], time.monotonic()),
            headers={"retry-after": "2"},
        )


async def _await_managed(dep: Deployment, job: Dispatched, entered: float) -> None:
    """A managed engine (routing/managed.py) may have to start first: wait at its gate, within what is left of
    the queue-wait budget; the admission slot taken is given back if that fails."""
    assert dep.backend.managed is not None
    timeout = dep.backend.cfg.queue_timeout_s
    t = time.monotonic()
    try:
        ok = await dep.backend.managed.gate(timeout - (t - entered), job.progress, job.progress_s)
    except BaseException:
        dep.admission.leave()
        raise
    job.waited(time.monotonic() - t)
    if not ok:
        dep.admission.leave()
        raise _refused(f"the model's engine was not ready within {timeout:g}s", "queue_timeout", [dep])


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
