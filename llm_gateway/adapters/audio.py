"""Speech to text on the engines (capability `audio`): OpenAI's `/v1/audio/transcriptions` and
`/v1/audio/translations`, multipart/form-data both ways of the gateway.

vLLM serves both paths with OpenAI's form (vllm-project/vllm v0.32.0
`vllm/entrypoints/speech_to_text/transcription/api_router.py` and `.../translation/api_router.py`: a
`TranscriptionRequest` read as a `Form()` with `file`, `model`, `language`, `prompt`, `response_format` (json),
`temperature`, `stream`; answers `TranscriptionResponse` {text, usage: {type: duration, seconds}} or
`TranslationResponse` {text} as JSON, or server-sent events with `stream`). The form goes on as it came, its
`model` field (the public name) replaced by the engine's (dialects/audio.py splices it). Only vLLM is an engine kind
with these routes; the others are refused the capability in config (adapters/registry.py).
"""

from __future__ import annotations

from typing import Literal

from llm_gateway.adapters.base import Adapter, TokenizeClient
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter

AUDIO_KINDS = frozenset({"vllm"})
Task = Literal["transcriptions", "translations"]


async def speech_to_text(
    adapter: Adapter, client: TokenizeClient, task: Task, form: bytes, content_type: str
) -> tuple[int, bytes]:
    """(status, answer) of the engine for the multipart `form` (already naming the engine's model)."""
    if adapter.kind not in AUDIO_KINDS or not isinstance(
        adapter, OpenAICompatAdapter
    ):  # config validation keeps other engines from the capability
        raise NotImplementedError(f"{adapter.kind} serves no /v1/audio")
    headers = {**adapter.headers, "Content-Type": content_type}
    return await client.post(f"/v1/audio/{task}", form, headers)
