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
- `/v1/embeddings` always answers 400 "Unsupported by turbomind.": deployments on LMDeploy cannot
  declare the `embeddings` capability. `finish_reason` "error"/"abort" fail the generation and
  "parse_error" becomes "stop".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient
from llm_gateway.adapters.openai_compat import TO_REPETITION_PENALTY, OpenAICompatAdapter
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import ProbeState


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
