"""How OTLP trace export reaches a receiver: the senders that otlp.py's export thread hands each batch's
`ExportTraceServiceRequest` bytes to. OTLP/HTTP (`HttpSender`: POST /v1/traces, application/x-protobuf, on one
kept connection) or OTLP/gRPC (`GrpcSender`: `TraceService/Export`, the bytes as they are; grpcio is imported only
when this sender is made, i.e. only with protocol grpc), each with OTEL_EXPORTER_OTLP_(TRACES_)HEADERS and
_COMPRESSION (gzip) as the SDK reads them. otlp_config.py picks one from the config and the OTEL_* variables.
"""

from __future__ import annotations

import gzip
import os
import socket
import ssl
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
    """OTLP/HTTP: POST protobuf bytes to the traces URL on one kept connection (the export thread's).

    Its own HTTP/1.1 on a socket rather than http.client's: the request's head is written once (all but the
    length), a send is one `sendall` (two for a large body) and the answer's head is read for its status and how
    its body ends (content-length, chunked, or the connection's close), never parsed into a message object;
    http.client spent ~400K instructions an export there (bench/whole_instructions.py). A failure on a kept
    connection (the receiver closed it, reset, timed out) is tried once more on a new one, as before; an answer
    other than 2xx raises (the batch is counted as dropped by the caller)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        u = urlsplit(url)
        self.url, self.timeout_s = url, timeout_s
        self._https = u.scheme == "https"
        self._addr = (u.hostname or "localhost", u.port or (443 if self._https else 80))
        self._path = u.path or "/v1/traces"
        if u.query:
            self._path += "?" + u.query
        self._headers = {"content-type": "application/x-protobuf", "user-agent": "llm-gateway"}
        self._headers.update(env_headers(("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")))
        self._gzip = _env("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION") == "gzip"
        if self._gzip:
            self._headers["content-encoding"] = "gzip"
        host = u.netloc.rpartition("@")[2]
        lines = [f"POST {self._path} HTTP/1.1", f"host: {host}", *(f"{k}: {v}" for k, v in self._headers.items())]
        self._head = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")
        self._sock: socket.socket | None = None

    def send(self, body: bytes) -> None:
        if self._gzip:
            body = gzip.compress(body)
        head = self._head + str(len(body)).encode() + b"\r\n\r\n"
        for retry in (False, True):  # a kept connection the receiver closed: once more on a new one
            try:
                sock = self._sock if self._sock is not None else self._connect()
                if len(body) <= _JOIN_MAX:
                    sock.sendall(head + body)
                else:  # not copied again: the head, then the body
                    sock.sendall(head)
                    sock.sendall(body)
                status, keep = _response(sock)
            except OSError:
                self.close()
                if retry:
                    raise
                continue
            if not keep:
                self.close()
            if status >= 300:
                raise OSError(f"OTLP receiver answered {status}")
            return

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._addr, timeout=self.timeout_s)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._https:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=self._addr[0])
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        return sock

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_JOIN_MAX = 1 << 16  # a body up to this goes in one sendall with its head (copied once); a larger one after it
_HEAD_MAX = 1 << 16  # an answer's head longer than this is a broken receiver


def _response(sock: socket.socket) -> tuple[int, bool]:
    """Reads one answer to the end of its body: (its status, whether the connection may be kept). A 1xx answer is
    skipped; a malformed one raises ConnectionError (an OSError: the sender's retry and close)."""
    buf = b""
    while True:
        end = buf.find(b"\r\n\r\n")
        while end < 0:
            if len(buf) > _HEAD_MAX:
                raise ConnectionError("OTLP receiver: an answer's head too long")
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("OTLP receiver closed the connection before answering")
            buf += chunk
            end = buf.find(b"\r\n\r\n")
        head, buf = buf[:end], buf[end + 4 :]
        lines = head.split(b"\r\n")
        parts = lines[0].split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
            raise ConnectionError(f"OTLP receiver: not an HTTP answer: {lines[0][:80]!r}")
        status = int(parts[1])
        keep = parts[0] != b"HTTP/1.0"
        length = -1
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise ConnectionError("OTLP receiver: a bad content-length") from None
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                v = value.strip().lower()
                keep = v == b"keep-alive" if not keep else v != b"close"
        if 100 <= status < 200:  # 100 Continue and the like: the answer follows
            continue
        if status in (204, 304):
            return status, keep
        if chunked:
            _read_chunked(sock, buf)
        elif length >= 0:
            _read_exactly(sock, buf, length)
        else:  # no length: the body ends with the connection
            while sock.recv(65536):
                pass
            keep = False
        return status, keep


def _read_exactly(sock: socket.socket, buf: bytes, n: int) -> bytes:
    """Reads past `n` bytes of a body (`buf`: what came before); what followed them in `buf` is returned."""
    while len(buf) < n:
        chunk = sock.recv(min(65536, n - len(buf)))
        if not chunk:
            raise ConnectionError("OTLP receiver closed the connection in an answer's body")
        buf += chunk
    return buf[n:]


def _read_chunked(sock: socket.socket, buf: bytes) -> None:
    """A chunked body to its last chunk and trailer (`buf`: what came with the head)."""
    while True:
        while b"\r\n" not in buf:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("OTLP receiver closed the connection in a chunked answer")
            buf += chunk
        line, _, buf = buf.partition(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0], 16)
        except ValueError:
            raise ConnectionError("OTLP receiver: a bad chunk size") from None
        if size == 0:  # the trailer: lines up to an empty one
            while True:
                while b"\r\n" not in buf:
                    chunk = sock.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                line, _, buf = buf.partition(b"\r\n")
                if not line:
                    return
        buf = _read_exactly(sock, buf, size + 2)  # the chunk and its CRLF


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
