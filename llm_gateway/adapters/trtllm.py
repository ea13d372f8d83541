"""TensorRT-LLM's OpenAI server (`trtllm-serve`).

Read from NVIDIA/TensorRT-LLM `tensorrt_llm/serve/openai_protocol.py` @0076e9390e1ed11515f149eec356f5a03f4a00d8
(PyPI tensorrt-llm 1.2.1 line) and, for the routes, `tensorrt_llm/serve/openai_server.py` @e7f7345:

- Every request model is `OpenAIBaseModel` with `extra="forbid"`: a field it does not declare is a 400.
  So this adapter sends only the fields its `ChatCompletionRequest` / `CompletionRequest` /
  `EmbeddingRequest` declare (`ACCEPTED`): an OpenAI field the table lets through that it lacks (the
  hints metadata, store, service_tier, prompt-cache keys; a refused field at a value asking nothing,
  `functions: []`) cannot change an answer and is dropped; any other field it does not declare (another
  engine's extras) is refused here with the engine's reason, before the engine is called.
- Chat's `max_completion_tokens` takes `max_tokens` as its validation alias: sending both names would
  make one of them an extra field, so chat sends `max_tokens` only (the other is not in `ACCEPTED`).
- `stream_options` outside a stream is refused by its validators ("stream_options can only be set if
  stream is true"): dropped from a whole request. Once sent, `include_usage` defaults to true.
- Errors are flat `ErrorResponse{object:"error", message, type, param, code:int}` (read by
  error_bodies), in a stream too (`data: {ErrorResponse}`: `flat_stream_errors`; `openai_server.py`
  @00057725d9a6591f033e44f31c219e2426827bb7); request validation failures are 400 `{"error": "<pydantic's
  text>"}` (its `RequestValidationError` handler). `suffix` is refused by its `check_suffix` validator;
  chat's `parallel_tool_calls` is "accepted for compatibility. `false` is not enforced": refused here.
- Health: `GET /health` is liveness (200); `/health_generate` runs a generation and is never probed.
  Its `/metrics` is JSON iteration stats drained by each read (Prometheus only at
  `/prometheus/metrics`, with perf metrics on), so no load is read: the gateway counts in-flight.
- `ModelCard{id, owned_by:"tensorrt_llm"}` has no context window: set `context_length` on the
  deployment. `priority` there is a float in [0, 1], not a class rank: not passed.
- Weight formats: Hugging Face checkpoints (safetensors, FP8, and ModelOpt AWQ/GPTQ quantised ones).
- The API server is FastAPI on uvicorn: connections stay open after a stream (no `closes_after_stream`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from llm_gateway.adapters.field_table import (
    FieldTable,
    chat_fields,
    completions_fields,
    passed,
    refused,
    unsupported,
)
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.types import Endpoint

_AT = "tensorrt_llm/serve/openai_protocol.py @0076e93"
_CHAT = f"ChatCompletionRequest.to_sampling_params ({_AT})"
_CMPL = f"CompletionRequest.to_sampling_params ({_AT})"
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias")
FIELDS = FieldTable(
    "TensorRT-LLM",
    chat_fields(
        {
            **{k: passed(_CHAT) for k in ("messages", "stream", *_SAMPLING, "logprobs", "top_logprobs")},
            **{k: passed(_CHAT) for k in ("response_format", "reasoning_effort", "tools", "tool_choice")},
            "parallel_tool_calls": refused("'false is not enforced' (ChatCompletionRequest)", True),
        }
    ),
    completions_fields(
        {
            **{k: passed(_CMPL) for k in ("prompt", "stream", "max_tokens", *_SAMPLING, "logprobs", "echo")},
            "best_of": passed(_CMPL),
            "suffix": refused("'suffix is not supported' (CompletionRequest.check_suffix)", ""),
        }
    ),
)
_SHARED = {"model", "stream", "stream_options", "user", "n", "seed", "stop", "temperature", "top_p", "logit_bias"}
_SHARED |= {"frequency_penalty", "presence_penalty", "response_format", "priority", "disaggregated_params"}
_SHARED |= {"conversation_params", "lora_request", "prompt_ignore_length", "use_beam_search", "top_k", "min_p"}
_SHARED |= {"top_p_min", "repetition_penalty", "length_penalty", "early_stopping", "stop_token_ids", "ignore_eos"}
_SHARED |= {"include_stop_str_in_output", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens"}
_SHARED |= {"truncate_prompt_tokens", "thinking_token_budget", "add_special_tokens", "best_of", "echo", "logprobs"}
#: the fields each request model declares (everything else is `extra="forbid"`)
ACCEPTED: dict[str, frozenset[str]] = {
    "chat": frozenset(
        _SHARED
        | {"messages", "prompt_token_ids", "max_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"}
        | {"reasoning_effort", "thinking", "add_generation_prompt", "documents", "chat_template"}
        | {"chat_template_kwargs", "media_io_kwargs", "cache_salt", "agent_hierarchy", "mm_processor_kwargs"}
    ),
    "completions": frozenset(_SHARED | {"prompt", "max_tokens", "suffix", "return_context_logits", "detokenize"}),
    "embeddings": frozenset({"model", "input", "encoding_format", "dimensions", "user", "add_special_tokens"}),
}


class TRTLLMAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "trtllm"
    formats: ClassVar[frozenset[str] | None] = frozenset({"safetensors", "fp8", "awq", "gptq"})
    reasoning_key: ClassVar[str | None] = "reasoning_content"
    field_table: ClassVar[FieldTable | None] = FIELDS
    flat_stream_errors: ClassVar[bool] = True

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        if not body.get("stream"):
            body.pop("stream_options", None)
        accepted = ACCEPTED[endpoint]
        tables = FIELDS.tables.get(endpoint, {})
        for k in [k for k in body if k not in accepted]:
            if k in tables:  # an OpenAI field the table let through (a hint, a value asking nothing): it
                del body[k]  # cannot change the answer, and the engine would refuse the request for it
            else:
                raise unsupported(k, "TensorRT-LLM", 'not a field of its request (extra="forbid": a 400 there)')
