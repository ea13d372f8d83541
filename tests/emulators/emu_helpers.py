"""Test helpers for the emulator suite: a raw HTTP/1.1 client, capture loading, JSON shapes and values.

The raw client returns the status line, the headers in wire order and case, the body
(de-chunked) and whether the server reset or closed the connection, so tests can compare
bytes with the raw engine captures vendored in ``tests/emulators/captures``.

A capture that is missing fails the test (it is part of the repository, never optional), and every
capture read is recorded in ``READ`` so ``conftest.py`` can tell, after a full run of this suite, which
capture files no test read. ``shape`` compares layouts; ``pick`` the values an adapter depends on
(error types, status codes, finish reasons, usage numbers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from llm_gateway_emulators import Emulator, EmulatorConfig

CAPTURES = Path(__file__).resolve().parent / "captures"


@dataclass
class Response:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool = False
    reset: bool = False
    eof: bool = False
    raw: bytes = b""
    chunks: list[bytes] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    @property
    def header_names(self) -> list[str]:
        return [k for k, _ in self.headers]

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self, sep: bytes = b"\n\n") -> list[bytes]:
        return [e for e in self.body.split(sep) if e.strip()]

    def data(self, sep: bytes = b"\n\n") -> list[Any]:
        """``data:`` payloads of an SSE body: JSON objects, or the raw string ([DONE])."""
        out: list[Any] = []
        for ev in self.events(sep):
            for line in ev.split(b"\n" if sep == b"\n\n" else b"\r\n"):
                if line.startswith(b"data: "):
                    payload = line[6:]
                    try:
                        out.append(json.loads(payload))
                    except ValueError:
                        out.append(payload.decode(errors="replace"))
        return out

    def ndjson(self) -> list[Any]:
        return [json.loads(line) for line in self.body.split(b"\n") if line.strip()]


#: Capture files read so far in this session, relative to ``CAPTURES`` (posix).
READ: set[str] = set()


def capture_bytes(rel: str) -> bytes:
    """The raw bytes of a capture file; a missing one fails the test."""
    path = CAPTURES / rel
    if not path.is_file():
        pytest.fail(f"capture {rel} is missing from {CAPTURES} (captures are part of the repository)")
    READ.add(rel)
    return path.read_bytes()


def capture_text(rel: str) -> str:
    """A capture that is notes or a log rather than one HTTP exchange."""
    return capture_bytes(rel).decode()


def capture(rel: str) -> Response:
    """One raw HTTP exchange from a capture file (an optional ``$ curl ...`` line first)."""
    return parse_capture(capture_bytes(rel))


def parse_capture(raw: bytes) -> Response:
    if raw.startswith(b"$ "):
        raw = raw.split(b"\n", 1)[1]
    sep = raw.find(b"\r\n\r\n")
    if sep < 0 or (raw.find(b"\n\n") != -1 and raw.find(b"\n\n") < sep):
        head, body = raw.split(b"\n\n", 1)
    else:
        head, body = raw[:sep], raw[sep + 4 :]
    lines = head.decode("latin-1").replace("\r", "").split("\n")
    headers = [(k, v.strip()) for k, v in (line.split(":", 1) for line in lines[1:] if ":" in line)]
    resp = Response(int(lines[0].split(" ")[1]), headers, body)
    cl = resp.header("content-length")
    if cl is not None:  # the capture scripts appended a newline after the body
        resp.body = body[: int(cl)]
    return resp


def shape(obj: Any) -> Any:
    """Keys in order at every level, values reduced to their JSON type."""
    if isinstance(obj, dict):
        return [(k, shape(v)) for k, v in obj.items()]
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    if obj is None:
        return "null"
    if isinstance(obj, bool):
        return "bool"
    if isinstance(obj, (int, float)):
        return "number"
    return type(obj).__name__


def keys(obj: dict[str, Any]) -> list[str]:
    return list(obj.keys())


_MISSING = "<missing>"


def pick(obj: Any, *paths: str) -> dict[str, Any]:
    """The values at dotted paths (``"choices.0.finish_reason"``, ``"usage.completion_tokens"``; list
    indexes may be negative), ``"<missing>"`` where there is none: for comparing the values that matter
    with a capture's, where ``shape`` compares only the layout."""
    out: dict[str, Any] = {}
    for path in paths:
        cur = obj
        for part in path.split("."):
            if isinstance(cur, dict) and part in cur:
                cur = cur[part]
            elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
                cur = cur[int(part)]
            else:
                cur = _MISSING
                break
        out[path] = cur
    return out


