"""The request's and attempts' spans tracing.py writes itself (RequestTrace.end, AttemptTrace.end: joined from bytes
kept per request facts and per deployment, with the ids, times and own attributes of each) are, byte for byte, what
the plain field-by-field encoder writes for the otlp.Span they stand for, and the official protobufs read them back:
a whole answer, a stream (TTFT event, estimated usage, two reasons), a queued request, a 5xx after a failed attempt
and a retry, a client's traceparent and tracestate continued, captured content, an endpoint with no GenAI operation,
a cancelled request; each twice (the second time from what is kept)."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import (
    CLIENT_KEYS,
    FAILURE_KEYS,
    OPERATIONS,
    QUEUE_KEYS,
    QUEUE_OWN_KEYS,
    SERVER_KEYS,
    SERVER_OWN_KEYS,
)
from llm_gateway.observability.record import RequestRecord
from llm_gateway.observability.tracing import Tracing
from llm_gateway.settings import CLASS_NAMES, TracingConfig
from tests.unit.test_otlp_encoding import plain_span

pb = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2")


class Held:
    """A deployment or route as an attempt holds them: an object (tracing keeps what it knows of them by identity)."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


BACKEND = SimpleNamespace(cfg=SimpleNamespace(url="http://engine-a:8001"), kind="vllm", name="engine-a")
DEPLOYMENT = Held(backend=BACKEND, upstream_model="up-model")
ROUTE = Held(cfg=SimpleNamespace(strategy="least_load"), name="public-model")
ATTEMPT = SimpleNamespace(deployment=DEPLOYMENT, route=ROUTE, ticket=SimpleNamespace(priority=1))
CLIENT_TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

CASES: dict[str, dict[str, Any]] = {
    "whole": {"tokens": (42, 64), "told": ["length"]},
    "stream": {
        "stream": True,
        "ttft": 0.0125,
        "estimated": True,
        "reasons": b'"finish_reason":"tool_calls"} "finish_reason":"stop"',
        "tokens": (7, 2),
    },
    "queued": {"waited": 0.25, "tokens": (5, None), "told": ["stop"]},
    "failed": {"status": 502, "error": "upstream_unreachable", "retry": True, "tokens": (None, None)},
    "continued": {"headers": {b"traceparent": CLIENT_TP, b"tracestate": b"vendor=abc"}, "told": ["stop"]},
    "content": {"capture": True, "told": ["stop", "length"], "tokens": (300, 20000)},
    "other": {"endpoint": "other", "path": "/v1/other", "backend": "none", "told": ["Stop"]},
    "cancelled": {"status": 499, "outcome": "cancelled", "tokens": (1, 0)},
}


def fields(data: bytes) -> Any:
    req = pb.ExportTraceServiceRequest.FromString(data)
    (span,) = req.resource_spans[0].scope_spans[0].spans
    return span


def run(tr: Tracing, written: list[bytes], case: dict[str, Any]) -> tuple[RequestRecord, Any, list[Any]]:
    """One request through the hooks as the gateway calls them; (its record, its trace, its attempts' traces)."""
    endpoint = case.get("endpoint", "chat")
    rec = RequestRecord("0123456789abcdef01234567", time.perf_counter(), "POST", case.get("path", "/v1/x"), endpoint)
    rec.model, rec.key, rec.stream = "public-model", "team-a", case.get("stream", False)
    trace = tr.begin(rec, case.get("headers", {}))
    rec.waited_s = case.get("waited", 0.0)
    attempts = []
    for n in range(2 if case.get("retry") else 1):
        rec.attempts = n + 1
        rec.backend, rec.engine, rec.upstream_model = case.get("backend", "engine-a"), "vllm", "up-model"
        at = trace.attempt(ATTEMPT, rec, {"messages": [{"role": "user", "content": "hi"}], "system": "be brief"})
        at.inject({})
        if case.get("retry") and n == 0:
            at.failed(SimpleNamespace(code="upstream_reset", status=502, retryable=True))
        at.end()
        attempts.append(at)
    if "told" in case:
        trace.answered(b'{"answer": 1}', case["told"])
    if "reasons" in case:
        trace.finished(case["reasons"])
    rec.prompt_tokens, rec.completion_tokens = case.get("tokens", (None, None))
    rec.usage_estimated = case.get("estimated", False)
    rec.ttft_s = case.get("ttft")
    rec.status, rec.outcome, rec.error = case.get("status", 200), case.get("outcome", "success"), case.get("error")
    trace.end(rec)
    return rec, trace, attempts


