"""Real OTLP trace receivers for tests, over HTTP and gRPC, built on the official OTLP protobufs (opentelemetry-proto).

The OpenTelemetry Collector is not installable from PyPI; this is the part of it a test needs: POST /v1/traces
with an `ExportTraceServiceRequest` (binary protobuf, gzip or not), answered with an
`ExportTraceServiceResponse`, every span kept as a `ReceivedSpan` (ids as hex, attributes as Python values).
It runs in a thread, so the gateway's exporter (the SDK's, over `requests`) talks to it as to a collector.
`otlp_grpc_receiver` is the same over gRPC: the official `TraceService/Export` service on grpcio's server.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

KINDS = {Span.SPAN_KIND_SERVER: "server", Span.SPAN_KIND_CLIENT: "client", Span.SPAN_KIND_INTERNAL: "internal"}


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


@dataclass
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, int]]
    error: bool
    resource: dict[str, Any] = field(default_factory=dict)


class OtlpReceiver:
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.headers.get("content-encoding") == "gzip":
                    data = gzip.decompress(data)
                if self.path != "/v1/traces" or not self.headers.get("content-type", "").startswith(
                    "application/x-protobuf"
                ):
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver._take(ExportTraceServiceRequest.FromString(data))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def _take(self, req: ExportTraceServiceRequest) -> None:
        got = []
        for rs in req.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(
                        ReceivedSpan(
                            s.name,
                            KINDS.get(s.kind, str(s.kind)),
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                            s.start_time_unix_nano,
                            s.end_time_unix_nano,
                            {a.key: _value(a.value) for a in s.attributes},
                            [(e.name, e.time_unix_nano) for e in s.events],
                            s.status.code == s.status.STATUS_CODE_ERROR,
                            resource,
                        )
                    )
        with self._lock:
            self.requests += 1
            self.spans.extend(got)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        return [s for s in self.spans if s.trace_id == trace_id]

    def roots(self) -> list[ReceivedSpan]:
        ids = {s.span_id for s in self.spans}
        return [s for s in self.spans if s.parent_id not in ids]


@contextmanager
def otlp_receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver()
    t = threading.Thread(target=r.server.serve_forever, daemon=True)
    t.start()
    try:
        yield r
    finally:
        r.server.shutdown()
        r.server.server_close()


@contextmanager
def otlp_grpc_receiver() -> Iterator[OtlpReceiver]:
    """The receiver over gRPC (the HTTP server is made but not served): `endpoint` is http://127.0.0.1:<port>."""
    from concurrent import futures

    import grpc
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc as svc

    r = OtlpReceiver()
    r.server.server_close()

    class Service(svc.TraceServiceServicer):
        def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
            r._take(request)
            return ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    svc.add_TraceServiceServicer_to_server(Service(), server)
    r.port = server.add_insecure_port("127.0.0.1:0")
    r.endpoint = f"http://127.0.0.1:{r.port}"
    server.start()
    try:
        yield r
    finally:
        server.stop(None)
