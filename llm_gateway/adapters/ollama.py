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

Prompts longer than the context window: Ollama cuts them to its `num_ctx` and answers 200 unless told
not to, where llama-server and vLLM answer 400 `context_length_exceeded`. The gateway never lets a
prompt be cut silently:
- Refused up front where Ollama can be told: every chat/generate/embed request carries
  `truncate: false` (unless the client set `truncate` itself). Ollama >= 0.12.6 then answers 400 "the
  input length exceeds the context length" (v0.13.5 runner/llamarunner/runner.go `errorInputTooLong`),
  or, at HEAD fb3076099 (llm/llama_server.go), the llama-server error `exceed_context_size_error`
  wrapped in its own; /api/embed answers "input length exceeds maximum context length" from 0.5.4
  on (server/routes.go `EmbedHandler` @2ddc32d). All of these become 400 `context_length_exceeded`,
  as llama-server's does. A prompt whose lower-bound size (`ollama_prompt.min_tokens`) already
  reaches a `num_ctx` set in the request is refused before it is sent.
- Detected afterwards where it cannot: Ollama before 0.12.6 (the 0.5.4 of our tests included) has no
  `truncate` for chat/generate; its runner keeps `num_ctx` tokens of a longer prompt (0.5.4
  llama/runner/runner.go `NewSequence`: exactly `num_ctx`) and its chat handler drops whole older
  messages first (server/prompt.go `chatPrompt`). `prompt_eval_count` is the prompt it evaluated (all
  of it, cached or not), so an answer whose `prompt_eval_count` is below the prompt's lower bound, or
  reaches a `num_ctx` the request set, was cut: 400 `context_length_exceeded` instead of the answer
  (at the end of a stream, as an error event). A prompt cut by less than its lower bound's margin (at
  most 8 bytes of text a token, blanks not counted) cannot be told from a whole one: only those pass.

