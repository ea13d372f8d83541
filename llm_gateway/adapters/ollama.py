"""Ollama, spoken to over its native API (`/api/chat`, `/api/generate`, `/api/embed`).

Why native: Ollama's `/v1` layer ignores `num_ctx`, `max_completion_tokens`, `top_k`, `min_p`,
`keep_alive` and every other `options` field, and forces temperature/top_p to 1.0 when absent.
This module owns the adapter: headers, whole answers translated back to OpenAI JSON, errors,
probes. OpenAI fields and sampling extras map to `options`, `format`, `think` and Ollama's message
shapes in `ollama_request`; the NDJSON stream becomes OpenAI SSE in `ollama_stream`.
A loopback-bound Ollama answers an empty 403 to a non-local `Host`, so the request carries a local
one. Ollama reports no load: the gateway's own in-flight count is what routing sees. Bad option
types and bad JSON schemas come back as 500 (`option "num_ctx" must be of type integer`): those are
the request's fault and become 400.
"""

from __future__ import annotations

import base64
import ipaddress
import struct
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit

import orjson

from llm_gateway.adapters.base import Adapter, ProbeClient, UpstreamRequest
from llm_gateway.adapters.error_bodies import json_object, parse_error_body, upstream_error
from llm_gateway.adapters.ollama_request import native_body
from llm_gateway.adapters.ollama_stream import OllamaRelay, finish_reason, openai_usage, tool_calls_to_openai
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import BackendInfo, CallContext, Endpoint, ProbeResult, Usage

_PATHS = {"chat": "/api/chat", "completions": "/api/generate", "embeddings": "/api/embed"}
_CLIENT_HINTS = ("must be of type", "invalid", "cannot unmarshal", "unknown option", "json schema")


