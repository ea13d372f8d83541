"""NVIDIA Dynamo's OpenAI frontend with one worker, from ai-dynamo/dynamo's source.

Read at `lib/llm/src/http/service/error.rs` @09ca8c2d3d364e241d4115537d81c078052f1948 (error classes),
`lib/llm/src/http/service/service_v2.rs` @00287ef (routes) and `lib/runtime/src/metrics/prometheus_names.rs`
@4415465 (metric names), and the shared anchors' run of the real frontend with `dynamo.mocker` (404 body):

- An axum server, no auth. `GET /live` 200; `GET /health` lists the worker instances; the model is
  served once its worker registers (here: after `load_delay_s`; before it, `/v1/models` is empty and
  a request for it is 404).
- Errors are flat `{"message", "type": <HTTP reason>, "code": <status>}`; a model it does not serve:
  404 `{"message":"Model not found","type":"Not Found","code":404}`. Admission control refuses with
  **529** "Service temporarily overloaded" (`DYN_HTTP_OVERLOAD_STATUS_CODE`): here when `max_queue`
  requests already wait.
- Cards: `{id, object, created, owned_by: "nvidia", context_window}`.
- `/metrics`: `dynamo_frontend_inflight_requests` and `dynamo_frontend_queued_requests` per model.
- A worker failing mid-stream: the emulator cuts the stream (the frontend's error event is not read).
"""

from __future__ import annotations

from typing import Any

from llm_gateway_emulators.engines.openai_family import OpenAIFamily
from llm_gateway_emulators.httpserver import Request, reason
from llm_gateway_emulators.jobs import InferenceJob, Reply

OVERLOADED = 529


class Dynamo(OpenAIFamily):
    name = "dynamo"
    owned_by = "nvidia"
    hyper = True
    health_paths = ("/live", "/health")
    keyed_paths = frozenset()

    def err(self, status: int, message: str) -> Reply:
        return self.uv_json(status, {"message": message, "type": reason(status), "code": status})

    def refuse_model(self, model: Any) -> Reply:
        return self.err(404, "Model not found")

    def card(self) -> dict[str, Any]:
        return {**super().card(), "context_window": self.cfg.ctx_len}

    async def models(self, req: Request) -> None:
        data = [] if self.rt.loading() else [self.card()]
        await self.reply(req, self.uv_json(200, {"object": "list", "data": data}))

    async def health(self, req: Request) -> None:
        if req.path == "/live":
            await self.reply(req, self.uv_json(200, {"status": "live"}))
            return
        instances = [] if self.rt.loading() else [{"component": "backend", "endpoint": "generate", "instance_id": 1}]
        status = "healthy" if instances and self.cfg.health != "unhealthy" else "unhealthy"
        await self.reply(
            req, self.uv_json(200 if status == "healthy" else 503, {"status": status, "instances": instances})
        )

    async def generate(self, req: Request, job: InferenceJob) -> None:
        if self.rt.loading():
            await self.reply(req, self.refuse_model(None))
            return
        job.queue_bound = self.cfg.max_queue

        async def overloaded(r: Request) -> None:
            await self.reply(r, self.err(OVERLOADED, "Service temporarily overloaded"))

        job.queue_full = overloaded
        await super().generate(req, job)

    def metrics_reply(self) -> Reply | None:
        m = f'model="{self.cfg.model}"'
        lines = [
            "# TYPE dynamo_frontend_inflight_requests gauge",
            f"dynamo_frontend_inflight_requests{{{m}}} {self.pool.running + self.pool.waiting}",
            "# TYPE dynamo_frontend_queued_requests gauge",
            f"dynamo_frontend_queued_requests{{{m}}} {self.pool.reported_waiting()}",
        ]
        body = ("\n".join(lines) + "\n").encode()
        heads = [("content-type", "text/plain; version=0.0.4"), ("content-length", str(len(body)))]
        return 200, [*heads, ("date", self.dates.now())], body

    def stream_error(self) -> bytes:
        return b""  # not read: the stream is cut
