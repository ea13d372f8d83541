"""How OTLP trace export reaches a receiver: the senders that otlp.py's export thread hands each batch's
`ExportTraceServiceRequest` bytes to. OTLP/HTTP (`HttpSender`: POST /v1/traces, application/x-protobuf, on one
kept connection, each answer read by httptools' parser as upstream/h1_client.py reads engines') or OTLP/gRPC
(`GrpcSender`: `TraceService/Export`, the bytes as they are; grpcio is imported only when this sender is made,
i.e. only with protocol grpc), each with OTEL_EXPORTER_OTLP_(TRACES_)HEADERS and
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

import httptools


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
    length), a send is one `sendall` (two for a large body), and the answer is fed to httptools' parser (llhttp,
    as upstream/h1_client.py reads engines) for its status and the end of its body, never made into a message
    object; http.client spent ~400K instructions an export there (bench/whole_instructions.py). A failure on a
    kept connection (the receiver closed it, reset, timed out) is tried once more on a new one, as before; an
    answer other than 2xx raises (the batch is counted as dropped by the caller)."""

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
        self._answer = _Answer()

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
                status, keep = self._answer.read(sock)
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
        self._answer.start()  # a new connection, a new parser: llhttp has no reset
        self._sock = sock
        return sock

    def close(self) -> None:
        self._answer.parser = None  # it points back at the answer: let go of the cycle with the connection
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_JOIN_MAX = 1 << 16  # a body up to this goes in one sendall with its head (copied once); a larger one after it
_HEAD_MAX = 1 << 16  # an answer's head longer than this is a broken receiver


class _Answer:
    """The receiver's answers on one connection, as httptools' parser calls back (one parser a connection, fed
    each answer in turn: llhttp starts the next message where one ends). `read` feeds it what the socket gives
    until the final answer is complete: a 1xx answer (100 Continue) before it is parsed and passed over, a body
    is skipped by the parser, whatever way it ends (content-length, chunked), never copied. An answer with
    neither a length nor chunks ends with the connection, which llhttp is never told (httptools has no EOF
    call): the receiver's close after such a head completes it here, and the connection is not kept."""

    __slots__ = ("done", "keep", "parser", "sized", "status")

    def __init__(self) -> None:
        self.parser: Any = None  # httptools.HttpResponseParser, made per connection (`start`)
        self.status = 0  # the final answer's, once its head is in
        self.sized = False  # it has a content-length or chunks: its end is in the bytes, not the close
        self.done = False
        self.keep = False

    def start(self) -> None:
        self.parser = httptools.HttpResponseParser(self)

    def read(self, sock: socket.socket) -> tuple[int, bool]:
        """Reads one answer to the end of its body: (its status, whether the connection may be kept). A malformed
        one, or a close before its end, raises ConnectionError (an OSError: the sender's retry and close)."""
        self.status, self.done = 0, False
        parser = self.parser
        head = 0
        while not self.done:
            chunk = sock.recv(65536)
            if not chunk:
                if self.status and not self.sized:  # no length: the body ended with the connection
                    return self.status, False
                if self.status:
                    raise ConnectionError("OTLP receiver closed the connection in an answer's body")
                raise ConnectionError("OTLP receiver closed the connection before answering")
            try:
                parser.feed_data(chunk)
            except httptools.HttpParserError as e:
                raise ConnectionError(f"OTLP receiver: not an HTTP answer: {e}") from None
            if not self.status:
                head += len(chunk)
                if head > _HEAD_MAX:
                    raise ConnectionError("OTLP receiver: an answer's head too long")
        return self.status, self.keep

    # -- httptools callbacks (no on_body: a body is passed over in C) ----------------------------------------
    def on_message_begin(self) -> None:
        if self.done:  # bytes after the final answer: a receiver out of step, its connection not kept
            self.keep = False
        self.sized = False

    def on_header(self, name: bytes, value: bytes) -> None:
        n = len(name)
        if n == 14:
            if name.lower() == b"content-length":
                self.sized = True
        elif n == 17 and name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
            self.sized = True

    def on_headers_complete(self) -> None:
        if not self.done:  # (after it: the head of bytes that followed the final answer, not its status)
            status = self.parser.get_status_code()
            if status >= 200:  # not an interim answer (100 Continue): the final one follows that on this parser
                self.status = status

    def on_message_complete(self) -> None:
        if self.status and not self.done:  # the final answer's end (a 1xx one completes too, before it)
            self.done = True
            self.keep = self.parser.should_keep_alive()


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
