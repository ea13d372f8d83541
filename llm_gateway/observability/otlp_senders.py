"""How OTLP trace export reaches a receiver: the senders that otlp.py's export thread hands each batch's
`ExportTraceServiceRequest` bytes to. OTLP/HTTP (`HttpSender`: POST /v1/traces, application/x-protobuf, on one
kept connection) or OTLP/gRPC (`GrpcSender`: `TraceService/Export`, the bytes as they are; grpcio is imported only
when this sender is made, i.e. only with protocol grpc), each with OTEL_EXPORTER_OTLP_(TRACES_)HEADERS and
_COMPRESSION (gzip) as the SDK reads them. otlp_config.py picks one from the config and the OTEL_* variables.
"""

from __future__ import annotations

import gzip
import http.client
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote, urlsplit


def env_headers(var_names: tuple[str, ...]) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_(TRACES_)HEADERS: `k=v,k2=v2`, URL-encoded (the first variable set wins)."""
    for name in var_names:
        raw = os.environ.get(name)
        if raw:
            out = {}
            for item in raw.split(","):
                k, sep, v = item.partition("=")
                if sep and k.strip():
                    out[unquote(k.strip()).lower()] = unquote(v.strip())
            return out
    return {}


def _env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


class HttpSender:
    """OTLP/HTTP: POST protobuf bytes to the traces URL on one kept connection (the export thread's)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        u = urlsplit(url)
        self.url, self.timeout_s = url, timeout_s
        self._https, self._host, self._path = u.scheme == "https", u.netloc, u.path or "/v1/traces"
        if u.query:
            self._path += "?" + u.query
        self._headers = {"content-type": "application/x-protobuf", "user-agent": "llm-gateway"}
        self._headers.update(env_headers(("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")))
        self._gzip = _env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION") == "gzip"
        if self._gzip:
            self._headers["content-encoding"] = "gzip"
        self._conn: http.client.HTTPConnection | None = None

    def send(self, body: bytes) -> None:
        if self._gzip:
            body = gzip.compress(body)
        for retry in (False, True):  # a kept connection the receiver closed: once more on a new one
            if self._conn is None:
                cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
                self._conn = cls(self._host, timeout=self.timeout_s)
            try:
                self._conn.request("POST", self._path, body, self._headers)
                resp = self._conn.getresponse()
                resp.read()
            except (OSError, http.client.HTTPException):
                self.close()
                if retry:
                    raise
                continue
            if resp.status >= 300:
                raise OSError(f"OTLP receiver answered {resp.status}")
            return

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class GrpcSender:
    """OTLP/gRPC: the bytes as the request of `TraceService/Export` (no serializer: grpcio sends bytes as they are)."""

    METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

    def __init__(self, endpoint: str, timeout_s: float, insecure: bool | None) -> None:
        import grpc  # type: ignore[import-untyped]

        u = urlsplit(endpoint if "://" in endpoint else "//" + endpoint)
        target = u.netloc or endpoint
        if insecure is None:
            flag = _env("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE") or ""
            insecure = u.scheme == "http" or flag.lower() == "true"
        self.url, self.timeout_s = target, timeout_s
        self._channel = (
            grpc.insecure_channel(target) if insecure else grpc.secure_channel(target, grpc.ssl_channel_credentials())
        )
        self._export: Callable[..., Any] = self._channel.unary_unary(self.METHOD)
        headers = env_headers(("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"))
        self._metadata = tuple(headers.items())
        gz = _env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION") == "gzip"
        self._compression = grpc.Compression.Gzip if gz else None

    def send(self, body: bytes) -> None:
        self._export(body, timeout=self.timeout_s, metadata=self._metadata, compression=self._compression)

    def close(self) -> None:
        self._channel.close()
