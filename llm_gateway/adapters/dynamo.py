"""NVIDIA Dynamo's OpenAI frontend (`python -m dynamo.frontend`), in front of its workers.

Read from ai-dynamo/dynamo: `lib/llm/src/http/service/error.rs` @09ca8c2d3d364e241d4115537d81c078052f1948
(error classes and statuses), `lib/llm/src/http/service/service_v2.rs` @00287ef (routes),
`lib/llm/src/protocols/openai/compatibility/rejection.rs` @73051721b695e7b9b0770ac51a8ed71e11fb34ef (field
refusals), `lib/runtime/src/metrics/prometheus_names.rs` @4415465 (metric names).

- Errors are flat `{"message", "type": <HTTP reason>, "code": <status>}`. Overload and admission
  rejections are **529** (`DYN_HTTP_OVERLOAD_STATUS_CODE`; busy: tried elsewhere, not a breaker
  failure), a cancelled request **499**, an unavailable worker 503; a 5xx says only "Internal server
  error".
- Liveness is `GET /live`; `/health` lists the discovered worker instances; a model is served once a
  worker registers it, so readiness of a deployment is its model in `GET /v1/models`, whose cards
  carry `context_window`.
- Load on `/metrics` (Prometheus, on the HTTP port): `dynamo_frontend_inflight_requests` (running) and
  `dynamo_frontend_queued_requests` (waiting), labelled by model, exported once the frontend has served
  that model (before: not told); KV usage lives in the workers, not read here.
- Checked against the real frontend with its simulated worker (ai-dynamo 1.6.1, `dynamo.mocker`;
  tests/contract/test_dynamo_real.py): readiness, the model list (the mocker's cards say
  `context_window: 0`, which is no window), the gauges, usage in whole and streamed answers, the 404 body.
- Fields: the frontend checks each request field against the capability profile its worker advertises
  and refuses an unsupported one itself (a 400 `unsupported_field` rejection, `compatibility/
  rejection.rs`), so what is honoured depends on the worker engine behind it (vLLM, SGLang,
  TensorRT-LLM): no gateway field table; every field is sent and Dynamo answers for it.
- Weight formats: whatever its workers load (not known here). Axum (hyper): connections stay open.
"""

from __future__ import annotations

from typing import ClassVar

from llm_gateway.adapters.error_bodies import EngineError, upstream_error
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.errors import EngineErrorAnswer

OVERLOADED = 529
CANCELLED = 499


class DynamoAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "dynamo"
    formats: ClassVar[frozenset[str] | None] = None
    reports_load: ClassVar[bool] = True
    load_metrics = (("dynamo_frontend_inflight_requests",), ("dynamo_frontend_queued_requests",), ())
    health_path: ClassVar[str | None] = "/live"
    window_field: ClassVar[str | None] = "context_window"
    reasoning_key: ClassVar[str | None] = "reasoning_content"

    def classify(self, status: int, err: EngineError) -> EngineErrorAnswer:
        if status == OVERLOADED:  # saturated, alive: another backend may take it
            return upstream_error(self.backend.name, self.kind, 503, err, retryable=True, busy=True)
        if status == CANCELLED:  # the frontend cancelled it (a worker went away mid-request)
            return upstream_error(self.backend.name, self.kind, 502, err, retryable=True, client_error=False)
        return super().classify(status, err)
