"""OpenTelemetry traces of the requests: one SERVER span per request, one CLIENT span per attempt on an engine,
following the GenAI semantic conventions, exported over OTLP (HTTP or gRPC) in batches; W3C trace context in
(a client's `traceparent`/`tracestate` is continued) and out (each attempt's request carries its own span as a
child `traceparent`, so an engine that traces, vLLM with --otlp-traces-endpoint, joins the trace).

Off (`tracing.enabled: false`, the default) it costs the request path one attribute check per hook
(`rec.trace is None`, `attempt.trace is None`) and no OpenTelemetry package is imported: the SDK and the
exporters (the `tracing` extra) are imported by `make_tracing` only when it is on. Everything the config leaves
unset is the SDK's, read from the standard OTEL_* variables (endpoint, protocol, sampler, batching, resource).

The request's span (`RequestTrace`) is begun by the server (http/asgi.py) and ended from its `RequestRecord` when
the request ends (record.py: `finish_record`), so its facts are the record's, written once: model asked and
served, tokens, TTFT (also an event at its time), status, outcome, cancelled or not, the key's *name* (never
the key), the request's class, queue wait (a `gateway.queue` child span before the attempt it led to) and the
number of attempts. Each `AttemptTrace` is begun when dispatch takes an attempt (service/request.py's
`Job.took`) and ended when the attempt's slot is freed (routing/attempt.py), with the deployment, engine, the
routing strategy that chose it, its number, and the error that failed it. Prompts and answers go on the spans
only with `tracing.capture_content` (a whole answer's text; a stream's text is never kept).
"""

from __future__ import annotations

import os
import re
import time
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import orjson

from llm_gateway.settings import CLASS_NAMES, TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

#: GenAI operation names (gen_ai.operation.name) of the gateway's endpoints
OPERATIONS = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
_FINISH = re.compile(rb'"(?:finish_reason|stop_reason)"\s*:\s*"([a-z_]{1,32})"')
CONTENT_LIMIT = 64 * 1024  # characters of a prompt or an answer put on a span (capture_content)


class RequestRecord(Protocol):
    """What a trace reads of a request's record (record.py's `RequestRecord`, which holds the trace)."""

    rid: str
    t0: float
    method: str
    path: str
    endpoint: str
    key: str
    model: str
    backend: str
    engine: str
    upstream_model: str | None
    stream: bool
    status: int
    outcome: str
    prompt_tokens: int | None
    completion_tokens: int | None
    usage_estimated: bool
    ttft_s: float | None
    attempts: int
    waited_s: float
    error: str | None


class TracedAttempt(Protocol):
    """What a trace reads of an attempt (routing/attempt.py's `Attempt`, which sits above this layer)."""

    @property
    def deployment(self) -> Any: ...

    @property
    def route(self) -> Any: ...

    @property
    def ticket(self) -> Any: ...


def make_tracing(cfg: TracingConfig, exporter: SpanExporter | None = None) -> Tracing | None:
    """The process's tracing, or None when it is off (nothing of OpenTelemetry imported)."""
    if not cfg.enabled:
        return None
    return Tracing(cfg, exporter)


def _exporter(cfg: TracingConfig) -> SpanExporter:
    """The OTLP exporter: the config's protocol and endpoint, else the OTEL_* variables' (the SDK reads them)."""
    env = os.environ.get
    proto = cfg.protocol or env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env("OTEL_EXPORTER_OTLP_PROTOCOL") or "http"
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        endpoint = cfg.endpoint
        return GrpcExporter(endpoint=endpoint, insecure=True if endpoint and endpoint.startswith("http:") else None)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    endpoint = cfg.endpoint
    if endpoint and urlsplit(endpoint).path in ("", "/"):
        endpoint = endpoint.rstrip("/") + "/v1/traces"  # as the SDK does for OTEL_EXPORTER_OTLP_ENDPOINT
    return HttpExporter(endpoint=endpoint)


