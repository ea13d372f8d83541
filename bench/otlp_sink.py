"""An OTLP/HTTP trace receiver for benchmarks: answers POST /v1/traces with 200 and counts the spans (parsed with
the official protobufs, opentelemetry-proto), so an A/B of tracing on (bench/ledger_ab.py) exports to a real
receiver and shows that no span was dropped. Run it pinned to the load CPU, on 127.0.0.1 only:

    taskset -c 1 .venv/bin/python bench/otlp_sink.py --port 4318 --out /tmp/otlp-sink.json

It writes {"requests": n, "spans": n, "bytes": n} to --out after every request.
"""

from __future__ import annotations

import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, default=4318)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    seen = {"requests": 0, "spans": 0, "bytes": 0}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers.get("content-length", "0")))
            req = ExportTraceServiceRequest.FromString(data)
            seen["requests"] += 1
            seen["bytes"] += len(data)
            seen["spans"] += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
            a.out.write_text(json.dumps(seen))
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    ThreadingHTTPServer(("127.0.0.1", a.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
