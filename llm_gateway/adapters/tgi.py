"""Hugging Face Text Generation Inference (TGI; in maintenance mode since 2025, still deployed).

Read from huggingface/text-generation-inference `router/src/server.rs` @d957e32601a99f9ec458ff081dc3b4c6659da8a4
(health, error body and statuses) and, through the shared engine reference, @db931fc (2026-01-08):
`router/src/server.rs` (routes, `/v1/models`), `router/src/lib.rs` (`ChatRequest`, `CompletionRequest`,
`GrammarType`, `ErrorResponse`), `router/src/chat.rs` (the usage chunk), `docs/source/reference/metrics.md`. No real
TGI runs here (CUDA/Docker builds only): the emulator plays what is read.

- Errors are `{"error": "<text>", "error_type": "<kind>"}`: 422 validation (a client error, 400 here),
  429 overloaded (busy: tried elsewhere), 424 a failed generation (an engine failure, retried). Stream
  errors are `data: {"error": ..., "error_type": ...}`.
- `GET /health` 200, or 503 `{"error":"unhealthy","error_type":"healthcheck"}`. `--api-key` guards
  only the generation routes (Bearer).
- It serves its one model whatever `model` says (`ignores_model_name`); `/v1/models` is one card whose
  id is its `model_id`, with no context window.
- Load: `tgi_batch_current_size` (running) and `tgi_queue_size` (waiting) on `/metrics`; no KV gauge.
- `include_usage` adds a last chunk with `choices: []` and an *empty* `id` (`chat.rs`).
- Request fields: `max_completion_tokens` is a serde alias of `max_tokens` (both at once would be a
  duplicate field): only `max_tokens` is sent. `n` and `logit_bias` are documented UNUSED, and
  `parallel_tool_calls` and `reasoning_effort` are not fields of its `ChatRequest`: refused.
  `response_format` json_schema is its own `GrammarType::JsonSchema`; OpenAI's `json_object` has no
  schema, which its grammar needs: sent as `{type: "json", value: {type: "object"}}`. Its completions
  read prompt, max_tokens, temperature, top_p, seed, stop, frequency_penalty and stream; the other
  OpenAI fields are refused.
- Weight formats: safetensors, with AWQ, GPTQ, FP8, EXL2 and bitsandbytes quantisation at load.
"""

from __future__ import annotations

from typing import Any, ClassVar

from llm_gateway.adapters.error_bodies import EngineError, upstream_error
from llm_gateway.adapters.field_table import (
    FieldTable,
    chat_fields,
    completions_fields,
    passed,
    refused,
    translated,
)
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import Endpoint

_AT = "router/src/lib.rs ChatRequest @db931fc"
_CMPL = "router/src/lib.rs CompletionRequest @db931fc"
_UNUSED = "documented UNUSED in its ChatRequest (router/src/lib.rs @db931fc)"
_NOT_A_FIELD = "not a field of its ChatRequest (router/src/lib.rs @db931fc)"
_READ = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop")
FIELDS = FieldTable(
    "TGI",
    chat_fields(
        {
            **{k: passed(_AT) for k in ("messages", "stream", *_READ, "logprobs", "top_logprobs", "tools")},
            "tool_choice": passed(_AT),
            "response_format": translated("json_object -> its {type: json, value: {type: object}}; json_schema"),
            "n": refused(_UNUSED, 1),
            "logit_bias": refused(_UNUSED, {}),
            "parallel_tool_calls": refused(_NOT_A_FIELD, True),
            "reasoning_effort": refused(_NOT_A_FIELD),
        }
    ),
    completions_fields(
        {
            **{k: passed(_CMPL) for k in ("prompt", "stream", "max_tokens", "temperature", "top_p", "seed", "stop")},
            "frequency_penalty": passed(_CMPL),
            "presence_penalty": refused("not a field of its CompletionRequest", 0, 0.0),
            "n": refused("not a field of its CompletionRequest", 1),
            "logit_bias": refused("not a field of its CompletionRequest", {}),
            "logprobs": refused("not a field of its CompletionRequest"),
            "echo": refused("not a field of its CompletionRequest", False),
            "best_of": refused("not a field of its CompletionRequest", 1),
            "suffix": refused("never read by its completions handler", ""),
        }
    ),
)


class TGIAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "tgi"
    formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "awq", "gptq", "fp8", "exl2"})
    reports_load: ClassVar[bool] = True
    load_metrics = (("tgi_batch_current_size",), ("tgi_queue_size",), ())
    ignores_model_name: ClassVar[bool] = True
    field_table: ClassVar[FieldTable | None] = FIELDS

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        body.pop("max_completion_tokens", None)  # a serde alias of max_tokens: both would be a duplicate
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_object" and "value" not in rf:
            body["response_format"] = {"type": "json", "value": {"type": "object"}}  # its grammar needs a schema

    def classify(self, status: int, err: EngineError) -> EngineErrorAnswer:
        if status == 429:  # "Model is overloaded": alive but saturated, tried elsewhere
            return upstream_error(self.backend.name, self.kind, 429, err, retryable=True, busy=True)
        if status == 424:  # a failed generation: the engine's failure, not the request's
            return upstream_error(self.backend.name, self.kind, 502, err, retryable=True, client_error=False)
        return super().classify(status, err)
