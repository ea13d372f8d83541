"""OpenTelemetry traces of the requests: one SERVER span per request, one CLIENT span per attempt on an engine,
following the GenAI semantic conventions, exported over OTLP (HTTP or gRPC) in batches; W3C trace context in
(a client's `traceparent`/`tracestate` is continued) and out (each attempt's request carries its own span as a
child `traceparent`, so an engine that traces, vLLM with --otlp-traces-endpoint, joins the trace).

Off (`tracing.enabled: false`, the default) it costs the request path one attribute check per hook
(`rec.trace is None`, `attempt.trace is None`), and neither otlp.py's export thread nor gRPC exists. On, a span
is ints (ids) and, when it ends, one tuple handed to otlp.py's bounded queue; its export thread writes the OTLP
protobuf bytes and sends them (HTTP or gRPC). The sampling decision is the SDK's ParentBased(TraceIdRatioBased)
on the same ids; what the config leaves unset comes from the standard OTEL_* variables (endpoint, protocol,
headers, sampler, batching, resource).

The request's span (`RequestTrace`) is begun by the server (http/asgi.py) and ended from its `RequestRecord` when
the request ends (record.py: `finish_record`), so its facts are the record's, written once: model asked and
served, tokens, TTFT (also an event at its time), status, outcome, cancelled or not, the key's *name* (never
the key), the request's class, queue wait (a `gateway.queue` child span before the attempt it led to) and the
number of attempts. Each `AttemptTrace` is begun when dispatch takes an attempt (service/request.py's
`Job.took`) and ended when the attempt's slot is freed (routing/attempt.py), with the deployment, engine, the
routing strategy that chose it, its number, and the error that failed it. Prompts and answers go on the spans
only with `tracing.capture_content` (a whole answer's text; a stream's text is never kept). A whole answer's finish
reasons are what its adapter read of it (CallContext.finish_reasons; the answer's bytes where it did not say), a
stream's are found in the events it relays (genai_spans.finish_reasons). The attribute keys, operation names,
finish-reason pattern and the Protocols by which a span reads the record and the attempt are genai_spans.py's.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from random import getrandbits
from typing import Any
from urllib.parse import urlsplit

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import (
    CLIENT_KEYS,
    CONTENT_LIMIT,
    OPERATIONS,
    QUEUE_KEYS,
    SERVER_KEYS,
    UNIQUE_KEYS,
    RequestRecord,
    TracedAttempt,
    capture_input,
    finish_reasons,
    is_reason,
)
from llm_gateway.observability.otlp import CLIENT, INTERNAL, SERVER
from llm_gateway.observability.otlp_config import ID64 as _ID64
from llm_gateway.observability.otlp_config import resource as _resource
from llm_gateway.observability.otlp_config import sampler as _sampler
from llm_gateway.observability.otlp_config import sender as _sender
from llm_gateway.settings import CLASS_NAMES, TracingConfig

#: W3C traceparent: version-trace id-parent id-flags, and more fields only after a version other than 00
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_MASK64 = _ID64 - 1
_NO_ATTRS: dict[str, Any] = {}


def make_tracing(cfg: TracingConfig, on_drop: Callable[[str, int], None] | None = None) -> Tracing | None:
    """The process's tracing, or None when it is off (no exporter, no thread, no gRPC imported)."""
    if not cfg.enabled:
        return None
    return Tracing(cfg, on_drop)


