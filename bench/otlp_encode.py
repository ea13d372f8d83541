"""CPU per span of OTLP encoding, three ways in one run (issue 40): the gateway's own protobuf writer
(llm_gateway/observability/otlp.py's Encoder.span, the path of spans other than tracing.py's request and attempt
spans, which join kept bytes instead: tests/unit/test_trace_spans_written.py), the official generated classes
(opentelemetry-proto) built in bulk per batch, and the SDK's exporter encoding of ReadableSpans (what the gateway
used before); and the ids' cost, `random.getrandbits` against `secrets.randbits`.

    PYTHONPATH=. .venv/bin/python bench/otlp_encode.py [--batch 512] [--rounds 5]

Spans are a gateway request's two: its SERVER span (20 attributes) and its attempt's CLIENT span (11).
The fastest of the rounds, in this thread's CPU time (the box is shared), µs per span.
"""

from __future__ import annotations

import argparse
import random
import secrets
import time
from typing import Any

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import CLIENT_KEYS, SERVER_KEYS, SERVER_OWN_KEYS, UNIQUE_KEYS

RESOURCE = {"service.name": "llm-gateway", "telemetry.sdk.language": "python"}


def spans(n: int) -> list[otlp.Span]:
    out: list[otlp.Span] = []
    t = time.time_ns()
    for i in range(n // 2):
        trace_id, root = random.randbytes(16), random.randbytes(8)
        server = {
            "gateway.priority_class": "default",
            "http.request.method": "POST",
            "url.path": "/v1/chat/completions",
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "fake-model",
            "gen_ai.response.model": "fake-model",
            "gen_ai.usage.input_tokens": 40,
            "gen_ai.usage.output_tokens": 64,
            "gateway.deployment": "fake-a",
            "gateway.engine": "vllm",
            "gateway.ttft_s": 0.0123 + i * 1e-6,
            "gateway.key.name": "bench",
            "gateway.request_id": f"{random.getrandbits(64):016x}",
            "gateway.stream": False,
            "gateway.attempts": 1,
            "gateway.retries": 0,
            "gateway.queue_wait_s": 0.0,
            "gateway.outcome": "ok",
            "gateway.cancelled": False,
            "http.response.status_code": 200,
            "gen_ai.response.finish_reasons": ("stop",),  # a tuple, as tracing.py keeps them
        }
        client = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": "vllm",
            "gen_ai.request.model": "fake-model",
            "server.address": "127.0.0.1",
            "server.port": 8001,
            "gateway.deployment": "fake-a",
            "gateway.engine": "vllm",
            "gateway.model": "fake-model",
            "gateway.routing.strategy": "least_load",
            "gateway.attempt": 1,
            "gateway.priority_class": "default",
        }
        ev = (("gen_ai.first_token", t + 12_000_000),)
        fixed = tuple(server.pop(k, None) for k in SERVER_KEYS)  # the request's facts that recur (error.type: None)
        own = tuple(server.pop(k, None) for k in SERVER_OWN_KEYS)  # its own, by position
        head = ("chat fake-model", otlp.SERVER, trace_id, root, b"", "", t, t + 80_000_000)
        out.append((*head, SERVER_KEYS, fixed, SERVER_OWN_KEYS, own, server, ev, None))
        attempt = random.randbytes(8)
        head = ("chat fake-model", otlp.CLIENT, trace_id, attempt, root, "", t + 10, t + 79_000_000)
        out.append((*head, CLIENT_KEYS, tuple(client[k] for k in CLIENT_KEYS), (), (), otlp.NO_ATTRS, (), None))
    return out


def merged(s: otlp.Span) -> dict[str, Any]:
    """A span's fixed, own and other attributes in one dict, as the official classes and the SDK take them."""
    keys, values, own, own_values, attrs = s[8], s[9], s[10], s[11], s[12]
    pairs = [*zip(keys, values, strict=True), *zip(own, own_values, strict=True), *attrs.items()]
    return {k: v for k, v in pairs if v is not None}


def writer(batch: list[otlp.Span]) -> bytes:
    return ENC.request(list(map(ENC.span, batch)))


def _pb_value(pb: Any, v: Any) -> Any:
    AnyValue, ArrayValue = pb["AnyValue"], pb["ArrayValue"]
    t = type(v)
    if t is str:
        return AnyValue(string_value=v)
    if t is bool:
        return AnyValue(bool_value=v)
    if t is int:
        return AnyValue(int_value=v)
    if t is float:
        return AnyValue(double_value=v)
    return AnyValue(array_value=ArrayValue(values=[_pb_value(pb, x) for x in v]))


