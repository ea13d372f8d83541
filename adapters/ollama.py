"""Ollama, spoken to over its native API (`/api/chat`, `/api/generate`, `/api/embed`).

Why native: Ollama's `/v1` layer ignores `num_ctx`, `max_completion_tokens`, `top_k`, `min_p`,
`keep_alive` and every other `options` field, and forces temperature/top_p to 1.0 when absent.
Here OpenAI fields and sampling extras map to `options` (`num_predict`, `num_ctx`, `top_k`,
`min_p`, `repeat_penalty`, `seed`, `stop`, ...), `response_format` to `format`, `reasoning_effort`
to `think`, tools and tool results to Ollama's shapes; the NDJSON answer is translated back to
OpenAI JSON / SSE (see `ollama_stream`). A loopback-bound Ollama answers an empty 403 to a
non-local `Host`, so the request carries a local one. Ollama reports no load: the gateway's own
in-flight count is what routing sees. Bad option types and bad JSON schemas come back as 500
(`option "num_ctx" must be of type integer`): those are the request's fault and become 400.
"""

from __future__ import annotations

import base64
import ipaddress
import struct
import time
from typing import Any, ClassVar
from urllib.parse import urlsplit

import orjson

from adapters.base import Adapter, BackendInfo, CallContext, Endpoint, ProbeClient, ProbeResult, UpstreamRequest, Usage
from adapters.error_bodies import json_object, parse_error_body, upstream_error
from adapters.ollama_stream import OllamaRelay, finish_reason, tool_calls_to_openai
from gateway.errors import InvalidRequest, UpstreamError

