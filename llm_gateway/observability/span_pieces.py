"""The bytes a traced request's spans are written from, kept because they recur: a request span's name, fixed
attributes (SERVER_KEYS) and status by the request's facts, an attempt span's by its deployment, route, endpoint,
class and number, and the heads of the request span's own attributes (tokens, finish reasons, the request id, the
queue wait, the TTFT). tracing.py's `Tracing` is one of these (with its sampling and batcher), and its
`RequestTrace.end` and `AttemptTrace.end` join a span from these pieces and the span's own ids and times, so that
no tuple of a span's facts is built on the loop and taken apart again by the export thread. Each cache is bounded
(cleared at 1024 entries: a reload builds new routes, so new keys, never changing an old one).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from llm_gateway.observability import otlp
from llm_gateway.observability.genai_spans import CLIENT_KEYS, OPERATIONS, SERVER_KEYS, SERVER_OWN_KEYS, UNIQUE_KEYS
from llm_gateway.observability.otlp import CLIENT, SERVER

#: an attempt span's name and CLIENT_KEYS' values, and their bytes: its head (otlp.Encoder.head) and block
AttemptPieces = tuple[str, tuple[Any, ...], bytes, bytes]


class SpanPieces:
    """The encoder of a process's spans and the pieces of them it keeps as bytes (see the module's docstring)."""

    def __init__(self, resource: dict[str, Any]) -> None:
        self._servers: dict[str, tuple[str, int]] = {}  # a backend URL's (server.address, server.port)
        #: (deployment, route, endpoint, class, attempt number) -> an attempt span's AttemptPieces: they recur, and a
        #: reload builds new routes (so a new key), never changes one
        self.clients: dict[tuple[Any, ...], AttemptPieces] = {}
        #: (RequestTrace.end's facts of a request) -> its span's head, fixed attributes (SERVER_KEYS) and status
        self.requests: dict[tuple[Any, ...], tuple[bytes, bytes, bytes]] = {}
        self.encoder = enc = otlp.Encoder(resource, "llm_gateway", UNIQUE_KEYS)
        # the request span's own attributes (SERVER_OWN_KEYS): each key's kept bytes by value, the request id's
        # heads by its length, the TTFT's head (a float), usage_estimated's (only ever there when true)
        tokens_in, tokens_out, reasons, rid, wait, ttft, estimated = SERVER_OWN_KEYS
        self.tokens_in, self.tokens_out, self.reasons = enc.kept(tokens_in), enc.kept(tokens_out), enc.kept(reasons)
        self.rids, self.waits = enc.unique_heads(rid), enc.kept(wait)
        self.ttft, self.estimated = enc.float_head(ttft), enc.kept(estimated)[True]
        self.first_token = enc.event("gen_ai.first_token")

    def server(self, url: str) -> tuple[str, int]:
        """A backend URL's `server.address` and `server.port` (parsed once per URL)."""
        known = self._servers.get(url)
        if known is None:
            u = urlsplit(url)
            known = self._servers[url] = (u.hostname or "", u.port or (443 if u.scheme == "https" else 80))
        return known

    def client(self, dep: Any, route: Any, endpoint: str, klass: str, n: int) -> AttemptPieces:
        """An attempt span's name, CLIENT_KEYS' values and their bytes, kept in `clients` (bounded)."""
        b = dep.backend
        address, port = self.server(b.cfg.url)
        op = OPERATIONS.get(endpoint, endpoint)
        model = dep.upstream_model
        values = (op, b.kind, model, address, port, b.name, b.kind, route.name, route.cfg.strategy, n, klass)
        name = f"{op} {model}"
        if len(self.clients) >= 1024:
            self.clients.clear()
        known = (name, values, self.encoder.head(name, CLIENT), self.encoder.block(CLIENT_KEYS, values))
        self.clients[(dep, route, endpoint, klass, n)] = known
        return known

    def request(self, key: tuple[Any, ...]) -> tuple[bytes, bytes, bytes]:
        """The request span's name and kind (otlp.Encoder.head), fixed attributes (SERVER_KEYS) and status, as bytes,
        from the request's facts (RequestTrace.end's key), kept in `requests` (bounded): they recur."""
        (
            method,
            path,
            endpoint,
            model,
            upstream,
            backend,
            engine,
            key_name,
            klass,
            stream,
            attempts,
            outcome,
            status,
            error,
        ) = key
        op = OPERATIONS.get(endpoint)
        served = backend != "none"
        values = (
            method,
            path,
            op,
            model if op is not None else None,
            upstream,
            backend if served else None,
            engine if served else None,
            key_name,
            klass,
            stream,
            attempts,
            attempts - 1 if attempts > 1 else 0,
            outcome,
            status == 499,
            status,
            error or None,
        )
        enc = self.encoder
        name = f"{op} {model}" if op is not None else f"{method} {path}"
        failed = (error or "error") if status >= 500 else None  # a server span's error: a 5xx only
        if len(self.requests) >= 1024:
            self.requests.clear()
        kept = self.requests[key] = (enc.head(name, SERVER), enc.block(SERVER_KEYS, values), otlp.status_field(failed))
        return kept