def official(batch: list[otlp.Span]) -> bytes:
    pb = PB
    KV, PbSpan = pb["KeyValue"], pb["Span"]
    out = []
    for s in batch:
        name, kind, tid, sid, parent, state, start, end = s[:8]
        events = s[13]
        attrs = merged(s)
        out.append(
            PbSpan(
                trace_id=tid,
                span_id=sid,
                parent_span_id=parent,
                trace_state=state,
                name=name,
                kind=kind,
                start_time_unix_nano=start,
                end_time_unix_nano=end,
                attributes=[KV(key=k, value=_pb_value(pb, v)) for k, v in attrs.items()],
                events=[PbSpan.Event(name=n, time_unix_nano=at) for n, at in events],
            )
        )
    req = pb["Request"](
        resource_spans=[
            pb["ResourceSpans"](
                resource=pb["Resource"](attributes=[KV(key=k, value=_pb_value(pb, v)) for k, v in RESOURCE.items()]),
                scope_spans=[pb["ScopeSpans"](scope=pb["Scope"](name="llm_gateway"), spans=out)],
            )
        ]
    )
    return bytes(req.SerializeToString())


def sdk_encoding(batch: list[otlp.Span]) -> Any:
    """The SDK's path: ReadableSpans (built here, as the gateway built them on the request path) encoded by the
    exporter's encode_spans, then serialized."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    res, scope = Resource.create(RESOURCE), InstrumentationScope("llm_gateway")
    kinds = {otlp.SERVER: SpanKind.SERVER, otlp.CLIENT: SpanKind.CLIENT}
    flags = TraceFlags(1)
    readable = []
    for s in batch:
        name, kind, tid_bytes, sid_bytes, parent_bytes, _, start, end = s[:8]
        events = s[13]
        tid, sid, parent = (int.from_bytes(b, "big") for b in (tid_bytes, sid_bytes, parent_bytes))
        attrs = merged(s)
        ctx = SpanContext(tid, sid, False, flags)
        par = SpanContext(tid, parent, False, flags) if parent else None
        evs = tuple(Event(n, None, at) for n, at in events)
        readable.append(ReadableSpan(name, ctx, par, res, attrs, evs, (), kinds[kind], None, None, start, end, scope))
    return lambda: encode_spans(readable).SerializeToString()


def per_span_us(fn: Any, batch: list[otlp.Span], rounds: int) -> float:
    out = []
    for _ in range(rounds):
        t = time.thread_time()
        fn(batch)
        out.append((time.thread_time() - t) * 1e6 / len(batch))
    return min(out)


def main() -> None:
    global ENC, PB
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    ENC = otlp.Encoder(RESOURCE, "llm_gateway", UNIQUE_KEYS)  # as tracing.py makes it
    batch = spans(a.batch)
    print(f"writer:             {per_span_us(writer, batch, a.rounds):6.2f} µs/span")
    try:
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as svc
        from opentelemetry.proto.common.v1 import common_pb2 as common
        from opentelemetry.proto.resource.v1 import resource_pb2 as resource
        from opentelemetry.proto.trace.v1 import trace_pb2 as trace
    except ImportError:
        print("official classes:   (opentelemetry-proto not installed)")
    else:
        PB = {
            "AnyValue": common.AnyValue,
            "ArrayValue": common.ArrayValue,
            "KeyValue": common.KeyValue,
            "Scope": common.InstrumentationScope,
            "Span": trace.Span,
            "ResourceSpans": trace.ResourceSpans,
            "ScopeSpans": trace.ScopeSpans,
            "Resource": resource.Resource,
            "Request": svc.ExportTraceServiceRequest,
        }
        assert svc.ExportTraceServiceRequest.FromString(writer(batch)) == svc.ExportTraceServiceRequest.FromString(
            official(batch)
        ), "the writer and the official classes disagree"
        print(f"official classes:   {per_span_us(official, batch, a.rounds):6.2f} µs/span")
    try:
        enc = sdk_encoding(batch)
    except ImportError:
        print("SDK encode_spans:   (the OpenTelemetry SDK / exporter not installed)")
    else:
        print(
            f"SDK encode_spans:   {per_span_us(lambda _: enc(), batch, a.rounds):6.2f} µs/span",
            "(ReadableSpans built before)",
        )
    n = 100_000
    t = time.thread_time()
    for _ in range(n):
        random.getrandbits(64)
    g = (time.thread_time() - t) * 1e9 / n
    t = time.thread_time()
    for _ in range(n):
        secrets.randbits(64)
    s = (time.thread_time() - t) * 1e9 / n
    print(f"ids: random.getrandbits(64) {g:.0f} ns, secrets.randbits(64) {s:.0f} ns")


ENC: otlp.Encoder
PB: dict[str, Any] = {}

if __name__ == "__main__":
    main()
