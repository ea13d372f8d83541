"""OpenAI answers in Anthropic's shapes: a whole chat completion -> a message.

A message: `id` "msg_" + the engine's completion id, `type` message, `role` assistant, `model` (the
public model, as the chat answer has it), `content` blocks in Anthropic's order (thinking from the
engine's reasoning field, text, then tool_use with `input` parsed from the arguments JSON),
`stop_reason` (finish `length` -> max_tokens; tool calls -> tool_use; `stop` -> stop_sequence when
the engine says which of the client's stop sequences matched (vLLM `stop_reason`, SGLang
`matched_stop`), else end_turn; `content_filter` -> refusal), `stop_sequence`, and `usage`
(input_tokens without the engine's cached prompt tokens, which are cache_read_input_tokens, as
Anthropic counts them).

The message id, the usage object and the error envelope (rendered by the app for errors before the
answer: `routes.py`) are Anthropic's wire facts, shared with the native pass-through: wire/anthropic.py.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.wire.anthropic import anthropic_usage, message_id, tool_use_id

REASONING_KEYS = ("reasoning_content", "reasoning")  # the gateway's configured name is one of these


# -- whole answers ---------------------------------------------------------------------------------------


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
                    "id": tid if isinstance(tid, str) and tid else tool_use_id(),
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
        "usage": anthropic_usage(obj.get("usage")),
    }


def message_bytes(data: bytes, stops: tuple[str, ...]) -> bytes:
    """The gateway's whole OpenAI chat answer (bytes) as the Anthropic message (bytes)."""
    obj = orjson.loads(data)
    return orjson.dumps(to_message(obj if isinstance(obj, dict) else {}, stops))
