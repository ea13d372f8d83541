"""OpenAI request bodies translated into Ollama's native ones (`/api/chat`, `/api/generate`,
`/api/embed`): sampling fields and extras into `options` (`max_tokens` -> `num_predict`,
`repetition_penalty` -> `repeat_penalty`, `stop`, and a native `options` object merged last),
`response_format` into `format`, `reasoning_effort` into `think`, content parts and data-URL images
into `content` + `images`, assistant tool calls and tool results into Ollama's shapes. Native fields
(`keep_alive`, `think`, `truncate`, `format`, `tools`, ...) and unknown ones pass through untouched;
what Ollama cannot do (`n` > 1, remote image URLs, token-id prompts) is refused with a 400.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.errors import InvalidRequest
from llm_gateway.types import Endpoint

_OPTIONS = frozenset(
    {
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "typical_p",
        "seed",
        "repeat_last_n",
        "repeat_penalty",
        "presence_penalty",
        "frequency_penalty",
        "num_ctx",
        "num_keep",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "use_mmap",
        "num_thread",
        "num_predict",
        "penalize_newline",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
    }
)
_RENAMED = {"max_tokens": "num_predict", "max_completion_tokens": "num_predict", "repetition_penalty": "repeat_penalty"}
# OpenAI fields with no meaning for Ollama (or translated separately): never forwarded as they are
_CONSUMED = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "input",
        "stream",
        "stream_options",
        "options",
        "stop",
        "response_format",
        "reasoning_effort",
        "n",
        "user",
        "tool_choice",
        "parallel_tool_calls",
        "logit_bias",
        "service_tier",
        "store",
        "metadata",
        "encoding_format",
        "echo",
        "best_of",
    }
)
_THINK = {
    "none": False,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "max",
}


def native_body(endpoint: Endpoint, body: dict[str, Any], upstream_model: str, stream: bool) -> dict[str, Any]:
    """The Ollama request for an OpenAI `body` on `endpoint`; raises InvalidRequest for what Ollama cannot do."""
    out: dict[str, Any] = {"model": upstream_model, "stream": stream}
    options: dict[str, Any] = {}
    for k, v in body.items():
        if k in _RENAMED:
            if v is not None:
                options[_RENAMED[k]] = v
        elif k in _OPTIONS:
            if v is not None:
                options[k] = v
        elif k not in _CONSUMED:
            out[k] = v  # native fields (keep_alive, think, ...) and unknown fields pass through
    if body.get("max_completion_tokens") is not None:  # OpenAI's current name wins over max_tokens
        options["num_predict"] = body["max_completion_tokens"]
    stop = body.get("stop")
    if stop is not None:
        options["stop"] = [stop] if isinstance(stop, str) else stop
    n = body.get("n")
    if n not in (None, 1):
        raise InvalidRequest("n > 1 is not supported by the Ollama backend serving this model", param="n")
    native_options = body.get("options")
    if isinstance(native_options, dict):
        options.update(native_options)
    if options:
        out["options"] = options
    _format(body, out)
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and "think" not in out:
        if effort not in _THINK:
            raise InvalidRequest(
                f"reasoning_effort {effort!r} is not one of {sorted(_THINK)}", param="reasoning_effort"
            )
        out["think"] = _THINK[effort]
    if endpoint == "chat":
        out["messages"] = _messages(body.get("messages"))
    elif endpoint == "completions":
        out["prompt"] = _prompt(body.get("prompt"))
        out.setdefault("raw", True)  # OpenAI completions take the prompt as it is
    else:
        out.pop("stream", None)
        out["input"] = _embed_input(body.get("input"))
    return out


def _format(body: dict[str, Any], out: dict[str, Any]) -> None:
    rf = body.get("response_format")
    if not isinstance(rf, dict) or "format" in out:
        return
    t = rf.get("type")
    if t == "json_object":
        out["format"] = "json"
    elif t == "json_schema":
        schema = (rf.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest("response_format.json_schema.schema must be an object", param="response_format")
        out["format"] = schema
    elif t not in (None, "text"):
        raise InvalidRequest(f"response_format type {t!r} is not supported by Ollama", param="response_format")


def _messages(msgs: Any) -> list[dict[str, Any]]:
    if not isinstance(msgs, list):
        raise InvalidRequest("'messages' must be an array", param="messages")
    out: list[dict[str, Any]] = []
    names: dict[str, Any] = {}
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        text, images = _content(m.get("content"), i)
        om: dict[str, Any] = {"role": role, "content": text}
        if images:
            om["images"] = images
        if role == "assistant":
            calls = []
            for tc in m.get("tool_calls") or []:
                fn = (tc or {}).get("function") or {}
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        args = orjson.loads(args) if args else {}
                    except orjson.JSONDecodeError:
                        raise InvalidRequest(
                            f"messages[{i}].tool_calls: arguments are not JSON", param="messages"
                        ) from None
                calls.append({"function": {"name": fn.get("name"), "arguments": args}})
                if tc.get("id"):
                    names[tc["id"]] = fn.get("name")
            if calls:
                om["tool_calls"] = calls
            thinking = m.get("reasoning_content") or m.get("reasoning")
            if thinking:
                om["thinking"] = thinking
        elif role == "tool":
            name = names.get(str(m.get("tool_call_id", ""))) or m.get("name")
            if name:
                om["tool_name"] = name
        out.append(om)
    return out


def _content(content: Any, i: int) -> tuple[str, list[str]]:
    if content is None or isinstance(content, str):
        return content or "", []
    if not isinstance(content, list):
        raise InvalidRequest(f"messages[{i}].content must be a string or an array of parts", param="messages")
    texts: list[str] = []
    images: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        if part.get("type") == "text":
            texts.append(str(part.get("text", "")))
        elif part.get("type") == "image_url":
            url = (part.get("image_url") or {}).get("url", "")
            if not isinstance(url, str) or not url.startswith("data:") or "," not in url:
                raise InvalidRequest("the Ollama backend needs images inline as data: URLs", param="messages")
            images.append(url.split(",", 1)[1])
    return "\n".join(texts), images


def _prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    raise InvalidRequest("the Ollama backend takes one string prompt per request", param="prompt")


def _embed_input(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise InvalidRequest("the Ollama backend embeds strings or arrays of strings, not token ids", param="input")
