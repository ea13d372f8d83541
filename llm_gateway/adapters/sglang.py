"""SGLang (`python -m sglang.launch_server`).

- Non-streamed errors are flat `{"object": "error", "message", "type", "param", "code"}`; stream
  errors are `data: {"error": {flat}}`; auth failures `{"error": "Unauthorized"}`.
- `/health` answers 503 while the server starts (warm-up) and during shutdown.
- Load (only with `--enable-metrics`): `sglang:num_running_reqs`, `sglang:num_queue_reqs`,
  `sglang:token_usage` (KV token-pool fraction). Without metrics the probe falls back to `/get_load`.
- Context window: the `/v1/models` card's `max_model_len` (sgl-project/sglang
  `python/sglang/srt/entrypoints/openai/protocol.py` `ModelCard` @9b116df, reference.md). Prompt plus
  `max_new_tokens` over it is refused, unless the server runs with `--allow-auto-truncate`, which cuts
  `max_new_tokens` instead (`_validate_one_request` in `python/sglang/srt/managers/tokenizer_manager.py`):
  the output is not counted in the fit check (no `window_counts_output`), only the prompt.
- `finish_reason` may be `"abort"` (reference.md, SG protocol.py @9b116df: the engine aborted the
  request): the generation failed, a 502 `generation_failed` that still bills its usage (SGLang's
  counts, or an estimate of the text).
- Reasoning text is `reasoning_content`. `repeat_penalty` becomes `repetition_penalty`.
- Request fields: `FIELDS` (adapters/field_table.py). Its `ChatCompletionRequest.to_sampling_params`
  (sgl-project/sglang `python/sglang/srt/entrypoints/openai/protocol.py` @004c82e07d876f6e4a0ad6e15325706b0f478f1a)
  sends n, logit_bias, seed (`sampling_seed`), the penalties and response_format (json_object,
  json_schema, structural_tag) to the sampler; logprobs/top_logprobs, tools, tool_choice and
  reasoning_effort are request fields it acts on. OpenAI-only fields (audio, modalities, verbosity,
  functions, web search) are not fields of it (pydantic drops them): refused. So are
  `parallel_tool_calls: false`, enforced only where a grammar constrains the tool call (tool_choice
  required), never for auto (sgl-project/sglang#9696; the fix, PR #37157, is open), and, on
  completions (`serving_completions.py` @004c82e `_build_sampling_params`), `best_of` (never read: `n`
  is the one fan-out) and `suffix` (read only with `--completion-template`, which the gateway cannot
  see). `echo` is honoured.
- Anthropic's Messages API is translated to chat (no `native_apis`): its own /v1/messages is not
  faithful (sgl-project/sglang `python/sglang/srt/entrypoints/anthropic/serving.py`
  @0198d48d21ccf1f0fc0015736b534948295b893b): the stream drops the reasoning (no thinking blocks:
  bifrost#2446's failure) and the text of the chunk that carries the finish reason; a matched stop
  sequence is "end_turn"; `thinking`, `output_config` and `disable_parallel_tool_use` are dropped;
  an error of the chat handler (a prompt too long) becomes 500 "Internal processing error", which
  would read as a failing backend; a mid-stream error is an error event after which the stream goes
  on. The emulator has no such route either.
- The connection stays open after a streamed answer: the server is FastAPI on uvicorn
  (`python/sglang/srt/entrypoints/http_server.py`, `StreamingResponse`), and uvicorn ends a streamed
  body with the last chunk and keeps the connection for the next request unless the request said
  `Connection: close`. Read from the source (no real SGLang runs here), so no `closes_after_stream`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import orjson

from llm_gateway.adapters.base import ProbeClient
from llm_gateway.adapters.field_table import FieldTable, chat_fields, completions_fields, passed, refused
from llm_gateway.adapters.lora import LoraDriver, SGLangLora
from llm_gateway.adapters.openai_compat import TO_REPETITION_PENALTY, OpenAICompatAdapter
from llm_gateway.types import LoadSnapshot

_AT = "python/sglang/srt/entrypoints/openai/protocol.py @004c82e"
_CHAT = f"ChatCompletionRequest, to_sampling_params ({_AT})"
_CMPL = f"CompletionRequest, serving_completions.py _build_sampling_params ({_AT})"
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias")
FIELDS = FieldTable(
    "SGLang",
    chat_fields(
        {
            **{k: passed(_CHAT) for k in ("messages", "stream", *_SAMPLING, "logprobs", "top_logprobs")},
            **{k: passed(_CHAT) for k in ("response_format", "reasoning_effort", "tools", "tool_choice")},
            "parallel_tool_calls": refused(
                "false is not enforced for tool_choice auto (sgl-project/sglang#9696)", True
            ),
        }
    ),
    completions_fields(
        {
            **{k: passed(_CMPL) for k in ("prompt", "stream", "max_tokens", *_SAMPLING, "logprobs", "echo")},
            "best_of": refused("its sampling parameters never read best_of (n is the one fan-out)", 1),
            "suffix": refused("read only with --completion-template (parser/code_completion_parser.py)", ""),
        }
    ),
)


class SGLangAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "sglang"
    formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "awq", "gptq", "fp8"})
    reports_load: ClassVar[bool] = True
    load_metrics = (("sglang:num_running_reqs",), ("sglang:num_queue_reqs",), ("sglang:token_usage",))
    reasoning_key: ClassVar[str | None] = "reasoning_content"
    ignores_model_name: ClassVar[bool] = True
    window_field: ClassVar[str | None] = "max_model_len"
    error_finish_reasons: ClassVar[tuple[str, ...]] = ("abort",)
    renames: ClassVar[Mapping[str, str]] = TO_REPETITION_PENALTY
    field_table: ClassVar[FieldTable | None] = FIELDS
    #: `--enable-priority-scheduling` reads the request's `priority`, higher values first unless
    #: `--schedule-low-priority-values-first` (sglang srt/managers/schedule_policy.py `priority_sign`)
    schedules_by_priority: ClassVar[bool] = True
    lora: ClassVar[LoraDriver | None] = SGLangLora()

    def engine_priority(self, rank: int) -> int:
        return rank  # interactive 2, default 1, batch 0

    async def probe_load(self, client: ProbeClient) -> LoadSnapshot | None:
        snap = await super().probe_load(client)
        if snap is not None and snap.running is not None:
            return snap
        status, body = await client.get("/get_load", self.auth_headers())
        if status != 200:
            return snap
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return snap
        ranks = data if isinstance(data, list) else [data]
        running = waiting = 0.0
        seen = False
        for r in ranks:
            if isinstance(r, dict):
                for k in ("num_reqs", "num_running_reqs"):
                    if isinstance(r.get(k), int | float):
                        running += r[k]
                        seen = True
                        break
                if isinstance(r.get("num_waiting_reqs"), int | float):
                    waiting += r["num_waiting_reqs"]
        if not seen:
            return snap
        return LoadSnapshot(running=running, waiting=waiting, kv=None, at=client.now())