def usage_adds_up(usage: dict[str, Any]) -> bool:
    """total_tokens == prompt_tokens + completion_tokens (prompt counts differ: the emulators do not
    run the engines' tokenizers, so only the relation is compared with a capture)."""
    return bool(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"])


async def request(
    url: str,
    method: str = "GET",
    path: str = "/",
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
    raw_body: bytes | None = None,
) -> Response:
    """One request on a fresh connection; reads until the message ends, the server closes
    or resets, or ``timeout`` (then asyncio.TimeoutError)."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    data = raw_body if raw_body is not None else (b"" if body is None else json.dumps(body).encode())
    hdrs = {"Host": f"{host}:{port}"}
    if data or method in ("POST", "PUT"):
        hdrs["Content-Type"] = "application/json"
        hdrs["Content-Length"] = str(len(data))
    hdrs.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    reader, writer = await asyncio.open_connection(host, port, limit=64 * 1024 * 1024)
    try:
        writer.write(head.encode() + data)
        return await asyncio.wait_for(_read_response(reader), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> Response:
    buf = b""
    reset = False
    try:
        while b"\r\n\r\n" not in buf:
            chunk = await reader.read(65536)
            if not chunk:
                break
            buf += chunk
    except ConnectionResetError:
        reset = True
    if b"\r\n\r\n" not in buf:
        return Response(0, [], b"", reset=reset, eof=True, raw=buf)
    head, rest = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = [(k, v.strip()) for k, v in (line.split(":", 1) for line in lines[1:])]
    resp = Response(status, headers, b"", raw=buf)
    te = resp.header("transfer-encoding")
    cl = resp.header("content-length")
    try:
        if te and te.lower() == "chunked":
            resp.chunked = True
            await _read_chunked(reader, rest, resp)
        elif cl is not None:
            need = int(cl)
            while len(rest) < need:
                chunk = await reader.read(65536)
                if not chunk:
                    resp.eof = True
                    break
                rest += chunk
            resp.body = rest[:need]
        else:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                rest += chunk
            resp.body, resp.eof = rest, True
    except (ConnectionResetError, asyncio.IncompleteReadError):
        resp.reset = True
    return resp


async def _read_chunked(reader: asyncio.StreamReader, rest: bytes, resp: Response) -> None:
    """De-chunk into ``resp.body`` as data arrives, so a reset keeps what came before it."""
    buf = rest
    while True:
        while b"\r\n" not in buf:
            more = await reader.read(65536)
            if not more:
                resp.eof = True
                resp.body += buf
                return
            buf += more
        size_line, buf = buf.split(b"\r\n", 1)
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return
        while len(buf) < size + 2:
            more = await reader.read(65536)
            if not more:
                resp.eof = True
                resp.body += buf
                return
            buf += more
        resp.chunks.append(buf[:size])
        resp.body += buf[:size]
        buf = buf[size + 2 :]


@contextlib.asynccontextmanager
async def running(engine: str, **knobs: Any) -> AsyncIterator[Emulator]:
    knobs.setdefault("model", "tiny")
    async with Emulator(EmulatorConfig(engine=engine, **knobs), port=0) as emu:
        yield emu


def chat(max_tokens: int | None = 4, stream: bool = False, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stream:
        body["stream"] = True
    body.update(extra)
    return body
