"""TensorRT-LLM's OpenAI server (`trtllm-serve`), from NVIDIA/TensorRT-LLM's source (no GPU here to run it).

Read at `tensorrt_llm/serve/openai_protocol.py` @0076e9390e1ed11515f149eec356f5a03f4a00d8 and
`tensorrt_llm/serve/openai_server.py` @00057725d9a6591f033e44f31c219e2426827bb7:

- FastAPI on uvicorn, port 8000, no API-key middleware. The port opens once the LLM is built
  (`listen_after_load`). `GET /health` is 200 (503 when `_check_health` fails); `/health_generate`
  and `/version` answer too. `GET /metrics` is the JSON list of iteration stats (empty here).
- `/v1/models` is one `ModelCard{id, object, created, owned_by: "tensorrt_llm"}`; the request's
  `model` is not checked.
- Request models are `extra="forbid"`: an undeclared field fails validation, and its
  `RequestValidationError` handler answers 400 `{"error": str(exc)}`. `stream_options` without
  `stream` fails the same way; a non-empty `suffix` is refused ("suffix is not supported").
  `max_completion_tokens` takes `max_tokens` as its alias. Other errors are the flat
  `ErrorResponse{object:"error", message, type, param, code}` (`create_error_response`), in a stream too.
- Once `stream_options` is sent, `include_usage` defaults to true.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway_emulators.engines.fastapi_base import Problem
from llm_gateway_emulators.engines.openai_family import OpenAIFamily
from llm_gateway_emulators.jobs import Reply

TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError", 501: "NotImplementedError"}
_COMMON = {"model", "stream", "stream_options", "user", "n", "seed", "stop", "temperature", "top_p", "logit_bias"}
_COMMON |= {"frequency_penalty", "presence_penalty", "response_format", "priority", "disaggregated_params", "echo"}
_COMMON |= {"conversation_params", "lora_request", "prompt_ignore_length", "use_beam_search", "top_k", "min_p"}
_COMMON |= {"top_p_min", "repetition_penalty", "length_penalty", "early_stopping", "stop_token_ids", "ignore_eos"}
_COMMON |= {"include_stop_str_in_output", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens"}
_COMMON |= {"truncate_prompt_tokens", "thinking_token_budget", "add_special_tokens", "best_of", "logprobs"}
#: the fields `ChatCompletionRequest` and `CompletionRequest` declare (both names of the aliased limit)
DECLARED = {
    True: frozenset(
        _COMMON
        | {"messages", "prompt_token_ids", "max_tokens", "max_completion_tokens", "top_logprobs", "tools"}
        | {"tool_choice", "parallel_tool_calls", "reasoning_effort", "thinking", "add_generation_prompt"}
        | {"documents", "chat_template", "chat_template_kwargs", "media_io_kwargs", "cache_salt"}
        | {"agent_hierarchy", "mm_processor_kwargs"}
    ),
    False: frozenset(_COMMON | {"prompt", "max_tokens", "suffix", "return_context_logits", "detokenize"}),
}


class TrtllmServe(OpenAIFamily):
    name = "trtllm"
    owned_by = "tensorrt_llm"
    listen_after_load = True
    usage_by_default = True
    any_model = True
    keyed_paths = frozenset()  # no auth

    def extra_routes(self) -> None:
        self.route("GET", "/health_generate", self.health)
        self.route("GET", "/version", self.version)

    async def version(self, req: Any) -> None:
        await self.reply(req, self.uv_json(200, {"version": self.cfg.version or "1.2.1"}))

    def err(self, status: int, message: str) -> Reply:
        flat = {"object": "error", "message": message, "type": TYPES.get(status, "BadRequestError")}
        return self.uv_json(status, {**flat, "param": None, "code": status})

    def invalid(self, p: Problem) -> Reply:
        return self.uv_json(400, {"error": p.fastapi_str()})  # its RequestValidationError handler

    def problem(self, p: Problem) -> Reply:
        return self.invalid(p)

    def check(self, body: dict[str, Any], chat: bool) -> Reply | None:
        for k, v in body.items():
            if k not in DECLARED[chat]:
                return self.invalid(Problem("extra_forbidden", ("body", k), "Extra inputs are not permitted", v))
        if chat and "max_tokens" in body and "max_completion_tokens" in body:  # the alias and the name
            v = body["max_completion_tokens"]
            return self.invalid(
                Problem("extra_forbidden", ("body", "max_completion_tokens"), "Extra inputs are not permitted", v)
            )
        if body.get("stream_options") is not None and not body.get("stream"):
            msg = "Value error, stream_options can only be set if stream is true"
            return self.invalid(Problem("value_error", ("body",), msg, body))
        if body.get("suffix"):
            return self.invalid(Problem("value_error", ("body",), "Value error, suffix is not supported", body))
        return None

    def metrics_reply(self) -> Reply | None:
        return self.uv_json(200, [])  # iteration stats, drained by each read; none kept here

    def stream_error(self) -> bytes:
        err = {"object": "error", "message": "Internal server error", "type": "InternalServerError"}
        return b"data: " + orjson.dumps({**err, "param": None, "code": 500}) + b"\n\n"
