"""TabbyAPI (ExLlamaV2/V3).

- Auth: `x-api-key` (Bearer also works); failures are FastAPI `{"detail": "Invalid API key"}`.
- Errors are mostly `{"detail": ...}`; validation errors are 422, mapped to 400.
- `/health` stays 200 with no model loaded: readiness is `GET /v1/model` (authenticated), which
  answers 503 "No models are currently loaded." until a model is in.
- Context window: `/v1/model`'s `parameters.max_seq_len` (TB endpoints/core/types/model.py
  `ModelCardParameters`, reference.md). Tabby refuses an oversized prompt with 400
  `context_length_exceeded` (`check_context_length`); whether its output counts is not checked here,
  so only the prompt is (no `window_counts_output`).
- No metrics and no queue counters: load is the gateway's own in-flight count.
- Streams use CRLF event separators and `: ping` comments (handled by the shared SSE relay); a
  mid-stream error is `data: {"error": {"message", "trace"}}` with no `[DONE]`.
- `response_format: json_object` is not recognised by Tabby (silently unconstrained): it becomes
  Tabby's `{"type": "json"}`. `repeat_penalty` is renamed to `repetition_penalty`.
- Request fields: `FIELDS` (adapters/field_table.py), from theroyallab/tabbyAPI
  @e632af41eba68abeadc3437c62674360f2f8cbf1: `endpoints/OAI/types/chat_completion.py`
  `ChatCompletionRequest`, `endpoints/OAI/types/common.py` `CommonCompletionRequest` and
  `common/sampling.py` `BaseSamplerRequest`. n, logit_bias
  (`backends/exllamav3/model.py`), logprobs/top_logprobs, the penalties, stop, tools and tool_choice
  `none` are honoured; `reasoning_effort` and `verbosity` become template variables
  (`endpoints/OAI/utils/chat_completion.py`). It has no `seed` at all; `parallel_tool_calls` is parsed
  and never read; a `tool_choice` of `required` or a named function is parsed and never acted on; its
  completions' `best_of`, `echo` and `suffix` are "Not parsed. Only used for OAI compliance.": refused.
  A `response_format` type other than text, json_object (-> `json`) and json_schema is ignored there:
  refused.
- A whole (non-streamed) answer carries `usage` only when `stream_options.include_usage` is set, so
  the gateway always sets it. In streams, Tabby puts the finish reason on the usage chunk; the
  shared relay splits it into OpenAI's shape (finish chunk, then a usage chunk with no choices).
- Chunks are `json.dumps` output (a space after `:`), which the relay's byte rewrites account for.
- The connection stays open after a streamed answer: the API is FastAPI served by uvicorn
  (`endpoints/server.py`), its streams are `sse-starlette` responses, and uvicorn keeps the connection once a
  streamed body has ended. Read from the source (no real TabbyAPI runs here), so no `closes_after_stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient
from llm_gateway.adapters.error_bodies import EngineError
from llm_gateway.adapters.field_table import (
    FieldTable,
    chat_fields,
    completions_fields,
    passed,
    refused,
    translated,
    unsupported,
)
from llm_gateway.adapters.openai_compat import (
    TO_REPETITION_PENALTY,
    OpenAICompatAdapter,
    include_usage,
    window_size,
)
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import Endpoint, ProbeState

_TYPES = "endpoints/OAI/types/{chat_completion,common}.py @e632af4"
_SAMPLER = "common/sampling.py BaseSamplerRequest @e632af4"
_SAMPLING = ("temperature", "top_p", "presence_penalty", "frequency_penalty", "stop", "logit_bias", "logprobs")
_NO_SEED = refused("it has no seed (not a field of its sampler request, common/sampling.py)")
_RESPONSE_FORMATS = ("text", "json_object", "json_schema")
FIELDS = FieldTable(
    "TabbyAPI",
    chat_fields(
        {
            **{k: passed(_SAMPLER) for k in (*_SAMPLING, "top_logprobs")},
            **{k: passed(_TYPES) for k in ("messages", "stream", "n", "tools")},
            "seed": _NO_SEED,
            "response_format": translated("json_object -> its {type: json}; json_schema; other types refused"),
            "tool_choice": passed(
                f"{_TYPES}: auto, and none (no tool parsing); required or a named function is never acted on",
                accepted=(None, "auto", "none"),
            ),
            "parallel_tool_calls": refused("parsed, never read: it cannot limit an answer to one call", True),
            "reasoning_effort": passed("a template variable (endpoints/OAI/utils/chat_completion.py @e632af4)"),
            "verbosity": passed("a template variable (endpoints/OAI/utils/chat_completion.py @e632af4)"),
        }
    ),
    completions_fields(
        {
            **{k: passed(_SAMPLER) for k in ("max_tokens", *_SAMPLING)},
            **{k: passed(_TYPES) for k in ("prompt", "stream", "n")},
            "seed": _NO_SEED,
            "best_of": refused("'Not parsed. Only used for OAI compliance.' (common.py)", 1),
            "echo": refused("'Not parsed. Only used for OAI compliance.' (common.py)", False),
            "suffix": refused("'Not parsed. Only used for OAI compliance.' (common.py)", ""),
        }
    ),
)


class TabbyAPIAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "tabbyapi"
    formats: ClassVar[frozenset[str] | None] = frozenset({"exl2", "exl3"})
    reasoning_key: ClassVar[str | None] = "reasoning_content"
    ignores_model_name: ClassVar[bool] = True
    renames: ClassVar[Mapping[str, str]] = TO_REPETITION_PENALTY
    field_table: ClassVar[FieldTable | None] = FIELDS

    def auth_headers(self) -> dict[str, str]:
        key = self.backend.api_key
        return {"x-api-key": key} if key else {}

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_object":
            body["response_format"] = {"type": "json"}
        elif isinstance(rf, dict) and rf.get("type", "text") not in _RESPONSE_FORMATS:
            raise unsupported("response_format", "TabbyAPI", f"type {rf.get('type')!r} (it takes {_RESPONSE_FORMATS})")
        if not body.get("stream") and endpoint != "embeddings":
            include_usage(body)  # Tabby puts usage in a whole answer only when it is asked for

    def classify(self, status: int, err: EngineError) -> EngineErrorAnswer:
        if status == 422:
            status = 400
        return super().classify(status, err)

    async def probe_ready(self, client: ProbeClient) -> tuple[ProbeState, str]:
        status, _ = await client.get("/health")
        if status != 200:
            return "down", f"/health answered {status}"
        status, _ = await client.get("/v1/model", self.auth_headers())
        if status == 200:
            return "ready", ""
        if status == 503:
            return "loading", "no model loaded"
        if status in (401, 403):
            return (
                "down",
                f"/v1/model answered {status}: the engine refused the gateway's key (check backends[].api_key)",
            )
        return "down", f"/v1/model answered {status}"

    async def probe_catalog(self, client: ProbeClient) -> tuple[frozenset[str] | None, dict[str, int] | None]:
        status, body = await client.get("/v1/model", self.auth_headers())
        if status != 200:
            return None, None
        try:
            card = orjson.loads(body)
            mid = card.get("id")
        except (orjson.JSONDecodeError, AttributeError):
            return None, None
        if not mid:
            return None, None
        params = card.get("parameters")
        n = window_size(params.get("max_seq_len")) if isinstance(params, dict) else None
        return frozenset({str(mid)}), None if n is None else {str(mid): n}