def _local_host(url: str) -> str | None:
    """A Host header Ollama's loopback guard accepts, or None if the URL's own host is fine."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        ip = ipaddress.ip_address(host)
        if ip.is_loopback or ip.is_private or ip.is_unspecified or ip.is_link_local:
            return None
    except ValueError:
        if host == "localhost" or host.endswith((".localhost", ".local", ".internal")):
            return None
    return f"localhost:{parts.port}" if parts.port else "localhost"


class OllamaAdapter(Adapter):
    kind: ClassVar[str] = "ollama"
    formats: ClassVar[frozenset[str] | None] = frozenset({"gguf"})

    def __init__(self, backend: BackendInfo) -> None:
        super().__init__(backend)
        self.headers = {"Content-Type": "application/json"}
        host = _local_host(backend.base_url)
        if host:
            self.headers["Host"] = host
        if backend.api_key:  # Ollama itself has no auth; a key is for a fronting proxy
            self.headers["Authorization"] = f"Bearer {backend.api_key}"

    # -- requests ----------------------------------------------------------------------------------
    def build(self, endpoint: Endpoint, body: dict[str, Any], ctx: CallContext) -> UpstreamRequest:
        out = native_body(endpoint, body, ctx.upstream_model, ctx.stream)
        return UpstreamRequest(
            "POST", _PATHS[endpoint], {**self.headers, "X-Request-Id": ctx.request_id}, orjson.dumps(out)
        )

    # -- responses ---------------------------------------------------------------------------------
    def response_body(self, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        obj = json_object(body, self.backend.name, self.kind)
        if "error" in obj:
            raise self._frame_error(str(obj["error"]))
        usage = Usage(int(obj.get("prompt_eval_count") or 0), int(obj.get("eval_count") or 0))
        now = int(time.time())
        if ctx.endpoint == "embeddings":
            return self._embeddings(obj, ctx), Usage(usage.prompt_tokens, 0)
        usage_json = openai_usage(usage)
        if ctx.endpoint == "completions":
            out: dict[str, Any] = {
                "id": "cmpl-" + ctx.request_id,
                "object": "text_completion",
                "created": now,
                "model": ctx.public_model,
                "choices": [
                    {
                        "index": 0,
                        "text": obj.get("response", ""),
                        "logprobs": None,
                        "finish_reason": finish_reason(obj, False),
                    }
                ],
                "usage": usage_json,
            }
            return orjson.dumps(out), usage
        msg = obj.get("message") or {}
        message: dict[str, Any] = {"role": "assistant", "content": msg.get("content", "")}
        if msg.get("thinking"):
            message[ctx.reasoning_field] = msg["thinking"]
        calls = tool_calls_to_openai(msg.get("tool_calls"), ctx.request_id, 0)
        if calls:
            message["tool_calls"] = calls
        out = {
            "id": "chatcmpl-" + ctx.request_id,
            "object": "chat.completion",
            "created": now,
            "model": ctx.public_model,
            "choices": [
                {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason(obj, bool(calls))}
            ],
            "usage": usage_json,
        }
        return orjson.dumps(out), usage

    def _embeddings(self, obj: dict[str, Any], ctx: CallContext) -> bytes:
        vectors = obj.get("embeddings") or []
        b64 = ctx.embedding_b64
        data = []
        for i, v in enumerate(vectors):
            emb: Any = base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if b64 else v
            data.append({"object": "embedding", "index": i, "embedding": emb})
        n = int(obj.get("prompt_eval_count") or 0)
        return orjson.dumps(
            {
                "object": "list",
                "data": data,
                "model": ctx.public_model,
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }
        )

    def relay(self, ctx: CallContext) -> OllamaRelay:
        return OllamaRelay(ctx, self._frame_error)

    def stream_content_types(self) -> tuple[str, ...]:
        return ("application/x-ndjson", "application/json")

    # -- errors ------------------------------------------------------------------------------------
    def error(self, status: int, body: bytes, content_type: str) -> EngineErrorAnswer:
        err = parse_error_body(body, content_type)
        name = self.backend.name
        if status == 404:
            return EngineErrorAnswer(
                f"backend '{name}' (ollama) does not have this model: {err.message}",
                status=502,
                code="upstream_model_not_found",
                retryable=True,
                backend=name,
            )
        if status == 403 and not body.strip():
            return EngineErrorAnswer(
                f"backend '{name}' (ollama) refused the request (403 with an empty body: its Host-header guard)",
                status=502,
                code="upstream_forbidden",
                backend=name,
            )
        if status == 499:
            return upstream_error(name, self.kind, 499, err, retryable=False, client_error=True)
        if status == 500 and any(h in err.message.lower() for h in _CLIENT_HINTS):
            # Ollama answers 500 for bad option types and bad schemas: the request's fault
            return upstream_error(name, self.kind, 400, err, client_error=True)
        busy = status == 503 and "busy" in err.message  # OLLAMA_MAX_QUEUE reached
        return upstream_error(name, self.kind, status, err, retryable=status in (429, 502, 503, 504), busy=busy)

    def _frame_error(self, message: str) -> EngineErrorAnswer:
        return EngineErrorAnswer(
            f"backend '{self.backend.name}' (ollama) failed mid-stream: {message}",
            status=502,
            code="upstream_stream_error",
            backend=self.backend.name,
        )

    # -- probes ------------------------------------------------------------------------------------
    async def probe(self, client: ProbeClient) -> ProbeResult:
        status, _ = await client.get("/api/version", self.headers)
        if status != 200:
            return ProbeResult("down", detail=f"/api/version answered {status}")
        status, body = await client.get("/api/tags", self.headers)
        models: set[str] = set()
        if status == 200:
            try:
                for m in orjson.loads(body).get("models") or []:
                    name = str(m.get("name") or m.get("model") or "")
                    models.add(name)
                    if name.endswith(":latest"):
                        models.add(name[: -len(":latest")])
            except (orjson.JSONDecodeError, AttributeError):
                pass
        return ProbeResult("ready", models=frozenset(models) if status == 200 else None)