Context window: none is reported to routing. The window Ollama runs a model with is its `num_ctx` (a
request option, the Modelfile's parameter, `OLLAMA_CONTEXT_LENGTH`, or its default), not the trained
length `/api/show` gives (`model_info["<arch>.context_length"]`: 4096 in captures/ollama/api-show.txt,
where the Modelfile runs it with `num_ctx 512`), and over-long prompts are handled here as above.

Residency: Ollama loads a model on its first request (seconds to minutes) and unloads it after
`keep_alive`; each probe reads `/api/ps` for the loaded ones, so routing prefers a deployment whose
model is already loaded (`_probe_loaded`).

Logprobs: Ollama >= 0.12.11 returns them (api/types.go `ChatRequest.Logprobs`/`TopLogprobs`,
59241c5be); the adapter learns the version from `/api/version` in its probe and refuses
`logprobs` with a 400 on an older one (and on one that turned out to ignore them). Whole answers that
Ollama did not finish (`done: false`, its repeated-token abort, or a `done_reason` other than stop or
length) are a 502 `generation_failed`, like SGLang's and LMDeploy's aborts. Errors raised after a
generation carry its usage (`ChargedError.usage`: Ollama's counts, or an estimate of the text) for the
service to bill.
After a streamed answer the connection stays open (Go's net/http ends the chunked body and keeps the
connection): checked on the real server by tests/contract/test_keep_alive.py, so no `closes_after_stream`.
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
from llm_gateway.adapters.error_bodies import EngineError, json_object, parse_error_body, upstream_error
from llm_gateway.adapters.ollama_prompt import PromptFacts, context_message, is_context_error, prompt_facts
from llm_gateway.adapters.ollama_request import native_body
from llm_gateway.adapters.ollama_stream import (
    OllamaRelay,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    openai_usage,
    tool_calls_to_openai,
    unfinished,
)
from llm_gateway.adapters.relay_base import BYTES_PER_TOKEN, ChargedError
from llm_gateway.errors import EngineErrorAnswer, GatewayError, InvalidRequest
from llm_gateway.types import BackendInfo, CallContext, Endpoint, ProbeResult, Usage

_PATHS = {"chat": "/api/chat", "completions": "/api/generate", "embeddings": "/api/embed"}
_CLIENT_HINTS = ("must be of type", "invalid", "cannot unmarshal", "unknown option", "json schema")
#: the first version with logprobs (59241c5be, v0.12.11); truncate came in v0.12.6 (6544e1473)
LOGPROBS_SINCE = (0, 12, 11)
_FACTS_KEPT = 4096  # calls built and not yet answered whose facts are kept (a bound, not a queue size)


def parse_version(text: Any) -> tuple[int, int, int] | None:
    """`0.5.4-ipexllm-20250407` -> (0, 5, 4); None for anything else (a dev build, no version)."""
    if not isinstance(text, str):
        return None
    head = text.strip().lstrip("v").split("-", 1)[0].split(".")
    if len(head) < 3 or not all(p.isdigit() for p in head[:3]):
        return None
    return int(head[0]), int(head[1]), int(head[2])


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
        #: the engine's version, from the last probe's /api/version (None: not known yet)
        self.version: tuple[int, int, int] | None = None
        #: set once an answer showed that this engine ignores `logprobs`
        self.ignores_logprobs = False
        # what each call in flight asked for, by its context (build() always comes first, with the same one)
        self._facts: dict[int, PromptFacts] = {}

    def returns_logprobs(self) -> bool | None:
        """Does this Ollama return logprobs? None while its version is not known."""
        if self.ignores_logprobs:
            return False
        return None if self.version is None else self.version >= LOGPROBS_SINCE

    # -- requests ----------------------------------------------------------------------------------
    def build(self, endpoint: Endpoint, body: dict[str, Any], ctx: CallContext) -> UpstreamRequest:
        out = native_body(endpoint, body, ctx.upstream_model, ctx.stream, self.returns_logprobs())
        facts = prompt_facts(endpoint, body, out)
        if facts.check_truncation and facts.num_ctx is not None and facts.floor >= facts.num_ctx:
            raise InvalidRequest(
                f"the prompt has at least {facts.floor} tokens, more than the context window it asks for "
                f"(num_ctx {facts.num_ctx}); shorten the prompt or raise num_ctx",
                param="messages" if endpoint == "chat" else "prompt",
                code="context_length_exceeded",
            )
        facts_by_call = self._facts
        facts_by_call.pop(id(ctx), None)
        if len(facts_by_call) >= _FACTS_KEPT:  # calls that never got an answer (connect failures)
            del facts_by_call[next(iter(facts_by_call))]
        facts_by_call[id(ctx)] = facts
        return UpstreamRequest(
            "POST", _PATHS[endpoint], {**self.headers, "X-Request-Id": ctx.request_id}, orjson.dumps(out)
        )

    def _facts_of(self, ctx: CallContext) -> PromptFacts:
        return self._facts.pop(id(ctx), None) or PromptFacts()

    def verdict(
        self, obj: dict[str, Any], facts: PromptFacts, logprobs_seen: bool, usage: Usage
    ) -> GatewayError | None:
        """The error a final answer object amounts to (None: it stands): a generation Ollama did not finish,
        a prompt it cut, logprobs it ignored. Each carries the usage, to be billed."""
        where = f"backend '{self.backend.name}' (ollama)"
        why = unfinished(obj)
        if why is not None:
            return ChargedError(
                f"{where} did not finish the generation: {why}",
                usage=usage,
                status=502,
                code="generation_failed",
                backend=self.backend.name,
            )
        n = usage.prompt_tokens
        if facts.check_truncation and n > 0:
            if n < facts.floor:
                cut = (
                    f"evaluated only {n} tokens of a prompt of at least {facts.floor}: it cut the prompt to its num_ctx"
                )
            elif facts.num_ctx is not None and n >= facts.num_ctx:
                cut = f"evaluated {n} prompt tokens, all of the context window asked for (num_ctx {facts.num_ctx})"
            else:
                cut = ""
            if cut:
                return ChargedError(
                    f"the prompt is longer than the model's context window: {where} {cut}; "
                    "shorten the prompt or raise num_ctx",
                    usage=usage,
                    status=400,
                    type_="invalid_request_error",
                    code="context_length_exceeded",
                    param="messages" if "message" in obj else "prompt",
                    backend=self.backend.name,
                )
        if facts.logprobs and not logprobs_seen and usage.completion_tokens > 0:
            self.ignores_logprobs = True
            return ChargedError(
                f"'logprobs' is not supported by the Ollama backend serving this model: {where} returned none "
                "(they came in Ollama 0.12.11)",
                usage=usage,
                status=400,
                type_="invalid_request_error",
                code="unsupported_parameter",
                param="logprobs",
                backend=self.backend.name,
            )
        return None

    # -- responses ---------------------------------------------------------------------------------
    def response_body(self, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        facts = self._facts_of(ctx)
        obj = json_object(body, self.backend.name, self.kind)
        if "error" in obj:
            raise self._frame_error(str(obj["error"]))
        usage = Usage(int(obj.get("prompt_eval_count") or 0), int(obj.get("eval_count") or 0))
        now = int(time.time())
        if ctx.endpoint == "embeddings":
            return self._embeddings(obj, ctx), Usage(usage.prompt_tokens, 0)
        text = (obj.get("message") or {}).get("content") if ctx.endpoint == "chat" else obj.get("response")
        if not usage.completion_tokens and isinstance(text, str) and text:  # done: false carries no counts
            usage = Usage(usage.prompt_tokens, -(-len(text.encode()) // BYTES_PER_TOKEN))
        entries = obj.get("logprobs")
        entries = entries if isinstance(entries, list) else []
        err = self.verdict(obj, facts, bool(entries), usage)
        if err is not None:
            raise err
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
                        "logprobs": completion_logprobs(entries, 0)[0] if facts.logprobs else None,
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
                {
                    "index": 0,
                    "message": message,
                    "logprobs": chat_logprobs(entries) if facts.logprobs else None,
                    "finish_reason": finish_reason(obj, bool(calls)),
                }
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
        return OllamaRelay(ctx, self._frame_error, self._facts_of(ctx), self.verdict)

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
        if status in (400, 500) and err.well_formed and is_context_error(err.message):
            return self._context_error(err.message)
        if status == 500 and err.well_formed and any(h in err.message.lower() for h in _CLIENT_HINTS):
            # Ollama answers 500 for bad option types and bad schemas: the request's fault
            return upstream_error(name, self.kind, 400, err, client_error=True)
        busy = status == 503 and "busy" in err.message  # OLLAMA_MAX_QUEUE reached
        return upstream_error(name, self.kind, status, err, retryable=status in (429, 502, 503, 504), busy=busy)

    def _context_error(self, message: str) -> EngineErrorAnswer:
        err = EngineError(context_message(message), code="context_length_exceeded")
        return upstream_error(self.backend.name, self.kind, 400, err, client_error=True)

    def _frame_error(self, message: str) -> EngineErrorAnswer:
        if is_context_error(message):
            return self._context_error(message)
        return EngineErrorAnswer(
            f"backend '{self.backend.name}' (ollama) failed mid-stream: {message}",
            status=502,
            code="upstream_stream_error",
            backend=self.backend.name,
        )

    # -- probes ------------------------------------------------------------------------------------
    async def probe(self, client: ProbeClient) -> ProbeResult:
        status, body = await client.get("/api/version", self.headers)
        if status != 200:
            return ProbeResult("down", detail=f"/api/version answered {status}")
        try:
            version = orjson.loads(body).get("version")
        except (orjson.JSONDecodeError, AttributeError):
            version = None
        self.version = parse_version(version)
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
        listed = frozenset(models) if status == 200 else None
        return ProbeResult("ready", models=listed, resident=await self._probe_loaded(client, listed))

    async def _probe_loaded(self, client: ProbeClient, listed: frozenset[str] | None) -> dict[str, bool] | None:
        """Which models are loaded, from `/api/ps` (every model in the scheduler's `loaded` map, one still
        loading included; PsHandler in server/routes.go, `ProcessModelResponse` in api/types.go @fb30760:
        captures/ollama/api-ps-loaded.txt, api-ps-empty.txt): a listed model is resident, a pulled one
        it does not list is cold. `size_vram` 0 (on the CPU) is loaded all the same, and `expires_at`
        is when keep_alive unloads it, which the next probe sees. None when `/api/ps` gives no list."""
        status, body = await client.get("/api/ps", self.headers)
        if status != 200:
            return None
        try:
            loaded = orjson.loads(body).get("models")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        if not isinstance(loaded, list):
            return None
        out = dict.fromkeys(listed or (), False)
        for m in loaded:
            if isinstance(m, dict) and (name := str(m.get("name") or m.get("model") or "")):
                out[name] = True
                if name.endswith(":latest"):
                    out[name[: -len(":latest")]] = True
        return out
