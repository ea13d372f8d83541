"""Response-head styles of the HTTP servers the engines run on, and JSON encoders.

uvicorn (vLLM, SGLang, TabbyAPI, LMDeploy): lower-case ``date``/``server`` first, then the
app's headers, ``transfer-encoding`` last. Go net/http (Ollama): app headers sorted, then
``Date`` and ``Content-Length``/``Transfer-Encoding``. cpp-httplib (llama.cpp) is built in
its own module. Encoders: ``compact`` (orjson; pydantic/FastAPI/Go/nlohmann output) and
``pyjson`` (``json.dumps`` with its default ``", "``/``": "`` separators, used by vLLM,
SGLang and LMDeploy for in-band stream errors and by TabbyAPI/LMDeploy for chunks).
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson

from llm_gateway_emulators.textgen import http_date

Headers = list[tuple[str, str]]


class DateCache:
    """HTTP Date header value, recomputed at most once a second."""

    def __init__(self) -> None:
        self._sec = -1
        self._value = ""

    def now(self) -> str:
        sec = int(time.time())
        if sec != self._sec:
            self._sec = sec
            self._value = http_date(sec)
        return self._value


def compact(obj: Any) -> bytes:
    return orjson.dumps(obj)


def pyjson(obj: Any, ensure_ascii: bool = True) -> bytes:
    return json.dumps(obj, ensure_ascii=ensure_ascii).encode()


def uvicorn(date: str, pairs: Headers, chunked: bool = False) -> Headers:
    out: Headers = [("date", date), ("server", "uvicorn"), *pairs]
    if chunked:
        out.append(("transfer-encoding", "chunked"))
    return out


def uvicorn_json(date: str, length: int, ctype: str = "application/json", after: Headers | None = None) -> Headers:
    return uvicorn(date, [("content-length", str(length)), ("content-type", ctype), *(after or [])])


def go(date: str, pairs: Headers, length: int | None) -> Headers:
    out: Headers = sorted(pairs)
    out.append(("Date", date))
    if length is None:
        out.append(("Transfer-Encoding", "chunked"))
    else:
        out.append(("Content-Length", str(length)))
    return out


HTML_PAGE = (
    b"<!DOCTYPE html>\n<html>\n<head><title>502 Bad Gateway</title></head>\n"
    b"<body>\n<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx</center>\n"
    b"</body>\n</html>\n"
)

GARBAGE_EVENTS = (
    b"data: {not json at all\n\n"
    b'data: {"choices": [{"delta": {"content": "unterminated\n\n'
    b"this line has no field name\n\n"
    b"data: \xff\xfe\x00\x01 binary junk\n\n"
    b"event: \n\n"
)
