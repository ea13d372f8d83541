"""LMDeploy (`lmdeploy serve api_server`).

- Errors are flat `{"message", "type", "code": <int status>, "param", "object": "error"}`; status
  codes: 400 invalid/context, 401, 404 model, 409 conflict, 499 cancelled, 503 engine unavailable.
- `/health` returns `{"status": "initializing"|"healthy"|"sleeping"|"unhealthy"}` (v0.14.0 on): 200 only
  for healthy and sleeping, and a sleeping engine refuses inference (503), so only "healthy" is ready.
  Releases before v0.14.0 answer a bare 200 with an empty body (their port opens once the model is
  loaded): that is ready too.
- A wrong engine key: 401 with the flat error (v0.16.0 on), `{"error": "Unauthorized"}` (v0.12.2 to
  v0.15.x), or, before v0.12.2, FastAPI's `HTTPException` body `{"detail": {"error": {"message":
  "Please request with valid api key!", ..., "code": "invalid_api_key"}}}`, which is unwrapped here so
  every release gives the same gateway error (502 `upstream_auth_failed`).
- Load (metrics on by default; `/metrics` needs the key): `lmdeploy:num_requests_running`,
  `lmdeploy:num_requests_waiting` plus `lmdeploy:num_api_requests_waiting` (the API layer's queue),
  `lmdeploy:gpu_cache_usage_perc`.
- Context window: not learned. Its `/v1/models` cards carry `id`, `owned_by`, `root`, `parent`,
  `permission` and no length (reference.md, LM endpoints/models.py); set `context_length` on the
  deployment to have the gateway check fit.
- Request fields: `FIELDS` (adapters/field_table.py), from InternLM/lmdeploy @1263d5cd889b7ad500e85b8eb20401327a4516ab:
  `lmdeploy/serve/openai/protocol.py` `ChatCompletionRequest`/`CompletionRequest`, read through
  `serve/core/generation_config.py` (only `GenerationConfig`'s fields reach the engine). n (chat:
  `chat_completions/fanout.py`), seed (`random_seed`), logit_bias (a logits processor), logprobs,
  tools, tool_choice, parallel_tool_calls (`maybe_filter_parallel_tool_calls`) and response_format are
  honoured. `presence_penalty`/`frequency_penalty` are no `GenerationConfig` fields ("replaced with
  repetition_penalty" in its docs, i.e. ignored); its completions have no logit_bias or best_of, never
  read echo or suffix, and fan n out only on chat: all refused (send `repetition_penalty`).
- `/v1/embeddings` always answers 400 "Unsupported by turbomind.": deployments on LMDeploy cannot
  declare the `embeddings` capability. `finish_reason` "error"/"abort" fail the generation (a 502
  `generation_failed` billed its usage; "abort" is a cancelled session, `ResponseType.CANCEL` in
  `lmdeploy/serve/core/async_engine.py` @1263d5c, answered with the usage so far) and "parse_error"
  becomes "stop".
- The connection stays open after a streamed answer: `api_server` is FastAPI run by `uvicorn.run`
  (`lmdeploy/serve/openai/api_server.py`), streams are `StreamingResponse`s, and uvicorn keeps the
  connection once a streamed body has ended. Read from the source (no real LMDeploy runs here), so no
  `closes_after_stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient
from llm_gateway.adapters.field_table import FieldTable, chat_fields, completions_fields, passed, refused
from llm_gateway.adapters.openai_compat import TO_REPETITION_PENALTY, OpenAICompatAdapter
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import ProbeState

_CHAT = "ChatCompletionRequest (lmdeploy/serve/openai/protocol.py @1263d5c), chat_completions/serving.py"
_CMPL = "CompletionRequest (lmdeploy/serve/openai/protocol.py @1263d5c), endpoints/completions.py"
_PENALTY = refused("not a GenerationConfig field: ignored (send repetition_penalty)", 0, 0.0)
FIELDS = FieldTable(
    "LMDeploy",
    chat_fields(
        {
            **{k: passed(_CHAT) for k in ("messages", "stream", "temperature", "top_p", "seed", "stop", "n")},
            **{k: passed(_CHAT) for k in ("logit_bias", "logprobs", "top_logprobs", "response_format")},
            **{k: passed(_CHAT) for k in ("tools", "tool_choice", "parallel_tool_calls", "reasoning_effort")},
            "presence_penalty": _PENALTY,
            "frequency_penalty": _PENALTY,
        }
    ),
    completions_fields(
        {
            **{k: passed(_CMPL) for k in ("prompt", "stream", "max_tokens", "temperature", "top_p", "seed")},
            **{k: passed(_CMPL) for k in ("stop", "logprobs")},
            "presence_penalty": _PENALTY,
            "frequency_penalty": _PENALTY,
            "n": refused("its /v1/completions generates one choice per prompt (n fans out on chat only)", 1),
            "logit_bias": refused("not a field of its CompletionRequest", {}),
            "best_of": refused("not a field of its CompletionRequest", 1),
            "echo": refused("never read by its completions handler", False),
            "suffix": refused("never read by its completions handler", ""),
        }
    ),
)


class LMDeployAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "lmdeploy"
    formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "awq"})
    reports_load: ClassVar[bool] = True
    load_metrics = (
        ("lmdeploy:num_requests_running",),
        ("lmdeploy:num_requests_waiting", "+lmdeploy:num_api_requests_waiting"),
        ("lmdeploy:gpu_cache_usage_perc",),
    )
    reasoning_key: ClassVar[str | None] = "reasoning_content"
    error_finish_reasons: ClassVar[tuple[str, ...]] = ("error", "abort")
    finish_renames: ClassVar[tuple[tuple[str, str], ...]] = (("parse_error", "stop"),)
    unsupported_capabilities: ClassVar[frozenset[str]] = frozenset({"embeddings"})
    renames: ClassVar[Mapping[str, str]] = TO_REPETITION_PENALTY
    field_table: ClassVar[FieldTable | None] = FIELDS

    def error(self, status: int, body: bytes, content_type: str) -> EngineErrorAnswer:
        return super().error(status, unwrap_http_exception(body), content_type)

    async def probe_ready(self, client: ProbeClient) -> tuple[ProbeState, str]:
        status, body = await client.get("/health")
        try:
            value = orjson.loads(body).get("status")
        except (orjson.JSONDecodeError, AttributeError):  # before v0.14.0: a bare 200, empty body
            value = None
        if status == 200 and value in (None, "healthy"):
            return "ready", ""
        if value in ("initializing", "sleeping"):
            return "loading", f"/health says {value}"
        if status == 503 and value is None:
            return "loading", "/health answered 503"
        return "down", f"/health says {value or status}"


def unwrap_http_exception(body: bytes) -> bytes:
    """`{"detail": {"error": {...}}}` (an `HTTPException` whose detail is an OpenAI error, as LMDeploy's
    `check_api_key` raised before v0.12.2) -> `{"error": {...}}`; any other body as it is."""
    if b'"detail"' not in body[:64]:
        return body
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    detail = data.get("detail") if isinstance(data, dict) else None
    if isinstance(detail, dict) and isinstance(detail.get("error"), dict) and len(data) == 1:
        return orjson.dumps({"error": detail["error"]})
    return body
