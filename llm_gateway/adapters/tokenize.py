"""The engines' token utilities, `/tokenize` and `/detokenize`, spoken to in each engine's own shape and answered
in vLLM's, which is the gateway's (the `tokenize` capability of a deployment; service/tokenize.py routes to it).

The gateway's shapes are vLLM's (vllm-project/vllm `vllm/entrypoints/openai/protocol.py` @ec3b890:
`TokenizeCompletionRequest` {model, prompt, add_special_tokens (true), return_token_strs},
`TokenizeChatRequest` {model, messages, add_generation_prompt, tools, ...}, `TokenizeResponse` {count,
max_model_len, tokens, token_strs}; `DetokenizeRequest` {model, tokens}, `DetokenizeResponse` {prompt}). vLLM gets
the body as it is, with its own model name. llama-server (ggml-org/llama.cpp `tools/server/server-context.cpp`
@fb40266, `post_tokenize` / `post_detokenize`) takes {content, add_special (false unless sent), parse_special,
with_pieces} and answers {tokens: [id] or [{id, piece}]}, and {tokens} -> {content}; a chat `messages` prompt is
first rendered by its `/apply-template` (as adapters/llama_server.py counts a prompt), then tokenized with its
special tokens, as a generation would. Its `max_model_len` is the deployment's context window as probed (null when
unknown). Engines without these routes are refused the capability in config (adapters/registry.py).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.adapters.base import Adapter, TokenizeClient
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter, json_field, prompt_fields

#: the engine kinds that serve both routes
TOKENIZING_KINDS = frozenset({"vllm", "llama-server"})


async def tokenize(
    adapter: Adapter, client: TokenizeClient, body: dict[str, Any], upstream_model: str, window: int | None
) -> tuple[int, bytes]:
    """(status, answer): a 200 answer in vLLM's TokenizeResponse shape, or the engine's error answer as it came."""
    adapter = _speaking(adapter)
    if adapter.kind == "vllm":
        return await client.post("/tokenize", orjson.dumps({**body, "model": upstream_model}), adapter.headers)
    pieces = body.get("return_token_strs") is True
    if isinstance(body.get("messages"), list):
        status, data = await client.post("/apply-template", orjson.dumps(prompt_fields(body)), adapter.headers)
        prompt = json_field(data, "prompt") if status == 200 else None
        if not isinstance(prompt, str):
            return status, data
        req: dict[str, Any] = {"content": prompt, "add_special": True, "parse_special": True}
    else:
        req = {"content": body.get("prompt"), "add_special": body.get("add_special_tokens", True) is not False}
    req["with_pieces"] = pieces
    status, data = await client.post("/tokenize", orjson.dumps(req), adapter.headers)
    found = json_field(data, "tokens") if status == 200 else None
    if not isinstance(found, list):
        return status, data
    ids = [t["id"] if isinstance(t, dict) else t for t in found]
    strs = [t.get("piece") if isinstance(t, dict) else None for t in found] if pieces else None
    answer = {"count": len(ids), "max_model_len": window, "tokens": ids, "token_strs": strs}
    return 200, orjson.dumps(answer)


async def detokenize(
    adapter: Adapter, client: TokenizeClient, body: dict[str, Any], upstream_model: str
) -> tuple[int, bytes]:
    """(status, answer): a 200 answer in vLLM's DetokenizeResponse shape {prompt}, or the engine's error answer."""
    adapter = _speaking(adapter)
    if adapter.kind == "vllm":
        return await client.post("/detokenize", orjson.dumps({**body, "model": upstream_model}), adapter.headers)
    status, data = await client.post("/detokenize", orjson.dumps({"tokens": body.get("tokens")}), adapter.headers)
    content = json_field(data, "content") if status == 200 else None
    if not isinstance(content, str):
        return status, data
    return 200, orjson.dumps({"prompt": content})


def _speaking(adapter: Adapter) -> OpenAICompatAdapter:
    """The adapter of an engine that serves the routes (config validation keeps the others from the capability)."""
    if adapter.kind not in TOKENIZING_KINDS or not isinstance(adapter, OpenAICompatAdapter):
        raise NotImplementedError(f"{adapter.kind} serves no /tokenize")
    return adapter
