"""OpenTelemetry traces of the requests: one SERVER span per request, one CLIENT span per attempt on an engine,
following the GenAI semantic conventions, exported over OTLP (HTTP or gRPC) in batches; W3C trace context in
(a client's `traceparent`/`tracestate` is continued) and out (each attempt's request carries its own span as a
child `traceparent`, so an engine that traces, vLLM with --otlp-traces-endpoint, joins the trace).

Off (`tracing.enabled: false`, the default) it costs the request path one attribute check per hook
(`rec.trace is None`, `attempt.trace is None`), and neither otlp.py's export thread nor gRPC exists. On, a span
is its ids (bytes) and, when it ends, its OTLP protobuf bytes, joined from what this process keeps as bytes (the
name and attributes a request's facts or an attempt's deployment make: they recur) and its own ids, times and
values, appended to otlp.py's bounded queue; the export thread frames a batch and sends it (HTTP or gRPC). Written
where it ends, a span costs no tuple of its facts built on the loop and taken apart in another thread (that was
~40 % of tracing's cost a request). The sampling decision is the SDK's ParentBased(TraceIdRatioBased)
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

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import (
    CLIENT_KEYS,
    CONTENT_LIMIT,
    FAILURE_KEYS,
    ONE_REASON,
    QUEUE_KEYS,
    QUEUE_OWN_KEYS,
    RequestRecord,
    TracedAttempt,
    capture_input,
    finish_reasons,
    is_reason,
    one_reason,
)
from llm_gateway.observability.otlp import CLIENT, END, INTERNAL, NO_ATTRS, TIMES, D, Q
from llm_gateway.observability.otlp_config import ID64 as _ID64
from llm_gateway.observability.otlp_config import resource as _resource
from llm_gateway.observability.otlp_config import sampler as _sampler
from llm_gateway.observability.otlp_config import sender as _sender
from llm_gateway.observability.span_pieces import AttemptPieces, SpanPieces
from llm_gateway.settings import CLASS_NAMES, TracingConfig

#: W3C traceparent: version-trace id-parent id-flags, and more fields only after a version other than 00
_TRACEPARENT = re.compile(rb"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_MASK64 = _ID64 - 1


def make_tracing(cfg: TracingConfig, on_drop: Callable[[str, int], None] | None = None) -> Tracing | None:
    """The process's tracing, or None when it is off (no exporter, no thread, no gRPC imported)."""
    if not cfg.enabled:
        return None
    return Tracing(cfg, on_drop)