class Tracing:
    """The process's tracing: its provider (resource, sampler), the batching processor and the exporter.

    Spans are not the SDK's live `Span`s: a request's facts are known when it ends (its record), so each span is
    built once, finished, as the SDK's `ReadableSpan` with its attributes in one dict, and handed to the batching
    processor, as the SDK's own `Span.end` does. The SDK's live spans validate and lock every attribute set one by
    one: on the request path they cost +6,165 bytecodes per whole answer, these +1,285 (bench/opcounts.py,
    README "Traces"). The ids are the SDK's (its id generator), the sampling decision its sampler's (ParentBased,
    or OTEL_TRACES_SAMPLER's)."""

    def __init__(self, cfg: TracingConfig, exporter: SpanExporter | None = None) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import Event, ReadableSpan, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import Decision, ParentBased, TraceIdRatioBased
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
        from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, get_current_span
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.cfg = cfg
        attrs = {"service.name": cfg.service_name} if cfg.service_name else {}
        if not cfg.service_name and not os.environ.get("OTEL_SERVICE_NAME"):
            attrs["service.name"] = "llm-gateway"
        sampler = ParentBased(TraceIdRatioBased(cfg.sampling_ratio)) if cfg.sampling_ratio is not None else None
        # Resource.create merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; a None sampler is OTEL_TRACES_SAMPLER's
        self.provider: TracerProvider = TracerProvider(resource=Resource.create(attrs), sampler=sampler)
        self.processor = BatchSpanProcessor(exporter or _exporter(cfg))  # OTEL_BSP_* (queue, batch, delay)
        self.provider.add_span_processor(self.processor)
        self._emit = self.processor.on_end
        self._sampler = self.provider.sampler
        self._ids = self.provider.id_generator
        self._resource = self.provider.resource
        self._scope = InstrumentationScope("llm_gateway")
        self._servers: dict[str, tuple[str, int]] = {}  # a backend URL's (server.address, server.port)
        self._propagator = TraceContextTextMapPropagator()
        self._current = get_current_span
        self._readable, self._event, self._context = ReadableSpan, Event, SpanContext
        self._sampled, self._unsampled = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
        self._server, self._client, self._internal = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
        self._keep = Decision.RECORD_AND_SAMPLE
        self._status, self._error_code, self._unset = Status, StatusCode.ERROR, Status(StatusCode.UNSET)

    def begin(self, rec: RequestRecord, headers: dict[bytes, bytes]) -> RequestTrace:
        """The request's trace, from its arrival; a client's `traceparent` (and `tracestate`) is its parent."""
        parent_ctx = parent = None
        tp = headers.get(b"traceparent")
        if tp is not None:
            carrier = {"traceparent": tp.decode("latin-1")}
            ts = headers.get(b"tracestate")
            if ts is not None:
                carrier["tracestate"] = ts.decode("latin-1")
            parent_ctx = self._propagator.extract(carrier)
            parent = self._current(parent_ctx).get_span_context()
            if not parent.is_valid:
                parent_ctx = parent = None
        trace_id = parent.trace_id if parent is not None else self._ids.generate_trace_id()
        decision = self._sampler.should_sample(parent_ctx, trace_id, rec.path, self._server)
        flags = self._sampled if decision.decision == self._keep else self._unsampled
        ctx = self._context(trace_id, self._ids.generate_span_id(), False, flags, decision.trace_state)
        return RequestTrace(self, ctx, parent, time.time_ns() - time.perf_counter_ns())

    def server(self, url: str) -> tuple[str, int]:
        """A backend URL's `server.address` and `server.port` (parsed once per URL)."""
        known = self._servers.get(url)
        if known is None:
            u = urlsplit(url)
            known = self._servers[url] = (u.hostname or "", u.port or (443 if u.scheme == "https" else 80))
        return known

    def span(
        self,
        name: str,
        ctx: Any,
        parent: Any,
        kind: Any,
        attrs: dict[str, Any],
        start: int,
        end: int,
        events: tuple[Any, ...] = (),
        error: str | None = None,
    ) -> None:
        """One finished span to the batch (dropped by the processor when not sampled)."""
        status = self._status(self._error_code, error) if error is not None else self._unset
        self._emit(
            self._readable(
                name,
                ctx,
                parent,
                self._resource,
                attrs,
                events,
                (),
                kind,
                None,
                status,
                start,
                end,
                self._scope,
            )
        )

    def shutdown(self) -> None:
        """Export what is batched, then stop (the process ends)."""
        self.provider.shutdown()


