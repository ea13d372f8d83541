"""Ollama wire details: Go's JSON escaping, the Host guard, native NDJSON stream lines.

``go_json`` mimics encoding/json (compact, ``<``/``>``/``&`` escaped); ``allowed_host``
mirrors ``allowedHostsMiddleware``/``allowedHost`` in server/routes.go; ``NativeStream``
writes ``{"model","created_at","message"|"response","done":false}`` lines and the final
``done: true`` object with ``done_reason`` and nanosecond durations.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import TYPE_CHECKING, Any

import orjson

from llm_gateway_emulators import textgen, wire
from llm_gateway_emulators.jobs import Result, StreamFormat

if TYPE_CHECKING:
    from llm_gateway_emulators.engines.ollama import Ollama

NDJSON = "application/x-ndjson"


def go_json(obj: Any) -> bytes:
    """encoding/json output: compact, with <, > and & escaped."""
    return orjson.dumps(obj).replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(b"&", b"\\u0026")


def allowed_host(host_header: str) -> bool:
    host = host_header.strip()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    host = host.lower()
    try:
        ip = ipaddress.ip_address(host)
        return ip.is_loopback or ip.is_private or ip.is_unspecified or ip.is_link_local
    except ValueError:
        pass
    if host in ("", "localhost") or host == socket.gethostname().lower():
        return True
    return any(host.endswith(t) for t in (".localhost", ".local", ".internal"))


class NativeStream(StreamFormat):
    def __init__(self, eng: Ollama, model: str, chat: bool) -> None:
        self.eng, self.model, self.chat = eng, model, chat

    def headers(self) -> wire.Headers:
        return wire.go(self.eng.dates.now(), [("Content-Type", NDJSON)], None)

    def token(self, delta: str) -> bytes:
        head = b'{"model":' + orjson.dumps(self.model) + b',"created_at":"' + textgen.go_time().encode()
        if self.chat:
            return head + b'","message":{"role":"assistant","content":' + go_json(delta) + b'},"done":false}\n'
        return head + b'","response":' + go_json(delta) + b',"done":false}\n'

    def reasoning(self, delta: str) -> bytes:
        head = b'{"model":' + orjson.dumps(self.model) + b',"created_at":"' + textgen.go_time().encode()
        return (
            head + b'","message":{"role":"assistant","content":"","thinking":' + go_json(delta) + b'},"done":false}\n'
        )

    def final(self, delta: str, res: Result) -> bytes:
        out = self.token(delta) if delta else b""
        return out + go_json(self.eng.done_object(self.model, self.chat, "", res)) + b"\n"

    def error(self) -> bytes:
        return b'{"error":"an error was encountered while running the model: emulated engine fault"}\n'
