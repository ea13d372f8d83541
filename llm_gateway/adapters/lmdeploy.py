"""LMDeploy (`lmdeploy serve api_server`).

- Errors are flat `{"message", "type", "code": <int status>, "param", "object": "error"}`; status
  codes: 400 invalid/context, 401, 404 model, 409 conflict, 499 cancelled, 503 engine unavailable.
- `/health` returns `{"status": "initializing"|"healthy"|"sleeping"|"unhealthy"}`: 200 only for
  healthy and sleeping, and a sleeping engine refuses inference (503), so only "healthy" is ready.
- Load (metrics on by default; `/metrics` needs the key): `lmdeploy:num_requests_running`,
  `lmdeploy:num_requests_waiting` plus `lmdeploy:num_api_requests_waiting` (the API layer's queue),
  `lmdeploy:gpu_cache_usage_perc`.
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

    async def probe_ready(self, client: ProbeClient) -> tuple[ProbeState, str]:
        status, body = await client.get("/health")
        try:
            value = orjson.loads(body).get("status")
        except (orjson.JSONDecodeError, AttributeError):
            value = None
        if status == 200 and value in (None, "healthy"):
            return "ready", ""
        if value in ("initializing", "sleeping"):
            return "loading", f"/health says {value}"
        if status == 503 and value is None:
            return "loading", "/health answered 503"
        return "down", f"/health says {value or status}"
