"""OpenAI chat answers in the Responses API's shapes: the Response object and its output items.

A Response: `id` "resp_...", `object` response, `created_at`, `status` (completed; incomplete with
`incomplete_details.reason` max_output_tokens when the engine stopped at the token limit, or
content_filter, and then the item it cut is `incomplete` too, as OpenAI's are; failed with `error` when a
stream broke), `model` (the public model), `output`
items in the engine's order of meaning: a `reasoning` item (the engine's reasoning text as a
`reasoning_text` content part), a `message` (`output_text` with its logprobs where the engine sent
them, or a `refusal`), then one `function_call` per tool call (`call_id` the engine's tool call
id); `usage` (input/output tokens, cached and reasoning details), and the request's fields echoed
(`ResponsesRequest.echo`). The same item builders serve the stream translation, so a streamed
response's final object equals the whole one.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from llm_gateway.dialects.responses.items import new_id
from llm_gateway.dialects.responses.request import ResponsesRequest

REASONING_KEYS = ("reasoning_content", "reasoning")  # the gateway's configured name is one of these


def skeleton(req: ResponsesRequest, response_id: str, model: str | None = None) -> dict[str, Any]:
    """A Response object in progress: no output yet."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "model": model or req.model,
        "output": [],
        "previous_response_id": req.previous_response_id,
        "service_tier": "default",
        "usage": None,
        **req.echo,
    }


def usage(u: Any) -> dict[str, Any] | None:
    """Responses usage for an OpenAI chat usage object (None when the engine sent none)."""
    if not isinstance(u, dict):
        return None
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    prompt = p if isinstance(p, int) else 0
    completion = c if isinstance(c, int) else 0
    cached = reasoning = 0
    pd, cd = u.get("prompt_tokens_details"), u.get("completion_tokens_details")
    if isinstance(pd, dict) and isinstance(pd.get("cached_tokens"), int):
        cached = pd["cached_tokens"]
    if isinstance(cd, dict) and isinstance(cd.get("reasoning_tokens"), int):
        reasoning = cd["reasoning_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def status_of(finish: Any) -> tuple[str, dict[str, str] | None]:
    """(status, incomplete_details) for an OpenAI finish reason."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    if finish == "content_filter":
        return "incomplete", {"reason": "content_filter"}
    return "completed", None


def reasoning_item(text: str, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "id": item_id or new_id("rs_"),
        "type": "reasoning",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
        "status": status,
    }


def text_part(text: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}


def message_item(parts: list[dict[str, Any]], item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {"id": item_id or new_id("msg_"), "type": "message", "status": status, "role": "assistant", "content": parts}


def call_item(
    call_id: str, name: str, arguments: str, item_id: str | None = None, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": item_id or new_id("fc_"),
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def token_logprobs(content: Any) -> list[dict[str, Any]]:
    """Chat token logprobs (`logprobs.content`) in the Responses shape: the same fields, bytes never null."""
    if not isinstance(content, list):
        return []
    out = []
    for t in content:
        if isinstance(t, dict):
            tops = t.get("top_logprobs")
            out.append(
                {
                    "token": t.get("token", ""),
                    "logprob": t.get("logprob", 0.0),
                    "bytes": t.get("bytes") or [],
                    "top_logprobs": [
                        {"token": x.get("token", ""), "logprob": x.get("logprob", 0.0), "bytes": x.get("bytes") or []}
                        for x in (tops if isinstance(tops, list) else [])
                        if isinstance(x, dict)
                    ],
                }
            )
    return out


def logprobs_of(choice: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat choice's token logprobs in the Responses shape ([] where the engine sent none)."""
    lp = choice.get("logprobs")
    return token_logprobs(lp.get("content") if isinstance(lp, dict) else None)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def to_response(obj: dict[str, Any], req: ResponsesRequest, response_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A whole chat completion (as the gateway answers it) as a Response object, and the assistant's
    chat message (for the stored conversation)."""
    resp = skeleton(req, response_id, obj.get("model") if isinstance(obj.get("model"), str) else None)
    choices = obj.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    choice: dict[str, Any] = first if isinstance(first, dict) else {}
    msg = choice.get("message")
    msg = msg if isinstance(msg, dict) else {}
    output: list[dict[str, Any]] = []
    turn: dict[str, Any] = {"role": "assistant", "content": None}
    for key in REASONING_KEYS:
        r = msg.get(key)
        if isinstance(r, str) and r:
            output.append(reasoning_item(r))
            turn["reasoning_content"] = r
            break
    text = _text_of(msg.get("content"))
    refusal = msg.get("refusal")
    calls = msg.get("tool_calls")
    calls = [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []
    if isinstance(refusal, str) and refusal:
        output.append(message_item([{"type": "refusal", "refusal": refusal}]))
    elif text or not calls:
        output.append(message_item([text_part(text, logprobs_of(choice))]))
        turn["content"] = text
    tool_calls = []
    for tc in calls:
        fn = tc.get("function")
        fn = fn if isinstance(fn, dict) else {}
        cid = tc.get("id")
        cid = cid if isinstance(cid, str) and cid else new_id("call_")
        name, args = str(fn.get("name") or ""), fn.get("arguments")
        args = args if isinstance(args, str) else orjson.dumps(args or {}).decode()
        output.append(call_item(cid, name, args))
        tool_calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
    if tool_calls:
        turn["tool_calls"] = tool_calls
    resp["status"], resp["incomplete_details"] = status_of(choice.get("finish_reason"))
    if resp["status"] == "incomplete" and output:
        output[-1]["status"] = "incomplete"  # the item the limit cut (openai-python: its `status`)
    resp["output"] = output
    resp["usage"] = usage(obj.get("usage"))
    return resp, turn
