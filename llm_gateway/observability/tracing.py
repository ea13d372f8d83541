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

from llm_gateway.settings import PRIORITY_RANKS, TracingConfig

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

#: GenAI operation names (gen_ai.operation.name) of the gateway's endpoints
OPERATIONS = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
CLASS_NAMES = {rank: name for name, rank in PRIORITY_RANKS.items()}
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
    """The process's tracer: its provider (resource, sampler), the batching processor and the exporter."""

    def __init__(self, cfg: TracingConfig, exporter: SpanExporter | None = None) -> None:
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace import SpanKind, set_span_in_context
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
        self.tracer: Tracer = self.provider.get_tracer("llm_gateway")
        self._propagator = TraceContextTextMapPropagator()
        self._getter = DefaultGetter()
        self._server, self._client, self._internal = SpanKind.SERVER, SpanKind.CLIENT, SpanKind.INTERNAL
        self._in_context = set_span_in_context

    def begin(self, rec: RequestRecord, headers: dict[bytes, bytes]) -> RequestTrace:
        """The request's span, started at its arrival; a client's `traceparent` (and `tracestate`) is its parent."""
        parent = None
        tp = headers.get(b"traceparent")
        if tp is not None:
            carrier = {"traceparent": tp.decode("latin-1")}
            ts = headers.get(b"tracestate")
            if ts is not None:
                carrier["tracestate"] = ts.decode("latin-1")
            parent = self._propagator.extract(carrier)
        offset = time.time_ns() - time.perf_counter_ns()
        start = offset + int(rec.t0 * 1e9)
        span = self.tracer.start_span(
            f"{rec.method} {rec.path}",
            context=parent,
            kind=self._server,
            start_time=start,
            attributes={"http.request.method": rec.method, "url.path": rec.path},
        )
        return RequestTrace(self, span, offset)

    def shutdown(self) -> None:
        """Export what is batched, then stop (the process ends)."""
        self.provider.shutdown()


