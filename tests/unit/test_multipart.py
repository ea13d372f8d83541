"""The multipart/form-data reader of `POST /v1/files` (dialects/multipart.py): fields and files by name, a quoted
boundary, a body that holds the delimiter's bytes inside a part, and malformed bodies refused as 400s."""

from __future__ import annotations

import pytest

from llm_gateway.dialects import multipart
from llm_gateway.errors import InvalidRequest


def form(boundary: bytes, *parts: tuple[bytes, bytes]) -> bytes:
    out = b""
    for head, data in parts:
        out += b"--" + boundary + b"\r\n" + head + b"\r\n\r\n" + data + b"\r\n"
    return out + b"--" + boundary + b"--\r\n"


def test_fields_and_files_by_name() -> None:
    body = form(
        b"xyz",
        (b'Content-Disposition: form-data; name="purpose"', b"batch"),
        (b'Content-Disposition: form-data; name="file"; filename="in \\"1\\".jsonl"\r\nContent-Type: x', b"a\r\nb--xy"),
    )
    parts = multipart.parse(body, multipart.boundary_of(b'multipart/form-data; boundary="xyz"'))
    assert parts["purpose"].data == b"batch" and parts["purpose"].filename is None
    assert parts["file"].data == b"a\r\nb--xy" and parts["file"].filename == 'in "1".jsonl'


@pytest.mark.parametrize(
    "content_type", [None, b"application/json", b"multipart/form-data", b"multipart/form-data; charset=utf-8"]
)
def test_a_body_that_is_not_a_form_is_refused(content_type: bytes | None) -> None:
    with pytest.raises(InvalidRequest):
        multipart.boundary_of(content_type)


@pytest.mark.parametrize(
    "body",
    [b"no delimiter at all", b"--b\r\nContent-Disposition: form-data; name=x\r\n\r\nno end", b"--bXX"],
)
def test_malformed_bodies_are_refused(body: bytes) -> None:
    with pytest.raises(InvalidRequest):
        multipart.parse(body, b"b")
