"""Aphrodite Engine (`aphrodite run`, a vLLM fork with its own samplers), on port 2242 by default.

Read from aphrodite-engine/aphrodite-engine @3bce4a6fa6243159abf925d94c56662ca0a4663a:
`aphrodite/entrypoints/openai/chat_completion/protocol.py` (the request), `engine/protocol.py`
(`ModelCard`), `server_utils.py` (auth), `kobold/api_router.py` (its KoboldAI routes, not used here), and
`aphrodite/v1/metrics/loggers.py` for the metric names. No real Aphrodite runs here (its wheel is CUDA,
the CPU build is from source): the emulator plays what is read.

- vLLM's surface: Bearer auth on `/v1*` (401 `{"error": "Unauthorized"}`), nested
  `{"error": {message, type, param, code}}` errors, `/health` 200 or 503 (engine dead), `ModelCard`
  with `max_model_len` (the context window; prompt plus `max_tokens` over it is refused:
  `window_counts_output`) and `owned_by: "aphrodite"`.
- Load: `aphrodite:num_requests_running`, `aphrodite:num_requests_waiting`,
  `aphrodite:kv_cache_usage_perc`; asleep when `aphrodite:engine_sleep_state{sleep_state="awake"}` is 0.
- Reasoning text is `reasoning`; finish reasons `abort`/`error` fail the generation, as vLLM's.
- Request fields: vLLM's tables (its request models are vLLM's with `extra="allow"` and Aphrodite's own
  samplers added: DRY, XTC, mirostat, dynatemp, `top_a`, `tfs`, `nsigma`, `skew`, `smoothing_factor`),
  so the same OpenAI fields are honoured and refused; its samplers pass through as extras.
- Weight formats: vLLM's, plus EXL2 (Aphrodite kept an ExLlamaV2 kernel path) and GGUF.
- FastAPI on uvicorn: connections stay open after a stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from llm_gateway.adapters.field_table import FieldTable
from llm_gateway.adapters.openai_compat import TO_REPETITION_PENALTY, OpenAICompatAdapter
from llm_gateway.adapters.vllm import FIELDS as VLLM_FIELDS
from llm_gateway.adapters.vllm import sleeping

FIELDS = FieldTable("Aphrodite", VLLM_FIELDS.tables["chat"], VLLM_FIELDS.tables["completions"])


class AphroditeAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "aphrodite"
    formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "awq", "gptq", "fp8", "gguf", "exl2"})
    reports_load: ClassVar[bool] = True
    load_metrics = (
        ("aphrodite:num_requests_running",),
        ("aphrodite:num_requests_waiting",),
        ("aphrodite:kv_cache_usage_perc",),
    )
    reasoning_key: ClassVar[str | None] = "reasoning"
    error_finish_reasons: ClassVar[tuple[str, ...]] = ("abort", "error")
    window_field: ClassVar[str | None] = "max_model_len"
    window_counts_output: ClassVar[bool] = True
    renames: ClassVar[Mapping[str, str]] = TO_REPETITION_PENALTY
    field_table: ClassVar[FieldTable | None] = FIELDS

    def residency(self, models: frozenset[str] | None) -> dict[str, bool] | None:
        found = super().residency(models)
        body = self.metrics_body
        if found is not None and body is not None and sleeping(body, "aphrodite:"):
            return dict.fromkeys(found, False)
        return found
