"""LM Studio's server (closed source), from its documentation: lmstudio-ai/docs `1_developer/2_rest/list.md`
@e70f746419e64f85d550ddcfc6cd05a5b9dd7db1 (`GET /api/v1/models`) and the OpenAI-compatibility pages
(`1_developer/3_openai-compat/*`: payload parameters, `stream_options.include_usage` since 0.3.18, API
tokens since 0.4.0).

- Port 1234. No health route and no metrics. API tokens are optional; when set, every route needs
  `Authorization: Bearer <token>` (401 in OpenAI's envelope).
- Errors are OpenAI's nested `{"error": {message, type, param, code}}`, in a stream too. An unknown
  model is 404 `model_not_found`. An unknown route answers `{"error": "Unexpected endpoint or method.
  (<METHOD> <path>)"}` (the emulator's reading of its log line; not in the documentation).
- `GET /api/v1/models`: the native listing; a loaded model has one instance (its id: the model key) whose
  `config.context_length` is the configured context length (`ctx_len`). `model` starts loaded; the
  `extra_models` are listed too, not loaded.
- Loading and unloading, from the REST API pages lmstudio.ai/docs/developer/rest/load and /unload (LM Studio
  0.4+): `POST /api/v1/models/load {"model": key}` answers, once loaded (after `load_delay_s`), `{"type":
  "llm", "instance_id", "load_time_seconds", "status": "loaded"}`; `POST /api/v1/models/unload
  {"instance_id"}` answers `{"instance_id"}` (the id that was unloaded); an unknown key or instance is 404.
  A model that is not loaded is refused like an unknown one (LM Studio with just-in-time loading off).
"""

from __future__ import annotations

import asyncio
import time
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
        self.route("POST", "/api/v1/models/load", self.load_model)
        self.route("POST", "/api/v1/models/unload", self.unload_model)
        self.loaded: set[str] = {self.cfg.model}

    def serves(self, model: Any) -> bool:
        return model in self.loaded

    async def models(self, req: Request) -> None:  # the loaded models only (just-in-time loading off)
        data = [{**self.card(), "id": k} for k in sorted(self.loaded)]
        await self.reply(req, self.uv_json(200, {"object": "list", "data": data}))

    def _field(self, req: Request, name: str) -> str | None:
        try:
            v = orjson.loads(req.body or b"{}").get(name)
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return v if isinstance(v, str) else None

    async def load_model(self, req: Request) -> None:
        key = self._field(req, "model")
        if key not in (self.cfg.model, *self.cfg.extra_models):
            await self.reply(req, self.refuse_model(key))
            return
        t0 = time.monotonic()
        if key not in self.loaded and self.cfg.load_delay_s:
            await asyncio.sleep(self.cfg.load_delay_s)
        self.loaded.add(key)
        took = round(time.monotonic() - t0, 3)
        body = {"type": "llm", "instance_id": key, "load_time_seconds": took, "status": "loaded"}
        await self.reply(req, self.uv_json(200, body))

    async def unload_model(self, req: Request) -> None:
        iid = self._field(req, "instance_id")
        if iid not in self.loaded:
            await self.reply(req, self.err(404, f'No loaded model instance "{iid}".', "model_not_found"))
            return
        self.loaded.discard(iid)
        await self.reply(req, self.uv_json(200, {"instance_id": iid}))

    def err(self, status: int, message: str, code: str | None = None) -> Reply:
        etype = "invalid_request_error" if status < 500 else "server_error"
        return self.uv_json(status, {"error": {"message": message, "type": etype, "param": None, "code": code}})

    def refuse_model(self, model: Any) -> Reply:
        return self.err(404, f'Model "{model}" not found. Load it or check the identifier.', "model_not_found")

    async def no_route(self, req: Request, kind: str) -> None:
        await self.reply(req, self.uv_json(404, {"error": f"Unexpected endpoint or method. ({req.method} {req.path})"}))

    async def native_models(self, req: Request) -> None:
        await self.reply(
            req, self.uv_json(200, {"models": [self._card(k) for k in (self.cfg.model, *self.cfg.extra_models)]})
        )

    def _card(self, key: str) -> dict[str, Any]:
        loaded = [{"id": key, "config": {"context_length": self.cfg.ctx_len}}] if key in self.loaded else []
        return {
            "type": "llm",
            "publisher": "emulator",
            "key": key,
            "display_name": key,
            "architecture": "llama",
            "quantization": {"name": "Q4_0", "bits_per_weight": 4},
            "size_bytes": 1_000_000,
            "params_string": "1M",
            "loaded_instances": loaded,
            "max_context_length": self.cfg.ctx_len,
            "format": "gguf",
            "capabilities": {"vision": False, "trained_for_tool_use": True},
            "description": None,
        }

    def stream_error(self) -> bytes:
        err = {"message": "The model crashed during generation.", "type": "server_error", "param": None, "code": None}
        return b"data: " + orjson.dumps({"error": err}) + b"\n\n"
