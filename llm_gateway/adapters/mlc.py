"""MLC LLM's server (`mlc_llm serve`).

Read from mlc-ai/mlc-llm @01ced331a9e155c5ba4e7625b027a51bee611450: `python/mlc_llm/protocol/error_protocol.py`,
`python/mlc_llm/protocol/openai_api_protocol.py`, `python/mlc_llm/serve/entrypoints/openai_entrypoints.py`.
No real MLC LLM runs here (its PyPI names are placeholders); the emulator plays what is read.

- Errors are `ErrorResponse{object:"error", message, code}` serialised twice: `JSONResponse(model.
  model_dump_json())`, so the body is a JSON *string* holding the JSON object. Unwrapped here, then read
  like any flat error.
- A model it does not serve is a 400 `The requested model "<m>" is not served.`: read as the model
  missing (the gateway's 502 `upstream_model_not_found`, tried elsewhere), like a 404.
- No health route: readiness is `GET /v1/models` (`ModelResponse{id, object, created, owned_by}`, no
  context window). No auth. Its Prometheus `/metrics` covers one engine's internals, no queue gauge:
  load is the gateway's own count.
- `stream_options` without `stream: true` fails validation: dropped from a whole request.
- Request fields (`ChatCompletionRequest`, `CompletionRequest`): chat takes `max_tokens` only (it has
  no max_completion_tokens, which pydantic would drop); n, seed, logit_bias, logprobs/top_logprobs, the
  penalties, stop, tools and tool_choice none/auto/a named function are its fields; `response_format`
  is `{type: "json_object", schema: <a JSON string>}`: a json_schema one is translated to it, other
  types are refused. `parallel_tool_calls` and `reasoning_effort` are not its fields: refused.
  Completions refuse `best_of` (`openai_api_get_unsupported_fields`), and `echo`/`suffix` are fields
  read nowhere in its serving path: refused.
- Weights are MLC's own compiled format (`format: mlc`, e.g. q4f16_1 folders with a model library).
"""

from __future__ import annotations

from typing import Any, ClassVar

import orjson

from llm_gateway.adapters.field_table import (
    FieldTable,
    chat_fields,
    completions_fields,
    passed,
    refused,
    translated,
    unsupported,
)
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import Endpoint

_AT = "python/mlc_llm/protocol/openai_api_protocol.py @01ced33"
_SAMPLING = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias")
_NOT_A_FIELD = f"not a field of its request ({_AT}): pydantic drops it"
FIELDS = FieldTable(
    "MLC LLM",
    chat_fields(
        {
            **{k: passed(_AT) for k in ("messages", "stream", *_SAMPLING, "logprobs", "top_logprobs", "tools")},
            "tool_choice": passed(f"{_AT}: none, auto or a named function", accepted=(None, "auto", "none")),
            "response_format": translated("json_schema -> its {type: json_object, schema: <string>}"),
            "parallel_tool_calls": refused(_NOT_A_FIELD, True),
            "reasoning_effort": refused(_NOT_A_FIELD),
        }
    ),
    completions_fields(
        {
            **{k: passed(_AT) for k in ("prompt", "stream", "max_tokens", *_SAMPLING, "logprobs")},
            "best_of": refused("openai_api_get_unsupported_fields names it", 1),
            "echo": refused("read nowhere in its serving path", False),
            "suffix": refused("read nowhere in its serving path", ""),
        }
    ),
)


def unwrap_json_string(body: bytes) -> bytes:
    """A body that is a JSON string holding JSON (MLC's twice-serialised error) -> the inner JSON."""
    if not body.lstrip().startswith(b'"'):
        return body
    try:
        inner = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    return inner.encode() if isinstance(inner, str) else body


class MLCAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "mlc"
    formats: ClassVar[frozenset[str] | None] = frozenset({"mlc"})
    health_path: ClassVar[str | None] = None  # no health route: /v1/models answers once it serves
    field_table: ClassVar[FieldTable | None] = FIELDS

    def translate(self, endpoint: Endpoint, body: dict[str, Any]) -> None:
        body.pop("max_completion_tokens", None)  # not its field; max_tokens carries the limit
        if not body.get("stream"):
            body.pop("stream_options", None)
        rf = body.get("response_format")
        if isinstance(rf, dict) and rf.get("type") == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema") if isinstance(rf.get("json_schema"), dict) else None
            body["response_format"] = {"type": "json_object", "schema": orjson.dumps(schema or {}).decode()}
        elif isinstance(rf, dict) and rf.get("type", "text") not in ("text", "json_object"):
            raise unsupported("response_format", "MLC LLM", f"type {rf.get('type')!r} (it takes text, json_object)")

    def error(self, status: int, body: bytes, content_type: str) -> EngineErrorAnswer:
        body = unwrap_json_string(body)
        if status == 400 and b"is not served" in body:
            return super().error(404, body, content_type)
        return super().error(status, body, content_type)
