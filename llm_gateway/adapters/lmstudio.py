"""LM Studio's server (the app, or the headless `llmster` daemon), on port 1234 by default.

Closed source: read from its documentation, lmstudio-ai/docs `1_developer/2_rest/list.md`
@e70f746419e64f85d550ddcfc6cd05a5b9dd7db1 (`GET /api/v1/models`), the OpenAI-compatibility pages
(`1_developer/3_openai-compat/*`: "Supported payload parameters", tools, structured output,
`stream_options.include_usage` since 0.3.18) and the changelog (API tokens since 0.4.0). No real LM Studio
runs here; the emulator plays what the documentation says.

- OpenAI routes `/v1/models`, `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`,
  `/v1/responses`; API tokens (Bearer) are optional. No health route and no metrics: readiness is
  `GET /v1/models` (which, with Just-In-Time loading, lists every downloaded model), load is the
  gateway's own count.
- Residency and context windows come from its native `GET /api/v1/models`: each model's
  `loaded_instances[]` (an instance's `id` is the name requests use, `config.context_length` its
  window); a model with no loaded instance is downloaded but not resident (JIT loads it on first use,
  and `ttl` evicts it when idle).
- Errors are OpenAI's nested `{"error": {...}}` shape.
- Request fields: the documented payload parameters (temperature, top_p, max_tokens, stop, seed,
  presence/frequency_penalty, logit_bias, stream, and its own top_k and repeat_penalty), tools and
  tool_choice, `response_format` json_schema; n, logprobs, parallel_tool_calls and reasoning_effort are
  not among them: refused, as are completions' echo, best_of and suffix.
- Weight formats: GGUF (llama.cpp runtime) and MLX (Apple silicon).
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient
from llm_gateway.adapters.field_table import FieldTable, chat_fields, completions_fields, passed, refused
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter, window_size
from llm_gateway.types import ProbeResult

_DOC = "'Supported payload parameters' (lmstudio-ai/docs 1_developer/3_openai-compat)"
_NOT = f"not among its {_DOC}"
_READ = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "logit_bias")
FIELDS = FieldTable(
    "LM Studio",
    chat_fields(
        {
            **{k: passed(_DOC) for k in ("messages", "stream", *_READ)},
            **{k: passed("tool use and structured output pages") for k in ("tools", "tool_choice", "response_format")},
            "n": refused(_NOT, 1),
            "logprobs": refused(_NOT, False),
            "top_logprobs": refused(_NOT, 0),
            "parallel_tool_calls": refused(_NOT, True),
            "reasoning_effort": refused(_NOT),
        }
    ),
    completions_fields(
        {
            **{k: passed(_DOC) for k in ("prompt", "stream", "max_tokens", *_READ)},
            "n": refused(_NOT, 1),
            "logprobs": refused(_NOT),
            "echo": refused(_NOT, False),
            "best_of": refused(_NOT, 1),
            "suffix": refused(_NOT, ""),
        }
    ),
)
NATIVE_MODELS = "/api/v1/models"


def loaded_instances(body: bytes) -> tuple[dict[str, bool], dict[str, int]] | None:
    """From `/api/v1/models`: residency of every model name (loaded instance ids and model keys) and the
    context window of each loaded instance; None when the body is not that listing."""
    try:
        models = orjson.loads(body).get("models")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(models, list):
        return None
    resident: dict[str, bool] = {}
    windows: dict[str, int] = {}
    for m in models:
        if not isinstance(m, dict) or m.get("type", "llm") != "llm":
            continue
        instances = [i for i in m.get("loaded_instances") or () if isinstance(i, dict) and i.get("id")]
        if isinstance(m.get("key"), str):
            resident[m["key"]] = bool(instances)
        for inst in instances:
            resident[str(inst["id"])] = True
            config: Any = inst.get("config")
            n = window_size(config.get("context_length")) if isinstance(config, dict) else None
            if n is not None:
                windows[str(inst["id"])] = n
    return resident, windows


class LMStudioAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "lmstudio"
    formats: ClassVar[frozenset[str] | None] = frozenset({"gguf", "mlx"})
    health_path: ClassVar[str | None] = None
    resident_when_ready: ClassVar[bool] = False  # JIT loading: the native listing says what is loaded
    field_table: ClassVar[FieldTable | None] = FIELDS

    async def probe(self, client: ProbeClient) -> ProbeResult:
        base = await super().probe(client)
        if base.state != "ready":
            return base
        status, body = await client.get(NATIVE_MODELS, self.auth_headers())
        found = loaded_instances(body) if status == 200 else None
        if found is None:
            return base
        resident, windows = found
        models = base.models
        return ProbeResult(
            "ready",
            load=base.load,
            models=models,
            detail=base.detail,
            context_lengths=windows or base.context_lengths,
            resident={m: resident.get(m, False) for m in models} if models else None,
        )
