"""One generation request on its way through the service's steps: what it asked, whose it is, where it
went so far. The service (service.py) creates it; the relay loop (stream_relay.py) answers with it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from llm_gateway.exchange import ClientExchange, Headers, NativeDialect
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.dispatch import Trace
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.session_key import session_of
from llm_gateway.routing.table import Deployment, ModelRoute
from llm_gateway.service.queue_progress import QueueProgress
from llm_gateway.service.runtime import Runtime
from llm_gateway.types import CallContext, Endpoint


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
    native: NativeDialect | None = None  # the client's own body, for engines that speak its API
    trace: Trace = field(default_factory=Trace)  # the dispatch so far; its ticket orders the queues
    early: QueueProgress | None = None  # a stream whose answer started while it waited in a queue
    #: the completion tokens (all choices together) the key's reservation allows, where its limits count
    #: tokens: a stream that relays more is ended there (stream_relay.py); None: not held
    output_cap: int | None = None

    def context(self, group: ModelRoute, dep: Deployment) -> CallContext:
        nat = self.native
        return CallContext(
            self.endpoint,
            group.name,
            dep.upstream_model,
            self.info.stream,
            self.info.wants_usage,
            self.call.rid,
            self.rt.config.server.reasoning_field,
            self.body.get("encoding_format") == "base64",
            nat.native_api if nat and dep.backend.adapter.speaks_natively(nat.native_api, nat.native_body) else None,
            self.trace.rank if dep.cfg.engine_priority else None,
        )

    def session(self) -> str | None:
        return session_of(self.call.header, self.rt.session_header, self.body)  # agents' ids too (issue 37)

    def answer_headers(self, dep: Deployment) -> Headers:
        """Transparency and quota headers, and the gateway's own time so far (everything but the waits)."""
        rec = self.rec
        rec.overhead_s = time.perf_counter() - rec.t0 - rec.upstream_s - rec.waited_s
        return [
            (b"x-request-id", self.call.rid.encode()),
            (b"x-gateway-backend", dep.backend.name.encode()),
            (b"x-gateway-engine", dep.backend.kind.encode()),
            (b"x-gateway-model", rec.model.encode()),
            *self.quota,
            (b"x-gateway-overhead-ms", f"{rec.overhead_s * 1000:.3f}".encode()),
        ]

    def traced(self, trace: Trace) -> None:
        rec = self.rec
        rec.attempts = trace.attempts
        rec.waited_s += trace.waited_s
        dep = trace.deployment
        if dep is not None:
            rec.backend, rec.engine, rec.upstream_model = dep.backend.name, dep.backend.kind, dep.upstream_model
            if trace.route is not None:
                rec.model = trace.route.name