class Tracing:
    """The process's tracing: ids, the sampling decision, and the batcher that encodes and exports the spans.

    No OpenTelemetry object is made on the request path: a span is its ids (ints from `random.getrandbits`, as the
    SDK's RandomIdGenerator makes them) and, when it ends, one tuple (`otlp.Span`) appended to the bounded queue;
    the export thread writes the OTLP bytes (otlp.py). The SDK's live spans cost +6,165 bytecodes per whole answer
    on the request path, its ReadableSpans +1,285 and ~54 µs per span to encode (README "Traces")."""

    def __init__(self, cfg: TracingConfig, on_drop: Callable[[str, int], None] | None = None) -> None:
        self.cfg = cfg
        self.dropped = 0
        self._on_drop = on_drop
        self._parent_based, self._bound = _sampler(cfg)
        self._servers: dict[str, tuple[str, int]] = {}  # a backend URL's (server.address, server.port)
        #: (deployment, route, endpoint, class, attempt number) -> an attempt span's name and CLIENT_KEYS' values:
        #: they recur, and a reload builds new routes (so a new key), never changes one
        self.clients: dict[tuple[Any, ...], tuple[str, tuple[Any, ...]]] = {}
        encoder = otlp.Encoder(_resource(cfg), "llm_gateway", UNIQUE_KEYS)
        self.batcher = otlp.Batcher(encoder, _sender(cfg), self._dropped)
        self.emit = self.batcher.add

    def _dropped(self, reason: str, n: int) -> None:
        self.dropped += n
        if self._on_drop is not None:
            self._on_drop(reason, n)

    def begin(self, rec: RequestRecord, headers: dict[bytes, bytes]) -> RequestTrace:
        """The request's trace, from its arrival; a client's `traceparent` (and `tracestate`) is its parent."""
        tp = headers.get(b"traceparent")
        if tp is not None:
            continued = self._continued(tp, headers)
            if continued is not None:
                return continued
        trace_id = getrandbits(128) or 1
        return RequestTrace(self, trace_id, 0, (trace_id & _MASK64) < self._bound, "")

    def _continued(self, tp: bytes, headers: dict[bytes, bytes]) -> RequestTrace | None:
        """The trace a client's valid `traceparent` names (None: not valid, a new trace)."""
        m = _TRACEPARENT.fullmatch(tp.strip().lower())
        if m is None or m[1] == b"ff" or (m[1] == b"00" and m[5]):
            return None
        trace_id, parent = int(m[2], 16), int(m[3], 16)
        if not trace_id or not parent:
            return None
        sampled = bool(int(m[4], 16) & 1) if self._parent_based else (trace_id & _MASK64) < self._bound
        ts = headers.get(b"tracestate")
        state = ts.decode("latin-1").strip() if ts is not None and len(ts) <= 512 else ""
        return RequestTrace(self, trace_id, parent, sampled, state)

    def server(self, url: str) -> tuple[str, int]:
        """A backend URL's `server.address` and `server.port` (parsed once per URL)."""
        known = self._servers.get(url)
        if known is None:
            u = urlsplit(url)
            known = self._servers[url] = (u.hostname or "", u.port or (443 if u.scheme == "https" else 80))
        return known

    def client(self, dep: Any, route: Any, endpoint: str, klass: str, n: int) -> tuple[str, tuple[Any, ...]]:
        """An attempt span's name and CLIENT_KEYS' values, kept in `clients` (bounded)."""
        b = dep.backend
        address, port = self.server(b.cfg.url)
        op = OPERATIONS.get(endpoint, endpoint)
        model = dep.upstream_model
        values = (op, b.kind, model, address, port, b.name, b.kind, route.name, route.cfg.strategy, n, klass)
        if len(self.clients) >= 1024:
            self.clients.clear()
        known = self.clients[(dep, route, endpoint, klass, n)] = (f"{op} {model}", values)
        return known

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export what is queued now (blocking: off the loop)."""
        return self.batcher.force_flush(timeout_s)

    def shutdown(self) -> None:
        """Export what is batched, then stop (the process ends)."""
        self.batcher.shutdown()


class RequestTrace:
    """One request's span (its ids from the start, its facts at its end, from the record) and its attempts'."""

    __slots__ = (
        "_attempts",
        "_waited",
        "attrs",
        "klass",
        "parent",
        "reasons",
        "sampled",
        "span_id",
        "state",
        "trace_id",
        "tracing",
    )

    def __init__(self, tracing: Tracing, trace_id: int, parent: int, sampled: bool, state: str) -> None:
        self.tracing = tracing
        self.trace_id = trace_id
        self.span_id = getrandbits(64) or 1
        self.parent = parent  # the client's span id (its traceparent), or 0
        self.sampled = sampled  # not sampled: its ids propagate (flag 00), no span is exported
        self.state = state  # the client's tracestate, passed on as it came
        self.attrs: dict[str, Any] = _NO_ATTRS  # the captured content (capture_content), once there is some
        self.reasons: tuple[str, ...] | None = None  # the finish reasons, in order, once each
        self.klass: str | None = None  # the request's priority class, once an attempt is taken
        self._waited = 0.0  # the queue wait already told in a span
        self._attempts = 0

    def attempt(self, attempt: TracedAttempt, rec: RequestRecord, body: dict[str, Any]) -> AttemptTrace:
        """An attempt starts on a deployment: its CLIENT span, after a `gateway.queue` span for the wait that led
        to it (queue or backoff pause); the request's span learns its class and, once, its prompt."""
        if not self.sampled:  # its ids still go to the engine (sampled flag off): nothing else is kept
            return AttemptTrace(self, "", ())
        tr = self.tracing
        now = time.time_ns()
        waited = rec.waited_s - self._waited
        dep, route = attempt.deployment, attempt.route
        klass = CLASS_NAMES.get(attempt.ticket.priority, "default")
        self._attempts += 1
        if self._attempts == 1:
            self.klass = klass
            if tr.cfg.capture_content:
                capture_input(self.content(), body)
        if waited > 0:
            self._waited = rec.waited_s
            told = {"gateway.queue_wait_s": waited}
            span_id = getrandbits(64) or 1
            start = now - int(waited * 1e9)
            queued = (self.trace_id, span_id, self.span_id, INTERNAL, start, now, QUEUE_KEYS, (klass,), told, (), None)
            tr.emit(("gateway.queue", *queued, ""))
        key = (dep, route, rec.endpoint, klass, self._attempts)
        known = tr.clients.get(key)
        if known is None:
            known = tr.client(*key)
        return AttemptTrace(self, known[0], known[1], now)

    def answered(self, out: bytes, told: list[str] | None = None) -> None:
        """A whole answer went out: its finish reasons (`told`: as the adapter read them, CallContext.finish_reasons;
        None: found in `out`), and its text where content is captured."""
        if told is None:
            self.finished(out)
        else:
            reasons = self.reasons
            for r in told:
                if (reasons is None or r not in reasons) and is_reason(r):
                    reasons = self.reasons = (r,) if reasons is None else (*reasons, r)
        if self.tracing.cfg.capture_content:
            self.content()["gen_ai.output.messages"] = out[:CONTENT_LIMIT].decode("utf-8", "replace")

    def content(self) -> dict[str, Any]:
        """The span's captured content attributes (made at the first)."""
        if self.attrs is _NO_ATTRS:
            self.attrs = {}
        return self.attrs

    def finished(self, data: bytes) -> None:
        """The finish reasons in an answer or a stream's event (finish_reason, stop_reason, incomplete_details'
        reason), added in order, once each."""
        found = finish_reasons(data)
        if found:
            reasons = self.reasons
            for m in found:
                r = m.decode()
                if reasons is None:
                    reasons = self.reasons = (r,)
                elif r not in reasons:
                    reasons = self.reasons = (*reasons, r)

    def watch(self, feed: Callable[[bytes], bytes]) -> Callable[[bytes], bytes]:
        """A stream relay's `feed` that also reads the finish reasons of what it relays (service/stream.py)."""
        finished = self.finished

        def traced(chunk: bytes) -> bytes:
            out = feed(chunk)
            if out:
                finished(out)
            return out

        return traced

    def end(self, rec: RequestRecord) -> None:
        """The request ended: its record's facts on its span, which goes to the batch."""
        if not self.sampled:
            return
        end = time.time_ns()
        offset = end - time.perf_counter_ns()  # the record's perf_counter times as unix ns
        op = OPERATIONS.get(rec.endpoint)
        name = f"{op} {rec.model}" if op is not None else f"{rec.method} {rec.path}"
        ttft = rec.ttft_s
        events = () if ttft is None else (("gen_ai.first_token", offset + int((rec.t0 + ttft) * 1e9)),)
        a = {  # one dict made at once: a None is no attribute (otlp.Span)
            "gen_ai.usage.input_tokens": rec.prompt_tokens,
            "gen_ai.usage.output_tokens": rec.completion_tokens,
            "gen_ai.response.finish_reasons": self.reasons,
            "gateway.request_id": rec.rid,
            "gateway.queue_wait_s": rec.waited_s,
        }
        # the two a whole answer seldom has, added only when there: each None in `a` costs the encoder ~27 bytecodes
        if ttft is not None:
            a["gateway.ttft_s"] = ttft
        if rec.usage_estimated:
            a["gateway.usage_estimated"] = True
        if self.attrs:
            a.update(self.attrs)
        served = rec.backend != "none"
        status = rec.status
        values = (
            rec.method,
            rec.path,
            op,
            rec.model if op is not None else None,
            rec.upstream_model,
            rec.backend if served else None,
            rec.engine if served else None,
            rec.key,
            self.klass,
            rec.stream,
            rec.attempts,
            rec.attempts - 1 if rec.attempts > 1 else 0,
            rec.outcome,
            status == 499,
            status,
            rec.error or None,
        )
        error = (rec.error or "error") if status >= 500 else None  # a server span's error: a 5xx only
        start = offset + int(rec.t0 * 1e9)
        self.tracing.emit(
            (
                name,
                self.trace_id,
                self.span_id,
                self.parent,
                SERVER,
                start,
                end,
                SERVER_KEYS,
                values,
                a,
                events,
                error,
                self.state,
            )
        )

    @property
    def ids(self) -> tuple[str, str]:
        """(trace id, span id) of the request's span, as hex, for the access log."""
        return self.trace_id.to_bytes(16, "big").hex(), self.span_id.to_bytes(8, "big").hex()


