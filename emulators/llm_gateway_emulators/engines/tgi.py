"""Hugging Face Text Generation Inference (TGI), from huggingface/text-generation-inference's source.

The health route, the `{"error", "error_type"}` body and the 422/424/429 statuses read in
`router/src/server.rs` @d957e32601a99f9ec458ff081dc3b4c6659da8a4 (the stored snapshot); the OpenAI routes
as the shared engine reference read them at db931fc (2026-01-08: `router/src/server.rs`, `router/src/lib.rs`,
`router/src/chat.rs`, `router/src/infer/mod.rs`, `docs/source/reference/metrics.md`):

- An axum router (port 3000 from the launcher); the launcher starts it once the shards are warm
  (`listen_after_load`). `GET /health` 200, or 503 `{"error":"unhealthy","error_type":"healthcheck"}`.
- `--api-key` guards only the generation routes, Bearer; a failure is a bare 401.
- Errors are `{"error", "error_type"}`: 422 validation, 424 generation, 429 overloaded; a stream's
  error is `data: {"error", "error_type"}`.
- `model` is UNUSED: any name is served. `/v1/models` is one card `{id: model_id, object: "model",
  created: 0, owned_by: model_id}`.
- `max_completion_tokens` is a serde alias of `max_tokens`: both at once is a duplicate field (422).
- `include_usage` adds a final chunk with `choices: []` and an empty `id` (`chat.rs`).
- `/metrics`: `tgi_queue_size`, `tgi_batch_current_size` (gauges), `tgi_request_count`.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway_emulators.engines.fastapi_base import Problem
from llm_gateway_emulators.engines.openai_family import OpenAIFamily
from llm_gateway_emulators.jobs import Reply

KINDS = {422: "validation", 424: "generation", 429: "overloaded", 503: "healthcheck"}
GENERATION = frozenset({"/v1/chat/completions", "/v1/completions", "/generate", "/generate_stream", "/tokenize"})


class Tgi(OpenAIFamily):
    name = "tgi"
    listen_after_load = True
    any_model = True
    hyper = True
    keyed_paths = GENERATION

    def err(self, status: int, message: str) -> Reply:
        return self.uv_json(status, {"error": message, "error_type": KINDS.get(status, "generation")})

    def unauthorized(self) -> Reply:
        return self.uv_empty(401)

    def problem(self, p: Problem) -> Reply:
        return self.err(422, f"Failed to deserialize the JSON body into the target type: {p.msg}")

    def check(self, body: dict[str, Any], chat: bool) -> Reply | None:
        if chat and "max_tokens" in body and "max_completion_tokens" in body:
            return self.problem(Problem("duplicate", ("body",), "duplicate field `max_tokens`", body))
        return None

    async def health(self, req: Any) -> None:
        if self.cfg.health == "unhealthy":
            await self.reply(req, self.uv_json(503, {"error": "unhealthy", "error_type": "healthcheck"}))
        else:
            await self.reply(req, self.uv_empty(200))

    def card(self) -> dict[str, Any]:
        return {"id": self.cfg.model, "object": "model", "created": 0, "owned_by": self.cfg.model}

    def usage_chunk_id(self, stream_id: str) -> str:
        return ""

    def metrics_reply(self) -> Reply | None:
        lines = [
            "# TYPE tgi_queue_size gauge",
            f"tgi_queue_size {self.pool.reported_waiting()}",
            "# TYPE tgi_batch_current_size gauge",
            f"tgi_batch_current_size {self.pool.running}",
            "# TYPE tgi_request_count counter",
            f"tgi_request_count {self.stats.requests_total}",
        ]
        body = ("\n".join(lines) + "\n").encode()
        heads = [("content-type", "text/plain; charset=utf-8"), ("content-length", str(len(body)))]
        return 200, [*heads, ("date", self.dates.now())], body

    def stream_error(self) -> bytes:
        return (
            b"data: "
            + orjson.dumps({"error": "Request failed during generation", "error_type": "generation"})
            + b"\n\n"
        )