class Tracing(SpanPieces):
    """The process's tracing: ids, the sampling decision, the pieces spans are written from (its `SpanPieces` side,
    span_pieces.py), and the batcher that exports them.

    No OpenTelemetry object is made on the request path: a span is its ids (bytes from `random.getrandbits`, as the
    SDK's RandomIdGenerator makes them) and, when it ends, its protobuf bytes joined from pieces kept as bytes (what
    recurs: a request's facts, an attempt's deployment and route) and its own (ids, times, tokens, request id),
    appended to the batcher's bounded queue (otlp.py). The SDK's live spans cost +6,165 bytecodes per whole answer
    on the request path, its ReadableSpans +1,285 and ~54 µs per span to encode (README "Traces")."""

    def __init__(self, cfg: TracingConfig, on_drop: Callable[[str, int], None] | None = None) -> None:
        self.cfg = cfg
        self.capture = cfg.capture_content
        self.dropped = 0
        self._on_drop = on_drop
        self._parent_based, self._bound = _sampler(cfg)
        super().__init__(_resource(cfg))
        self.batcher = otlp.Batcher(self.encoder, _sender(cfg), self._dropped)
        #: a written span goes to the batcher's queue: by `spans.append` while it holds fewer than `room` (no call
        #: of Batcher.add, whose checks only matter from there on: a full batch wakes the export thread, a full
        #: queue drops), else by `emit`
        self.spans = self.batcher.queue
        self.room = self.batcher.batch - 1
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
        return RequestTrace(self, trace_id.to_bytes(16, "big"), (trace_id & _MASK64) < self._bound)

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
        return RequestTrace(self, trace_id.to_bytes(16, "big"), sampled, parent.to_bytes(8, "big"), state)

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
        "parent_field",
        "reasons",
        "sampled",
        "span_id",
        "state",
        "state_field",
        "trace_id",
        "tracing",
    )

    def __init__(self, tracing: Tracing, trace_id: bytes, sampled: bool, parent: bytes = b"", state: str = "") -> None:
        self.tracing = tracing
        self.trace_id = trace_id  # 16 bytes, as the wire has them and as their hex goes out
        self.span_id = (getrandbits(64) or 1).to_bytes(8, "big")
        self.sampled = sampled  # not sampled: its ids propagate (flag 00), no span is exported
        self.parent = parent  # the client's span id (its traceparent), or b""
        self.state = state  # the client's tracestate, passed on as it came
        if parent or state:  # their fields in its spans (otlp.Span's order: trace_state 3, parent_span_id 4)
            self.parent_field = otlp.PARENT_ID + parent if parent else b""
            self.state_field = otlp.state_field(state)
        else:
            self.parent_field = self.state_field = b""
        self.attrs: dict[str, Any] = NO_ATTRS  # the captured content (capture_content), once there is some
        self.reasons: tuple[str, ...] | None = None  # the finish reasons, in order, once each
        self.klass: str | None = None  # the request's priority class, once an attempt is taken
        self._waited = 0.0  # the queue wait already told in a span
        self._attempts = 0

    def attempt(self, attempt: TracedAttempt, rec: RequestRecord, body: dict[str, Any]) -> AttemptTrace:
        """An attempt starts on a deployment: its CLIENT span, after a `gateway.queue` span for the wait that led
        to it (queue or backoff pause); the request's span learns its class and, once, its prompt."""
        if not self.sampled:  # its ids still go to the engine (sampled flag off): nothing else is kept
            return AttemptTrace(self, None)
        tr = self.tracing
        now = time.time_ns()
        waited = rec.waited_s - self._waited
        klass = CLASS_NAMES.get(attempt.ticket.priority, "default")
        n = self._attempts = self._attempts + 1
        if n == 1:
            self.klass = klass
            if tr.capture:
                capture_input(self.content(), body)
        if waited > 0:
            self._waited = rec.waited_s
            span_id = (getrandbits(64) or 1).to_bytes(8, "big")
            start = now - int(waited * 1e9)
            own = (QUEUE_OWN_KEYS, (waited,), NO_ATTRS, (), None)
            ids = (self.trace_id, span_id, self.span_id, self.state)
            tr.emit(tr.encoder.span(("gateway.queue", INTERNAL, *ids, start, now, QUEUE_KEYS, (klass,), *own)))
        key = (attempt.deployment, attempt.route, rec.endpoint, klass, n)
        known = tr.clients.get(key)
        if known is None:
            known = tr.client(*key)
        return AttemptTrace(self, known, now)

    def answered(self, out: bytes, told: list[str] | None = None) -> None:
        """A whole answer went out: its finish reasons (`told`: as the adapter read them, CallContext.finish_reasons;
        None: found in `out`), and its text where content is captured."""
        if told is None:
            self.finished(out)
        elif self.reasons is None and len(told) == 1:  # the usual answer: one choice, one reason
            one = ONE_REASON.get(told[0])
            self.reasons = (one if one is not None else one_reason(told[0])) or None
        else:
            reasons = self.reasons
            for r in told:
                if (reasons is None or r not in reasons) and is_reason(r):
                    reasons = self.reasons = (r,) if reasons is None else (*reasons, r)
        if self.tracing.capture:
            self.content()["gen_ai.output.messages"] = out[:CONTENT_LIMIT].decode("utf-8", "replace")

    def content(self) -> dict[str, Any]:
        """The span's captured content attributes (made at the first)."""
        if self.attrs is NO_ATTRS:
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
        """The request ended: its span written from its record (what recurs kept as bytes, by the record's facts:
        Tracing.request) and queued. Its own attributes (SERVER_OWN_KEYS) in their order, a None left out:
        usage_estimated only when true, the TTFT (a float, also an event at its time) only when there."""
        if not self.sampled:
            return
        tr = self.tracing
        end = time.time_ns()
        offset = end - time.perf_counter_ns()  # the record's perf_counter times as unix ns
        key = (  # what the span's name, fixed attributes and status are made of (Tracing.request)
            rec.method,
            rec.path,
            rec.endpoint,
            rec.model,
            rec.upstream_model,
            rec.backend,
            rec.engine,
            rec.key,
            self.klass,
            rec.stream,
            rec.attempts,
            rec.outcome,
            rec.status,
            rec.error,
        )
        kept = tr.requests.get(key)
        if kept is None:
            kept = tr.request(key)
        rid = rec.rid.encode()
        ttft = rec.ttft_s
        parts = [
            otlp.TRACE_ID,
            self.trace_id,
            otlp.SPAN_ID,
            self.span_id,
            self.state_field,
            self.parent_field,
            kept[0],
            TIMES(offset + int(rec.t0 * 1e9), END, end),
            kept[1],
            tr.tokens_in[rec.prompt_tokens],
            tr.tokens_out[rec.completion_tokens],
            tr.reasons[self.reasons],
            tr.rids[len(rid)],
            rid,
            tr.waits[rec.waited_s],
        ]
        if ttft is not None:
            parts += (tr.ttft, D(ttft))
        if rec.usage_estimated:
            parts.append(tr.estimated)
        if self.attrs:
            parts.append(tr.encoder.attributes(self.attrs))
        if ttft is not None:  # events 11
            before, after = tr.first_token
            parts += (before, Q(offset + int((rec.t0 + ttft) * 1e9)), after)
        parts.append(kept[2])
        span = b"".join(parts)
        q = tr.spans
        if len(q) < tr.room:  # the batcher's queue, as Batcher.add would (Tracing.spans)
            q.append(span)
        else:
            tr.emit(span)

    @property
    def ids(self) -> tuple[str, str]:
        """(trace id, span id) of the request's span, as hex, for the access log."""
        return self.trace_id.hex(), self.span_id.hex()


