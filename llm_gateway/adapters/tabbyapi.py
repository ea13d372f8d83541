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
- A whole (non-streamed) answer carries `usage` only when `stream_options.include_usage` is set, so
  the gateway always sets it. In streams, Tabby puts the finish reason on the usage chunk; the
  shared relay splits it into OpenAI's shape (finish chunk, then a usage chunk with no choices).
- Chunks are `json.dumps` output (a space after `:`), which the relay's byte rewrites account for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient
from llm_gateway.adapters.error_bodies import EngineError
from llm_gateway.adapters.openai_compat import (
    TO_REPETITION_PENALTY,
    OpenAICompatAdapter,
    include_usage,
    window_size,
)
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import Endpoint, ProbeState


class TabbyAPIAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "tabbyapi"
    formats: ClassVar[frozenset[str] | None] = frozenset({"exl2", "exl3"})
    reasoning_key: ClassVar[str | None] = "reasoning_content"
    ignores_model_name: ClassVar[bool] = True
    renames: ClassVar[Mapping[str, str]] = TO_REPETITION_PENALTY

    def auth_headers(self) -> dict[str, str]:
        key = self.backend.api_key
        return {"x-api-key": key} if key else {}

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_object":
            body["response_format"] = {"type": "json"}
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