_OPTIONS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "typical_p",
        "seed",
        "repeat_last_n",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "num_ctx",
        "num_keep",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "use_mmap",
        "num_thread",
        "num_predict",
        "penalize_newline",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
    }
)
_RENAMED = {"max_tokens": "num_predict", "max_completion_tokens": "num_predict", "repetition_penalty": "repeat_penalty"}
_NATIVE = frozenset(
    {
        "keep_alive",
        "think",
        "truncate",
        "shift",
        "logprobs",
        "top_logprobs",
        "format",
        "tools",
        "raw",
        "suffix",
        "images",
        "dimensions",
    }
)
# OpenAI fields with no meaning for Ollama (or translated separately): never forwarded as they are
_CONSUMED = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "input",
        "stream",
        "stream_options",
        "options",
        "stop",
        "response_format",
        "reasoning_effort",
        "n",
        "user",
        "tool_choice",
        "parallel_tool_calls",
        "logit_bias",
        "service_tier",
        "store",
        "metadata",
        "encoding_format",
        "echo",
        "best_of",
    }
)
_THINK = {
    "none": False,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "max",
}
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
        out: dict[str, Any] = {"model": ctx.upstream_model, "stream": ctx.stream}
        options: dict[str, Any] = {}
        for k, v in body.items():
            if k in _RENAMED:
                if v is not None:
                    options[_RENAMED[k]] = v
            elif k in _OPTIONS:
                if v is not None:
                    options[k] = v
            elif k not in _CONSUMED:
                out[k] = v  # native fields (keep_alive, think, ...) and unknown fields pass through
        if body.get("max_completion_tokens") is not None:  # OpenAI's current name wins over max_tokens
            options["num_predict"] = body["max_completion_tokens"]
        stop = body.get("stop")
        if stop is not None:
            options["stop"] = [stop] if isinstance(stop, str) else stop
        n = body.get("n")
        if n not in (None, 1):
            raise InvalidRequest("n > 1 is not supported by the Ollama backend serving this model", param="n")
        native_options = body.get("options")
        if isinstance(native_options, dict):
            options.update(native_options)
        if options:
            out["options"] = options
        self._format(body, out)
        effort = body.get("reasoning_effort")
        if isinstance(effort, str) and "think" not in out:
            if effort not in _THINK:
                raise InvalidRequest(
                    f"reasoning_effort {effort!r} is not one of {sorted(_THINK)}", param="reasoning_effort"
                )
            out["think"] = _THINK[effort]
        if endpoint == "chat":
            out["messages"] = _messages(body.get("messages"))
        elif endpoint == "completions":
            out["prompt"] = _prompt(body.get("prompt"))
            out.setdefault("raw", True)  # OpenAI completions take the prompt as it is
        else:
            out.pop("stream", None)
            out["input"] = _embed_input(body.get("input"))
        return UpstreamRequest(
            "POST", _PATHS[endpoint], {**self.headers, "X-Request-Id": ctx.request_id}, orjson.dumps(out)
        )

    @staticmethod
    def _format(body: dict[str, Any], out: dict[str, Any]) -> None:
        rf = body.get("response_format")
        if not isinstance(rf, dict) or "format" in out:
            return
        t = rf.get("type")
        if t == "json_object":
            out["format"] = "json"
        elif t == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise InvalidRequest("response_format.json_schema.schema must be an object", param="response_format")
            out["format"] = schema
        elif t not in (None, "text"):
            raise InvalidRequest(f"response_format type {t!r} is not supported by Ollama", param="response_format")

    # -- responses ---------------------------------------------------------------------------------
    def response_body(self, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        obj = json_object(body, self.backend.name, self.kind)
        if "error" in obj:
            raise self._frame_error(str(obj["error"]))
        usage = Usage(int(obj.get("prompt_eval_count") or 0), int(obj.get("eval_count") or 0))
        now = int(time.time())
        if ctx.endpoint == "embeddings":
            return self._embeddings(obj, ctx), Usage(usage.prompt_tokens, 0)
        usage_json = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
        }
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
    def error(self, status: int, body: bytes, content_type: str) -> UpstreamError:
        err = parse_error_body(body, content_type)
        name = self.backend.name
        if status == 404:
            return UpstreamError(
                f"backend '{name}' (ollama) does not have this model: {err.message}",
                status=502,
                code="upstream_model_not_found",
                retryable=True,
                backend=name,
            )
        if status == 403 and not body.strip():
            return UpstreamError(
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

    def _frame_error(self, message: str) -> UpstreamError:
        return UpstreamError(
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


def _messages(msgs: Any) -> list[dict[str, Any]]:
    if not isinstance(msgs, list):
        raise InvalidRequest("'messages' must be an array", param="messages")
    out: list[dict[str, Any]] = []
    names: dict[str, Any] = {}
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        text, images = _content(m.get("content"), i)
        om: dict[str, Any] = {"role": role, "content": text}
        if images:
            om["images"] = images
        if role == "assistant":
            calls = []
            for tc in m.get("tool_calls") or []:
                fn = (tc or {}).get("function") or {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = orjson.loads(args) if args else {}
                    except orjson.JSONDecodeError:
                        raise InvalidRequest(
                            f"messages[{i}].tool_calls: arguments are not JSON", param="messages"
                        ) from None
                calls.append({"function": {"name": fn.get("name"), "arguments": args}})
                if tc.get("id"):
                    names[tc["id"]] = fn.get("name")
            if calls:
                om["tool_calls"] = calls
            thinking = m.get("reasoning_content") or m.get("reasoning")
            if thinking:
                om["thinking"] = thinking
        elif role == "tool":
            name = names.get(str(m.get("tool_call_id", ""))) or m.get("name")
            if name:
                om["tool_name"] = name
        out.append(om)
    return out


def _content(content: Any, i: int) -> tuple[str, list[str]]:
    if content is None or isinstance(content, str):
        return content or "", []
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or an array of parts", param="messages")
    texts: list[str] = []
    images: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
                raise InvalidRequest("the Ollama backend needs images inline as data: URLs", param="messages")
            images.append(url.split(",", 1)[1])
    return "\n".join(texts), images


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    raise InvalidRequest("the Ollama backend takes one string prompt per request", param="prompt")


def _embed_input(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise InvalidRequest("the Ollama backend embeds strings or arrays of strings, not token ids", param="input")
