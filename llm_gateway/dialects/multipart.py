"""A `multipart/form-data` body (RFC 7578) read whole, as the `openai` SDK sends `POST /v1/files`: its fields by
name, each with its filename (files) and bytes. The body is already bounded by the caller's size limit; this
splits it on the boundary without copying the parts more than once. Part headers other than
Content-Disposition are ignored (a part's own Content-Type says nothing the route needs)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from llm_gateway.errors import InvalidRequest

_BOUNDARY = re.compile(rb'boundary=(?:"([^"]{1,200})"|([^\s;,]{1,200}))', re.IGNORECASE)
_PARAM = re.compile(rb';\s*([A-Za-z*]+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Part:
    name: str
    filename: str | None
    data: bytes
    #: where `data` lies in the body: body[start:end] (to splice a field's value: dialects/audio.py)
    start: int = 0
    end: int = 0


def boundary_of(content_type: bytes | None, fields: str = "the fields 'file' and 'purpose'") -> bytes:
    if content_type is None or not content_type.lower().startswith(b"multipart/form-data"):
        raise InvalidRequest(f"Upload the file as multipart/form-data ({fields}).")
    m = _BOUNDARY.search(content_type)
    if m is None:
        raise InvalidRequest("The multipart/form-data body names no boundary.")
    return m.group(1) or m.group(2)


def parse(body: bytes, boundary: bytes) -> dict[str, Part]:
    """The body's parts by name (the first of a name wins)."""
    delimiter = b"--" + boundary
    start = body.find(delimiter)
    if start < 0:
        raise InvalidRequest("The multipart/form-data body is malformed (no boundary found).")
    parts: dict[str, Part] = {}
    at = start + len(delimiter)
    while True:
        if body.startswith(b"--", at):  # the closing delimiter
            return parts
        if not body.startswith(b"\r\n", at):
            raise InvalidRequest("The multipart/form-data body is malformed.")
        head_end = body.find(b"\r\n\r\n", at + 2)
        end = body.find(b"\r\n" + delimiter, head_end + 4)
        if head_end < 0 or end < 0:
            raise InvalidRequest("The multipart/form-data body is malformed (a part does not end).")
        name, filename = _disposition(body[at + 2 : head_end])
        if name is not None and name not in parts:
            parts[name] = Part(name, filename, body[head_end + 4 : end], head_end + 4, end)
        at = end + 2 + len(delimiter)


def _disposition(head: bytes) -> tuple[str | None, str | None]:
    for line in head.split(b"\r\n"):
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-disposition":
            params = {k.lower(): v.replace(b'\\"', b'"') for k, v in _PARAM.findall(value)}
            name, filename = params.get(b"name"), params.get(b"filename")
            return (
                None if name is None else name.decode("utf-8", "replace"),
                None if filename is None else filename.decode("utf-8", "replace"),
            )
    return None, None
