"""One attempt of a request on one deployment: the slot it holds and what the breaker learns of it.

Dispatch (dispatch.py) takes a deployment's slot (a place in its admission, one in its backend's
in-flight count, the breaker's permission: the half-open trial, when the breaker is half open) and hands
the exchange an `Attempt` that owns them. Whatever ends the attempt, the slot is freed exactly once
(`release`) and the breaker is told exactly once how it went: `ok`, `failed` (before any output: the
engine's failure judged as dispatch judges it), `ended` (a stream that relayed output ended, perhaps cut
by an error), or `left` (the client went away: the backend's health is not in question). The first report
counts and later ones are ignored, so a late `left` can never clear another request's half-open trial;
a release with no report says `left`. Dispatch frees a failed attempt itself; an attempt that succeeded
is the caller's to release (service/pipeline.py), after its answer, and `settle` corrects the key's
fair-share counter in the deployment's queue with what the request really used.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from llm_gateway.errors import BackendFailure, ConnectFailed, EngineErrorAnswer, GatewayError
from llm_gateway.routing.admission import Ticket
from llm_gateway.routing.table import Deployment, ModelRoute
from llm_gateway.types import LoraCall

if TYPE_CHECKING:
    from llm_gateway.observability.tracing import AttemptTrace

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


class Attempt:
    """One try on `deployment` (of `route`: the model or the fallback it belongs to), holding its slot from
    creation until `release`."""

    __slots__ = ("_held", "_open", "deployment", "lora", "route", "slot", "ticket", "trace")

    def __init__(self, deployment: Deployment, route: ModelRoute, ticket: Ticket) -> None:
        """Taken: the caller has its admission slot and the breaker's permission; the backend counts it."""
        self.deployment = deployment
        self.route = route
        self.ticket = ticket  # whose request, its class and estimated tokens (the queues' order)
        self._held = True  # the slot: admission place and in-flight count
        self._open = True  # the breaker not told yet
        self.trace: AttemptTrace | None = None  # its span, where the request is traced (service/request.py)
        self.slot: int | None = None  # the engine slot it asks for (routing/slots.py), given back on release
        self.lora: LoraCall | None = (
            None  # the LoRA adapter it pinned on its engine (routing/lora.py), unpinned on release
        )
        deployment.backend.in_flight += 1

    def ok(self) -> None:
        """The engine answered."""
        if self._open:
            self._open = False
            self.deployment.breaker.success()

    def failed(self, err: GatewayError) -> None:
        """The attempt failed before any output reached the client: judged (`judge`)."""
        if self._open:
            self._open = False
            judge(self.deployment, err, time.monotonic())
            if self.trace is not None:
                self.trace.failed(err)

    def ended(self, err: GatewayError | None) -> None:
        """A stream that relayed output ended, cleanly (`err` None) or cut by `err`: an engine's server
        error (5xx: a reset, a timeout, an error event) is a failure, anything else a success."""
        if self._open:
            self._open = False
            if err is None or err.status < 500:
                self.deployment.breaker.success()
            else:
                self.deployment.breaker.failure(time.monotonic())

    def left(self) -> None:
        """The client went away (or the attempt ended otherwise): nothing learnt of the backend."""
        if self._open:
            self._open = False
            self.deployment.breaker.neutral()

    def release(self) -> None:
        """Free the slot (once: later calls do nothing); an attempt not reported on is reported `left`."""
        if self._held:
            self._held = False
            if self._open:
                self.left()
            dep = self.deployment
            dep.admission.leave()
            dep.backend.in_flight -= 1
            if self.slot is not None:
                dep.slots.give_back(self.slot)
            if self.lora is not None:
                dep.backend.loras.unpin(self.lora.name, time.monotonic())
            if self.trace is not None:
                self.trace.end()

    @property
    def released(self) -> bool:
        return not self._held

    def settle(self, actual_tokens: int | None) -> None:
        """Correct the key's fair-share counter in this deployment's queue with the tokens the request
        really used (None: keep the estimate)."""
        self.deployment.admission.settle(self.ticket, actual_tokens)
