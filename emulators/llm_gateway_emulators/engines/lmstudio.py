"""LM Studio's server (closed source), from its documentation: lmstudio-ai/docs `1_developer/2_rest/list.md`
@e70f746419e64f85d550ddcfc6cd05a5b9dd7db1 (`GET /api/v1/models`) and the OpenAI-compatibility pages
(`1_developer/3_openai-compat/*`: payload parameters, `stream_options.include_usage` since 0.3.18, API
tokens since 0.4.0).

- Port 1234. No health route and no metrics. API tokens are optional; when set, every route needs
  `Authorization: Bearer <token>` (401 in OpenAI's envelope).
- Errors are OpenAI's nested `{"error": {message, type, param, code}}`, in a stream too. An unknown
  model is 404 `model_not_found`. An unknown route answers `{"error": "Unexpected endpoint or method.
  (<METHOD> <path>)"}` (the emulator's reading of its log line; not in the documentation).
- `GET /api/v1/models`: the native listing; the served model has one loaded instance whose
  `config.context_length` is the configured context length (`ctx_len`).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway_emulators.engines.openai_family import OpenAIFamily
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import Reply


class LmStudio(OpenAIFamily):
    name = "lmstudio"
    owned_by = "organization_owner"
    health_paths = ()

    def extra_routes(self) -> None:
        self.route("GET", "/api/v1/models", self.native_models)

    def err(self, status: int, message: str, code: str | None = None) -> Reply:
        etype = "invalid_request_error" if status < 500 else "server_error"
        return self.uv_json(status, {"error": {"message": message, "type": etype, "param": None, "code": code}})

    def refuse_model(self, model: Any) -> Reply:
        return self.err(404, f'Model "{model}" not found. Load it or check the identifier.', "model_not_found")

    async def no_route(self, req: Request, kind: str) -> None:
        await self.reply(req, self.uv_json(404, {"error": f"Unexpected endpoint or method. ({req.method} {req.path})"}))

    async def native_models(self, req: Request) -> None:
        model = {
            "type": "llm",
            "publisher": "emulator",
            "key": self.cfg.model,
            "display_name": self.cfg.model,
            "architecture": "llama",
            "quantization": {"name": "Q4_0", "bits_per_weight": 4},
            "size_bytes": 1_000_000,
            "params_string": "1M",
            "loaded_instances": [{"id": self.cfg.model, "config": {"context_length": self.cfg.ctx_len}}],
            "max_context_length": self.cfg.ctx_len,
            "format": "gguf",
            "capabilities": {"vision": False, "trained_for_tool_use": True},
            "description": None,
        }
        await self.reply(req, self.uv_json(200, {"models": [model]}))

    def stream_error(self) -> bytes:
        err = {"message": "The model crashed during generation.", "type": "server_error", "param": None, "code": None}
        return b"data: " + orjson.dumps({"error": err}) + b"\n\n"