class RequestTrace:
    """One request's span, its attempts' spans and what it learns on the way (record.py ends it)."""

    __slots__ = ("_attempts", "_offset", "_waited", "span", "tracing")

    def __init__(self, tracing: Tracing, span: Span, offset: int) -> None:
        self.tracing = tracing
        self.span = span
        self._offset = offset  # time_ns - perf_counter_ns: the record's perf_counter times as the span's clock
        self._waited = 0.0  # the queue wait already told in a span
        self._attempts = 0

    def _ns(self, perf_s: float) -> int:
        return self._offset + int(perf_s * 1e9)

    def attempt(self, attempt: TracedAttempt, rec: RequestRecord, body: dict[str, Any]) -> AttemptTrace:
        """An attempt starts on a deployment: its CLIENT span, after a `gateway.queue` span for the wait that led
        to it (queue or backoff pause); the request's span learns its class and, once, its prompt."""
        tr, span = self.tracing, self.span
        ctx = tr._in_context(span)
        now = time.time_ns()
        waited = rec.waited_s - self._waited
        dep, route, ticket = attempt.deployment, attempt.route, attempt.ticket
        klass = CLASS_NAMES.get(ticket.priority, "default")
        self._attempts += 1
        if self._attempts == 1:
            span.set_attribute("gateway.priority_class", klass)
            if tr.cfg.capture_content:
                _capture_input(span, body)
        if waited > 0:
            self._waited = rec.waited_s
            q = tr.tracer.start_span(
                "gateway.queue",
                context=ctx,
                kind=tr._internal,
                start_time=now - int(waited * 1e9),
                attributes={"gateway.priority_class": klass, "gateway.queue_wait_s": waited},
            )
            q.end(end_time=now)
        b = dep.backend
        url = urlsplit(b.cfg.url)
        op = OPERATIONS.get(rec.endpoint, rec.endpoint)
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": b.kind,
            "gen_ai.request.model": dep.upstream_model,
            "server.address": url.hostname or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "gateway.deployment": b.name,
            "gateway.engine": b.kind,
            "gateway.model": route.name,
            "gateway.routing.strategy": route.cfg.strategy,
            "gateway.attempt": self._attempts,
            "gateway.priority_class": klass,
        }
        name = f"{op} {dep.upstream_model}"
        return AttemptTrace(tr.tracer.start_span(name, context=ctx, kind=tr._client, start_time=now, attributes=attrs))

    def answered(self, out: bytes) -> None:
        """A whole answer went out: its finish reasons, and its text where content is captured."""
        reasons = list(dict.fromkeys(m.decode() for m in _FINISH.findall(out)))
        if reasons:
            self.span.set_attribute("gen_ai.response.finish_reasons", reasons)
        if self.tracing.cfg.capture_content:
            self.span.set_attribute("gen_ai.output.messages", out[:CONTENT_LIMIT].decode("utf-8", "replace"))

    def end(self, rec: RequestRecord) -> None:
        """The request ended: its record's facts on its span, which ends (to the batch)."""
        span = self.span
        op = OPERATIONS.get(rec.endpoint)
        if op is not None:
            span.update_name(f"{op} {rec.model}")
            span.set_attribute("gen_ai.operation.name", op)
            span.set_attribute("gen_ai.request.model", rec.model)
        if rec.upstream_model is not None:
            span.set_attribute("gen_ai.response.model", rec.upstream_model)
        if rec.prompt_tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", rec.prompt_tokens)
        if rec.completion_tokens is not None:
            span.set_attribute("gen_ai.usage.output_tokens", rec.completion_tokens)
        if rec.backend != "none":
            span.set_attribute("gateway.deployment", rec.backend)
            span.set_attribute("gateway.engine", rec.engine)
        if rec.ttft_s is not None:
            span.set_attribute("gateway.ttft_s", rec.ttft_s)
            span.add_event("gen_ai.first_token", timestamp=self._ns(rec.t0 + rec.ttft_s))
        span.set_attribute("gateway.key.name", rec.key)  # the name: never the key itself
        span.set_attribute("gateway.request_id", rec.rid)
        span.set_attribute("gateway.stream", rec.stream)
        span.set_attribute("gateway.attempts", rec.attempts)
        span.set_attribute("gateway.retries", max(0, rec.attempts - 1))
        span.set_attribute("gateway.queue_wait_s", rec.waited_s)
        span.set_attribute("gateway.outcome", rec.outcome)
        span.set_attribute("gateway.cancelled", rec.status == 499)
        span.set_attribute("http.response.status_code", rec.status)
        if rec.usage_estimated:
            span.set_attribute("gateway.usage_estimated", True)
        if rec.error:
            span.set_attribute("error.type", rec.error)
        if rec.status >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, rec.error or None))
        span.end()

    @property
    def ids(self) -> tuple[str, str]:
        """(trace id, span id) of the request's span, as hex, for the access log."""
        c = self.span.get_span_context()
        return f"{c.trace_id:032x}", f"{c.span_id:016x}"


class AttemptTrace:
    """One attempt's CLIENT span: its child `traceparent` goes to the engine; it ends when the slot is freed."""

    __slots__ = ("span",)

    def __init__(self, span: Span) -> None:
        self.span = span

    def inject(self, headers: dict[str, str]) -> None:
        """The W3C `traceparent` (and the client's `tracestate`) of this attempt, on the engine's request."""
        c = self.span.get_span_context()
        headers["traceparent"] = f"00-{c.trace_id:032x}-{c.span_id:016x}-{int(c.trace_flags):02x}"
        state = c.trace_state.to_header() if c.trace_state else ""
        if state:
            headers["tracestate"] = state

    def failed(self, err: Any) -> None:
        """The attempt failed before any output: the error on its span (code, status, retryable)."""
        from opentelemetry.trace import Status, StatusCode

        s = self.span
        s.set_attribute("error.type", err.code)
        s.set_attribute("http.response.status_code", err.status)
        s.set_attribute("gateway.retryable", bool(err.retryable))
        s.set_status(Status(StatusCode.ERROR, err.code))

    def end(self) -> None:
        self.span.end()


def _capture_input(span: Span, body: dict[str, Any]) -> None:
    for field in ("messages", "input", "prompt"):
        value = body.get(field)
        if value is not None:
            text = orjson.dumps(value).decode()[:CONTENT_LIMIT]
            span.set_attribute("gen_ai.input.messages", text)
            system = body.get("system") or body.get("instructions")
            if isinstance(system, str):
                span.set_attribute("gen_ai.system_instructions", system[:CONTENT_LIMIT])
            return
