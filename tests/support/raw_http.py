"""A raw HTTP/1.1 client over a socket, for requests no well-behaved client library would send:
bogus Content-Length, invalid UTF-8, trickled bytes, oversized headers."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


def request_bytes(
    method: str,
    path: str,
    headers: dict[str, str] | list[tuple[str, str]],
    body: bytes = b"",
    *,
    content_length: str | None = "auto",
) -> bytes:
    items = list(headers.items()) if isinstance(headers, dict) else list(headers)
    if content_length == "auto":
        items.append(("content-length", str(len(body))))
    elif content_length is not None:
        items.append(("content-length", content_length))
    head = f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in items)
    return head.encode("latin-1", "replace") + b"\r\n" + body


def exchange(port: int, data: bytes, timeout: float = 10.0) -> RawResponse | None:
    """Send `data`, read until the server closes; None if it closed without an answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)  # a server that answers early may stop reading: its answer can still be there
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                b = s.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not b:
                break
            chunks.append(b)
    return parse(b"".join(chunks))


def parse(raw: bytes) -> RawResponse | None:
    if not raw.startswith(b"HTTP/1."):
        return None
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    return RawResponse(status, headers, body)


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size_line, _, rest = data.partition(b"\r\n")
        try:
            size = int(size_line.split(b";")[0], 16)
        except ValueError:
            break
        if size == 0:
            break
        out += rest[:size]
        data = rest[size + 2 :]
    return out