class RequestTrace:
    """One request's span (its ids from the start, its facts at its end, from the record) and its attempts'."""

    __slots__ = ("_attempts", "_offset", "_waited", "attrs", "ctx", "parent", "sampled", "tracing")

    def __init__(self, tracing: Tracing, ctx: Any, parent: Any, offset: int) -> None:
        self.tracing = tracing
        self.ctx = ctx  # its SpanContext: trace id, span id, sampled or not
        self.sampled: bool = ctx.trace_flags.sampled  # not sampled: its ids propagate, no span is exported
        self.parent = parent  # the client's span (its traceparent), or None
        self.attrs: dict[str, Any] = {}
        self._offset = offset  # time_ns - perf_counter_ns: the record's perf_counter times as the span's clock
        self._waited = 0.0  # the queue wait already told in a span
        self._attempts = 0

    def _ns(self, perf_s: float) -> int:
        return self._offset + int(perf_s * 1e9)

    def attempt(self, attempt: TracedAttempt, rec: RequestRecord, body: dict[str, Any]) -> AttemptTrace:
        """An attempt starts on a deployment: its CLIENT span, after a `gateway.queue` span for the wait that led
        to it (queue or backoff pause); the request's span learns its class and, once, its prompt."""
        if not self.sampled:  # its ids still go to the engine (sampled flag off): nothing else is kept
            return AttemptTrace(self, self._child(), "", {}, 0)
        tr = self.tracing
        now = time.time_ns()
        waited = rec.waited_s - self._waited
        dep, route, ticket = attempt.deployment, attempt.route, attempt.ticket
        klass = CLASS_NAMES.get(ticket.priority, "default")
        self._attempts += 1
        if self._attempts == 1:
            self.attrs["gateway.priority_class"] = klass
            if tr.cfg.capture_content:
                _capture_input(self.attrs, body)
        if waited > 0:
            self._waited = rec.waited_s
            told = {"gateway.priority_class": klass, "gateway.queue_wait_s": waited}
            tr.span("gateway.queue", self._child(), self.ctx, tr._internal, told, now - int(waited * 1e9), now)
        b = dep.backend
        address, port = tr.server(b.cfg.url)
        op = OPERATIONS.get(rec.endpoint, rec.endpoint)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": b.kind,
            "gen_ai.request.model": dep.upstream_model,
            "server.address": address,
            "server.port": port,
            "gateway.deployment": b.name,
            "gateway.engine": b.kind,
            "gateway.model": route.name,
            "gateway.routing.strategy": route.cfg.strategy,
            "gateway.attempt": self._attempts,
            "gateway.priority_class": klass,
        }
        return AttemptTrace(self, self._child(), f"{op} {dep.upstream_model}", attrs, now)

    def _child(self) -> Any:
        c, tr = self.ctx, self.tracing
        return tr._context(c.trace_id, tr._ids.generate_span_id(), False, c.trace_flags, c.trace_state)

    def answered(self, out: bytes) -> None:
        """A whole answer went out: its finish reasons, and its text where content is captured."""
        reasons = list(dict.fromkeys(m.decode() for m in _FINISH.findall(out)))
        if reasons:
            self.attrs["gen_ai.response.finish_reasons"] = reasons
        if self.tracing.cfg.capture_content:
            self.attrs["gen_ai.output.messages"] = out[:CONTENT_LIMIT].decode("utf-8", "replace")

    def end(self, rec: RequestRecord) -> None:
        """The request ended: its record's facts on its span, which goes to the batch."""
        if not self.sampled:
            return
        a = self.attrs
        a["http.request.method"], a["url.path"] = rec.method, rec.path
        op = OPERATIONS.get(rec.endpoint)
        name = f"{rec.method} {rec.path}"
        if op is not None:
            name = f"{op} {rec.model}"
            a["gen_ai.operation.name"], a["gen_ai.request.model"] = op, rec.model
        if rec.upstream_model is not None:
            a["gen_ai.response.model"] = rec.upstream_model
        if rec.prompt_tokens is not None:
            a["gen_ai.usage.input_tokens"] = rec.prompt_tokens
        if rec.completion_tokens is not None:
            a["gen_ai.usage.output_tokens"] = rec.completion_tokens
        if rec.backend != "none":
            a["gateway.deployment"], a["gateway.engine"] = rec.backend, rec.engine
        tr = self.tracing
        events: tuple[Any, ...] = ()
        if rec.ttft_s is not None:
            a["gateway.ttft_s"] = rec.ttft_s
            events = (tr._event("gen_ai.first_token", None, self._ns(rec.t0 + rec.ttft_s)),)
        a["gateway.key.name"] = rec.key  # the name: never the key itself
        a["gateway.request_id"] = rec.rid
        a["gateway.stream"] = rec.stream
        a["gateway.attempts"] = rec.attempts
        a["gateway.retries"] = max(0, rec.attempts - 1)
        a["gateway.queue_wait_s"] = rec.waited_s
        a["gateway.outcome"] = rec.outcome
        a["gateway.cancelled"] = rec.status == 499
        a["http.response.status_code"] = rec.status
        if rec.usage_estimated:
            a["gateway.usage_estimated"] = True
        if rec.error:
            a["error.type"] = rec.error
        error = (rec.error or "error") if rec.status >= 500 else None  # a server span's error: a 5xx only
        tr.span(name, self.ctx, self.parent, tr._server, a, self._ns(rec.t0), time.time_ns(), events, error)

    @property
    def ids(self) -> tuple[str, str]:
        """(trace id, span id) of the request's span, as hex, for the access log."""
        c = self.ctx
        return f"{c.trace_id:032x}", f"{c.span_id:016x}"


