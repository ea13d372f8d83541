"""One generation request on its way through the service's steps: what it asked, whose it is, where it
went so far. The service (pipeline.py) creates it; dispatch (routing/dispatch.py) reads it as its
`Dispatched` and tells it each attempt and each wait; the relay loop (stream.py) answers with it.

It is the request's one state: the attempt it holds now (the deployment, its slot and breaker report:
routing/attempt.py) and its record (observability/record.py), which is where the facts of the request
that outlive it (attempts, waits, backend, overhead) are written, each once, by the methods below:
nothing keeps a copy to be carried over later. The adapter's view of one attempt is a `CallContext`
(types.py), built from the two per attempt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from llm_gateway.access.keys import Principal
from llm_gateway.exchange import ClientExchange, Headers, NativeDialect
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.attempt import Attempt
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.session_key import session_of
from llm_gateway.routing.table import ModelRoute
from llm_gateway.service.queue_progress import QueueProgress
from llm_gateway.service.runtime import Runtime
from llm_gateway.types import NO_ADAPTER, CallContext, Endpoint


@dataclass(slots=True)
class Job:
    """One generation request on its way through the steps."""

    call: ClientExchange
    rec: RequestRecord
    rt: Runtime
    endpoint: Endpoint
    body: dict[str, Any]
    route: ModelRoute
    info: RequestInfo
    quota: Headers  # x-ratelimit-* for every answer
    who: Principal  # whose request: its key's class and weight order the queues
    budget: int  # the tokens it may spend (prompt and output): its estimated cost in the queues
    asked_priority: bytes | None  # the class the client asked for (its priority header)
    native: NativeDialect | None = None  # the client's own body, for engines that speak its API
    #: the completion tokens (all choices together) the key's reservation allows, where its limits count
    #: tokens: a stream that relays more is ended there (stream.py); None: not held
    output_cap: int | None = None
    #: the attempt taken last (dispatch's): the one that answers, or the last that failed; None: none yet
    attempt: Attempt | None = None
    #: a stream's place in a queue, told while it waits; once `started`, its answer has begun
    progress: QueueProgress | None = None
    progress_s: float = 1.0

    # -- what dispatch reads and tells (routing/dispatch.py:Dispatched) --------------------------------
    def session(self) -> str | None:
        return session_of(self.call.header, self.rt.session_header, self.body)  # agents' ids too (issue 37)

    def took(self, attempt: Attempt) -> None:
        self.attempt = attempt
        dep, rec = attempt.deployment, self.rec
        rec.attempts += 1
        rec.backend, rec.engine, rec.upstream_model = dep.backend.name, dep.backend.kind, dep.upstream_model
        rec.model = attempt.route.name  # a fallback's name where the request went to one
        if rec.trace is not None:  # its span (observability/tracing.py), ended when its slot is freed
            attempt.trace = rec.trace.attempt(attempt, rec, self.body)

    def waited(self, seconds: float) -> None:
        self.rec.waited_s += seconds

    # -- the attempt and the answer ----------------------------------------------------------------------
    def context(self, attempt: Attempt) -> CallContext:
        nat, dep = self.native, attempt.deployment
        return CallContext(
            self.endpoint,
            attempt.route.name,
            dep.upstream_model,
            self.info.stream,
            self.info.wants_usage,
            self.call.rid,
            self.rt.config.server.reasoning_field,
            self.body.get("encoding_format") == "base64",
            # (an adapter is named in the engine's OpenAI body: a native pass-through would not name it)
            nat.native_api
            if nat and attempt.lora is None and dep.backend.adapter.speaks_natively(nat.native_api, nat.native_body)
            else None,
            attempt.ticket.priority if dep.cfg.engine_priority else None,  # for engines that schedule by it
            attempt.slot,
            attempt.lora if attempt.lora is not None else NO_ADAPTER if dep.base_of_adapters else None,
        )

    def answered(self, attempt: Attempt) -> Headers:
        """The answer's head goes out now. The gateway's own time so far (everything but the engine and the
        waits) is the request's overhead: written to the record here, for the metric, and said in the head
        (`x-gateway-overhead-ms`, the same number) with the transparency and quota headers."""
        rec = self.rec
        rec.overhead_s = overhead = time.perf_counter() - rec.t0 - rec.upstream_s - rec.waited_s
        b = attempt.deployment.backend
        return [
            (b"x-request-id", self.call.rid.encode()),
            (b"x-gateway-backend", b.name.encode()),
            (b"x-gateway-engine", b.kind.encode()),
            (b"x-gateway-model", attempt.route.name.encode()),
            *self.quota,
            (b"x-gateway-overhead-ms", f"{overhead * 1000:.3f}".encode()),
        ]