class AttemptTrace:
    """One attempt's CLIENT span: its child `traceparent` goes to the engine; it ends when the slot is freed."""

    __slots__ = ("error", "failure", "known", "request", "span_id", "start")

    def __init__(self, request: RequestTrace, known: AttemptPieces | None, start: int = 0) -> None:
        self.request = request
        self.span_id = (getrandbits(64) or 1).to_bytes(8, "big")
        self.known = known  # its name and values, and their bytes (Tracing.client); None: not sampled
        self.start = start
        self.failure: tuple[Any, ...] = ()  # FAILURE_KEYS' values, when it failed
        self.error: str | None = None

    def inject(self, headers: dict[str, str]) -> None:
        """The W3C `traceparent` (and the client's `tracestate`) of this attempt, on the engine's request."""
        r = self.request
        headers["traceparent"] = f"00-{r.trace_id.hex()}-{self.span_id.hex()}-{'01' if r.sampled else '00'}"
        if r.state:
            headers["tracestate"] = r.state

    def failed(self, err: Any) -> None:
        """The attempt failed before any output: the error on its span (code, status, retryable)."""
        self.failure = (err.code, err.status, bool(err.retryable))
        self.error = err.code

    def end(self) -> None:
        """Its span written (from the bytes its deployment's and route's spans keep) and queued."""
        r = self.request
        known = self.known
        if known is None:
            return
        end = time.time_ns()
        tr = r.tracing
        if self.failure:
            failed = (FAILURE_KEYS, self.failure, NO_ATTRS, (), self.error)
            ids = (r.trace_id, self.span_id, r.span_id, r.state)
            span = tr.encoder.span((known[0], CLIENT, *ids, self.start, end, CLIENT_KEYS, known[1], *failed))
        else:
            span = b"".join(
                (
                    otlp.TRACE_ID,
                    r.trace_id,
                    otlp.SPAN_ID,
                    self.span_id,
                    r.state_field,
                    otlp.PARENT_ID,
                    r.span_id,
                    known[2],
                    TIMES(self.start, END, end),
                    known[3],
                )
            )
        q = tr.spans
        if len(q) < tr.room:  # the batcher's queue, as Batcher.add would (Tracing.spans)
            q.append(span)
        else:
            tr.emit(span)