class AttemptTrace:
    """One attempt's CLIENT span: its child `traceparent` goes to the engine; it ends when the slot is freed."""

    __slots__ = ("attrs", "error", "name", "request", "span_id", "start", "values")

    def __init__(self, request: RequestTrace, name: str, values: tuple[Any, ...], start: int = 0) -> None:
        self.request = request
        self.span_id = getrandbits(64) or 1
        self.name = name
        self.values = values  # CLIENT_KEYS' values
        self.start = start
        self.attrs = _NO_ATTRS  # its error's, when it failed
        self.error: str | None = None

    def inject(self, headers: dict[str, str]) -> None:
        """The W3C `traceparent` (and the client's `tracestate`) of this attempt, on the engine's request."""
        r = self.request
        # the ids' hex by to_bytes().hex(): the same text as f"{id:032x}" at ~60 % of its instructions
        trace, span = r.trace_id.to_bytes(16, "big").hex(), self.span_id.to_bytes(8, "big").hex()
        headers["traceparent"] = f"00-{trace}-{span}-{'01' if r.sampled else '00'}"
        if r.state:
            headers["tracestate"] = r.state

    def failed(self, err: Any) -> None:
        """The attempt failed before any output: the error on its span (code, status, retryable)."""
        self.attrs = {
            "error.type": err.code,
            "http.response.status_code": err.status,
            "gateway.retryable": bool(err.retryable),
        }
        self.error = err.code

    def end(self) -> None:
        r = self.request
        if r.sampled:
            end = time.time_ns()
            r.tracing.emit(
                (
                    self.name,
                    r.trace_id,
                    self.span_id,
                    r.span_id,
                    CLIENT,
                    self.start,
                    end,
                    CLIENT_KEYS,
                    self.values,
                    self.attrs,
                    (),
                    self.error,
                    r.state,
                )
            )
