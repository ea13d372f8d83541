"""OpenAI answers in Anthropic's shapes: a whole chat completion -> a message; errors -> Anthropic's envelope.

A message: `id` "msg_" + the engine's completion id, `type` message, `role` assistant, `model` (the
public model, as the chat answer has it), `content` blocks in Anthropic's order (thinking from the
engine's reasoning field, text, then tool_use with `input` parsed from the arguments JSON),
`stop_reason` (finish `length` -> max_tokens; tool calls -> tool_use; `stop` -> stop_sequence when
the engine says which of the client's stop sequences matched (vLLM `stop_reason`, SGLang
`matched_stop`), else end_turn; `content_filter` -> refusal), `stop_sequence`, and `usage`
(input_tokens without the engine's cached prompt tokens, which are cache_read_input_tokens, as
Anthropic counts them).

Errors: `{"type": "error", "error": {"type", "message"}, "request_id"}` with Anthropic's statuses: 400
invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error, 413
request_too_large, 429 rate_limit_error, 529 overloaded_error for the gateway's "cannot take it now"
errors (queue full, no healthy backend, unavailable, an engine that is busy), 504 timeout_error, and
api_error for the other server-side failures (their status kept: 500, 502).
"""

from __future__ import annotations

import os
from typing import Any

import orjson

from llm_gateway.errors import EngineErrorAnswer, GatewayError, NoHealthyBackend, Overloaded, ServiceUnavailable

REASONING_KEYS = ("reasoning_content", "reasoning")  # the gateway's configured name is one of these
OVERLOADED = 529


# -- errors ----------------------------------------------------------------------------------------------


def error_status(e: GatewayError) -> tuple[int, str]:
    """The HTTP status and Anthropic error type for a gateway error."""
    if isinstance(e, (Overloaded, NoHealthyBackend, ServiceUnavailable)) or (
        isinstance(e, EngineErrorAnswer) and e.busy
    ):
        return OVERLOADED, "overloaded_error"
    s = e.status
    if s == 401:
        return s, "authentication_error"
    if s == 403:
        return s, "permission_error"
    if s == 404:
        return s, "not_found_error"
    if s == 413:
        return s, "request_too_large"
    if s == 429:
        return s, "rate_limit_error"
    if s == 503:
        return OVERLOADED, "overloaded_error"
    if s == 504:
        return s, "timeout_error"
    if 400 <= s < 500:
        return s, "invalid_request_error"
    return s, "api_error"


def envelope(etype: str, message: str, rid: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "error": {"type": etype, "message": message}}
    if rid is not None:
        out["request_id"] = rid
    return out


def error_answer(e: GatewayError, rid: str) -> tuple[int, bytes]:
    """(status, body) of the Anthropic answer to a gateway error."""
    status, etype = error_status(e)
    return status, orjson.dumps(envelope(etype, e.message, rid))


_OVERLOADED_CODES = frozenset({"queue_full", "no_healthy_backend", "service_unavailable"})
_BY_CODE = {
    "invalid_api_key": "authentication_error",
    "model_not_allowed": "permission_error",
    "model_not_found": "not_found_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit_exceeded": "rate_limit_error",
    "upstream_timeout": "timeout_error",
}


def error_type_of(err: dict[str, Any]) -> str:
    """The Anthropic error type for the `error` object of an OpenAI envelope (a stream's error event,
    where no status is left to go by)."""
    code, etype = err.get("code"), err.get("type")
    if code in _OVERLOADED_CODES or etype in ("server_overloaded", "service_unavailable"):
        return "overloaded_error"
    if isinstance(code, str) and code in _BY_CODE:
        return _BY_CODE[code]
    if etype in ("requests", "tokens"):
        return "rate_limit_error"
    if etype in ("invalid_request_error", "permission_error"):
        return str(etype)
    return "api_error"


# -- whole answers ---------------------------------------------------------------------------------------


def message_id(engine_id: Any) -> str:
    if isinstance(engine_id, str) and engine_id:
        return "msg_" + engine_id.removeprefix("chatcmpl-")
    return "msg_" + os.urandom(12).hex()


def stop_reason(finish: Any, tools: bool, matched: Any, stops: tuple[str, ...]) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) for an OpenAI finish reason."""
    if tools or finish in ("tool_calls", "function_call"):
        return "tool_use", None
    if finish == "length":
        return "max_tokens", None
    if finish == "content_filter":
        return "refusal", None
    if isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def matched_stop(choice: dict[str, Any]) -> Any:
    """Which stop string ended the generation, where the engine says (vLLM, SGLang)."""
    m = choice.get("stop_reason")
    return m if m is not None else choice.get("matched_stop")


def usage(u: Any) -> dict[str, int]:
    """Anthropic usage for an OpenAI usage object: cached prompt tokens are cache reads."""
    prompt = completion = cached = 0
    if isinstance(u, dict):
        p, c = u.get("prompt_tokens"), u.get("completion_tokens")
        prompt = p if isinstance(p, int) else 0
        completion = c if isinstance(c, int) else 0
        details = u.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = min(details["cached_tokens"], prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def tool_input(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments JSON as Anthropic's `input` object. What is not a JSON object (a small
    model's broken JSON) is kept under `_raw_arguments`, so that the client's tool validation says so."""
    if isinstance(arguments, dict):
        return arguments
    if not isinstance(arguments, str) or not arguments.strip():
        return {}
    try:
        v = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {"_raw_arguments": arguments}
    return v if isinstance(v, dict) else {"_raw_arguments": arguments}


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts, from the rare engine that answers with them
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def to_message(obj: dict[str, Any], stops: tuple[str, ...]) -> dict[str, Any]:
    """An OpenAI chat completion (as the gateway answers it) as an Anthropic message."""
    choices = obj.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    choice: dict[str, Any] = first if isinstance(first, dict) else {}
    msg = choice.get("message")
    msg = msg if isinstance(msg, dict) else {}
    content: list[dict[str, Any]] = []
    for key in REASONING_KEYS:
        r = msg.get(key)
        if isinstance(r, str) and r:
            content.append({"type": "thinking", "thinking": r, "signature": ""})
            break
    text = _text_of(msg.get("content"))
    if text:
        content.append({"type": "text", "text": text})
    calls = msg.get("tool_calls")
    n_tools = 0
    if isinstance(calls, list):
        for tc in calls:
            if not isinstance(tc, dict):
                continue
            fn = tc.get("function")
            fn = fn if isinstance(fn, dict) else {}
            tid = tc.get("id")
            content.append(
                {
                    "type": "tool_use",
                    "id": tid if isinstance(tid, str) and tid else "toolu_" + os.urandom(12).hex(),
                    "name": str(fn.get("name") or ""),
                    "input": tool_input(fn.get("arguments")),
                }
            )
            n_tools += 1
    reason, seq = stop_reason(choice.get("finish_reason"), n_tools > 0, matched_stop(choice), stops)
    return {
        "id": message_id(obj.get("id")),
        "type": "message",
        "role": "assistant",
        "model": obj.get("model"),
        "content": content,
        "stop_reason": reason,
        "stop_sequence": seq,
        "usage": usage(obj.get("usage")),
    }


def message_bytes(data: bytes, stops: tuple[str, ...]) -> bytes:
    """The gateway's whole OpenAI chat answer (bytes) as the Anthropic message (bytes)."""
    obj = orjson.loads(data)
    return orjson.dumps(to_message(obj if isinstance(obj, dict) else {}, stops))