class AttemptTrace:
    """One attempt's CLIENT span: its child `traceparent` goes to the engine; it ends when the slot is freed."""

    __slots__ = ("attrs", "ctx", "error", "name", "request", "start")

    def __init__(self, request: RequestTrace, ctx: Any, name: str, attrs: dict[str, Any], start: int) -> None:
        self.request = request
        self.ctx = ctx
        self.name = name
        self.attrs = attrs
        self.start = start
        self.error: str | None = None

    def inject(self, headers: dict[str, str]) -> None:
        """The W3C `traceparent` (and the client's `tracestate`) of this attempt, on the engine's request."""
        c = self.ctx
        headers["traceparent"] = f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
        state = c.trace_state.to_header() if c.trace_state else ""
        if state:
            headers["tracestate"] = state

    def failed(self, err: Any) -> None:
        """The attempt failed before any output: the error on its span (code, status, retryable)."""
        a = self.attrs
        a["error.type"], a["http.response.status_code"], a["gateway.retryable"] = (
            err.code,
            err.status,
            bool(err.retryable),
        )
        self.error = err.code

    def end(self) -> None:
        r = self.request
        if r.sampled:
            tr = r.tracing
            tr.span(self.name, self.ctx, r.ctx, tr._client, self.attrs, self.start, time.time_ns(), (), self.error)


def _capture_input(attrs: dict[str, Any], body: dict[str, Any]) -> None:
    for field in ("messages", "input", "prompt"):
        value = body.get(field)
        if value is not None:
            attrs["gen_ai.input.messages"] = orjson.dumps(value).decode()[:CONTENT_LIMIT]
            system = body.get("system") or body.get("instructions")
            if isinstance(system, str):
                attrs["gen_ai.system_instructions"] = system[:CONTENT_LIMIT]
            return