def expected(rec: RequestRecord, trace: Any, attempts: list[Any], got: list[Any]) -> list[otlp.Span]:
    """The spans the request's facts make (as tracing.py's docstrings say), with the times read back from `got`."""
    out: list[otlp.Span] = []
    klass = CLASS_NAMES[1]
    times = iter((s.start_time_unix_nano, s.end_time_unix_nano) for s in got)
    ids = (trace.trace_id,)
    if rec.waited_s:
        start, end = next(times)
        queue_id = got[0].span_id
        own = (QUEUE_OWN_KEYS, (rec.waited_s,), otlp.NO_ATTRS, (), None)
        queued = ("gateway.queue", otlp.INTERNAL, *ids, queue_id, trace.span_id, trace.state, start, end)
        queued += (QUEUE_KEYS, (klass,))
        out.append((*queued, *own))
    for n, at in enumerate(attempts, 1):
        start, end = next(times)
        op = OPERATIONS.get(rec.endpoint, rec.endpoint)
        values = (op, "vllm", "up-model", "engine-a", 8001, "engine-a", "vllm", "public-model", "least_load", n, klass)
        own = (
            (FAILURE_KEYS, at.failure, otlp.NO_ATTRS, (), at.error) if at.failure else ((), (), otlp.NO_ATTRS, (), None)
        )
        head = (f"{op} up-model", otlp.CLIENT, *ids, at.span_id, trace.span_id, trace.state, start, end)
        out.append((*head, CLIENT_KEYS, values, *own))
    start, end = next(times)
    op = OPERATIONS.get(rec.endpoint)
    served = rec.backend != "none"
    values = (
        rec.method,
        rec.path,
        op,
        rec.model if op is not None else None,
        rec.upstream_model,
        rec.backend if served else None,
        rec.engine if served else None,
        rec.key,
        klass,
        rec.stream,
        rec.attempts,
        rec.attempts - 1,
        rec.outcome,
        rec.status == 499,
        rec.status,
        rec.error,
    )
    ttft = rec.ttft_s
    own_values = (
        rec.prompt_tokens,
        rec.completion_tokens,
        trace.reasons,
        rec.rid,
        rec.waited_s,
        ttft,
        True if rec.usage_estimated else None,
    )
    events = () if ttft is None else (("gen_ai.first_token", got[-1].events[0].time_unix_nano),)
    name = f"{op} {rec.model}" if op is not None else f"{rec.method} {rec.path}"
    error = (rec.error or "error") if rec.status >= 500 else None
    head = (name, otlp.SERVER, *ids, trace.span_id, trace.parent, trace.state, start, end)
    out.append((*head, SERVER_KEYS, values, SERVER_OWN_KEYS, own_values, trace.attrs, events, error))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_spans_tracing_writes_are_the_plain_encoders_bytes_of_what_they_stand_for(name: str) -> None:
    case = CASES[name]
    tr = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9", capture_content=case.get("capture", False)))
    tr.batcher.shutdown()
    written: list[bytes] = []
    tr.spans, tr.room, tr.emit = written, 1 << 30, written.append  # type: ignore[assignment]
    try:
        for _ in range(2):  # the second time from what is kept
            written.clear()
            rec, trace, attempts = run(tr, written, case)
            got = [fields(tr.encoder.request([w])) for w in written]
            want = expected(rec, trace, attempts, got)
            assert len(written) == len(want)
            for w, s in zip(written, want, strict=True):
                assert w == plain_span(s), s[0]
            server = got[-1]
            assert server.span_id == trace.span_id and server.trace_id == trace.trace_id
            attrs = {a.key for a in server.attributes}
            assert ("gen_ai.usage.input_tokens" in attrs) is (rec.prompt_tokens is not None)
            assert ("gateway.usage_estimated" in attrs) is rec.usage_estimated
            assert ("gen_ai.input.messages" in attrs) is bool(case.get("capture"))
    finally:
        tr.shutdown()
