"""OpenAI request bodies translated into Ollama's native ones (`/api/chat`, `/api/generate`,
`/api/embed`): sampling fields and extras into `options` (`max_tokens` -> `num_predict`,
`repetition_penalty` -> `repeat_penalty`, `stop`, and a native `options` object merged last),
`response_format` into `format`, `reasoning_effort` into `think`, `logprobs`/`top_logprobs` as they are
(a completions' integer `logprobs` as both), content parts and data-URL images into `content` + `images`,
assistant tool calls and tool results into Ollama's shapes. Native fields (`keep_alive`, `think`,
`truncate`, `format`, `tools`, ...) and unknown ones pass through untouched.

No OpenAI field is dropped silently: `CHAT_FIELDS` and `COMPLETIONS_FIELDS` say what becomes of each
field of OpenAI's request (the openai SDK's `CompletionCreateParams`; tests/unit/test_ollama_truth.py
holds the tables to the SDK's list). What Ollama cannot do (`n` > 1, `logit_bias`, a forced tool choice,
`parallel_tool_calls: false`, audio, remote image URLs, token-id prompts, `echo`, `suffix`, logprobs on
an Ollama before 0.12.11) is refused with a 400 `unsupported_parameter` naming the field.

`truncate: false` is always sent (unless the client set `truncate` itself): from Ollama 0.12.6 on a
prompt longer than the context window is then an error instead of being cut (ollama/ollama
`api/types.go` `ChatRequest.Truncate`, added by 6544e1473, in v0.12.6 1813ff85a027d7d4d76761a2bf12c2198dfaa0cf);
older versions ignore the unknown field (Go's decoder) and truncate, which `PromptFacts` (ollama_prompt.py) lets the
adapter detect afterwards.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.adapters.field_table import GATEWAY, HINT, REFUSED, TRANSLATED
from llm_gateway.adapters.field_table import unsupported as field_unsupported
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

#: Every field of OpenAI's chat request and what the Ollama adapter does with it: TRANSLATED into
#: Ollama's request (the values Ollama cannot honour refused with a 400 naming the field), GATEWAY (the
#: gateway itself acts on it), HINT (does not change the answer: accepted, not sent), REFUSED (any value
#: but its default is a 400 naming the field).
CHAT_FIELDS: dict[str, tuple[str, str]] = {
    "model": (GATEWAY, "the deployment's upstream model name"),
    "messages": (TRANSLATED, "messages: text, data-URL images, tool calls and results"),
    "stream": (TRANSLATED, "stream"),
    "stream_options": (GATEWAY, "include_usage: the usage chunk, from Ollama's counts"),
    "max_tokens": (TRANSLATED, "options.num_predict"),
    "max_completion_tokens": (TRANSLATED, "options.num_predict (wins over max_tokens)"),
    "temperature": (TRANSLATED, "options.temperature"),
    "top_p": (TRANSLATED, "options.top_p"),
    "seed": (TRANSLATED, "options.seed"),
    "presence_penalty": (TRANSLATED, "options.presence_penalty"),
    "frequency_penalty": (TRANSLATED, "options.frequency_penalty"),
    "stop": (TRANSLATED, "options.stop, always a list"),
    "response_format": (TRANSLATED, "format: json_object -> 'json', json_schema -> the schema; other types refused"),
    "reasoning_effort": (TRANSLATED, "think"),
    "tools": (TRANSLATED, "tools (function tools; other tool types refused)"),
    "tool_choice": (TRANSLATED, "auto: Ollama's behaviour; none: no tools sent; required or a named function refused"),
    "parallel_tool_calls": (TRANSLATED, "true: Ollama's behaviour; false refused (Ollama cannot limit the calls)"),
    "n": (TRANSLATED, "1: Ollama's behaviour; more refused"),
    "logprobs": (TRANSLATED, "logprobs (Ollama >= 0.12.11; refused by older versions)"),
    "top_logprobs": (TRANSLATED, "top_logprobs (with logprobs: true)"),
    "modalities": (TRANSLATED, "['text']: Ollama's behaviour; audio refused"),
    "verbosity": (TRANSLATED, "medium (OpenAI's default): Ollama's behaviour; low and high refused"),
    "logit_bias": (REFUSED, "Ollama has no logit bias (an empty map is accepted)"),
    "functions": (REFUSED, "OpenAI's deprecated function calling: send tools"),
    "function_call": (REFUSED, "OpenAI's deprecated function calling: send tool_choice ('auto' is accepted)"),
    "audio": (REFUSED, "Ollama generates no audio"),
    "web_search_options": (REFUSED, "Ollama has no web search"),
    "moderation": (REFUSED, "the gateway runs no moderation"),
    "user": (HINT, "an end-user id for OpenAI's abuse monitoring"),
    "safety_identifier": (HINT, "an end-user id for OpenAI's abuse monitoring"),
    "metadata": (HINT, "tags for OpenAI's stored completions"),
    "store": (HINT, "OpenAI's storage for distillation and evals"),
    "service_tier": (HINT, "OpenAI's processing tier"),
    "prompt_cache_key": (HINT, "OpenAI's prompt-cache routing (Ollama caches prefixes itself)"),
    "prompt_cache_retention": (HINT, "OpenAI's prompt-cache lifetime"),
    "prompt_cache_options": (HINT, "OpenAI's prompt-cache breakpoints"),
    "prediction": (HINT, "Predicted Outputs: a latency optimisation, the answer is the same"),
}
#: The same for OpenAI's (legacy) completions request, sent to /api/generate.
COMPLETIONS_FIELDS: dict[str, tuple[str, str]] = {
    **{k: CHAT_FIELDS[k] for k in ("model", "stream", "stream_options", "max_tokens", "temperature", "top_p")},
    **{k: CHAT_FIELDS[k] for k in ("seed", "presence_penalty", "frequency_penalty", "stop", "n", "logit_bias")},
    "user": CHAT_FIELDS["user"],
    "prompt": (TRANSLATED, "prompt, one string, in raw mode (no chat template)"),
    "logprobs": (TRANSLATED, "logprobs: true and top_logprobs: N (Ollama >= 0.12.11; refused by older versions)"),
    "echo": (TRANSLATED, "false: Ollama's behaviour; true refused (Ollama does not return the prompt)"),
    "best_of": (TRANSLATED, "1: Ollama's behaviour; more refused"),
    "suffix": (REFUSED, "raw mode applies no template, so no fill-in-the-middle (an empty suffix is accepted)"),
}
# fields not forwarded as they are (translated here, or acted on by the gateway, or hints)
_NOT_SENT = frozenset(k for t in (CHAT_FIELDS, COMPLETIONS_FIELDS) for k, (how, _) in t.items() if how != TRANSLATED)
_CONSUMED = _NOT_SENT | {
    "messages",
    "prompt",
    "input",
    "stream",
    "options",
    "stop",
    "response_format",
    "reasoning_effort",
    "n",
    "tool_choice",
    "parallel_tool_calls",
    "logprobs",
    "top_logprobs",
    "modalities",
    "verbosity",
    "echo",
    "best_of",
    "encoding_format",
}
#: a field's value that asks nothing of the engine: accepted whatever the field
_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "logit_bias": (None, {}),
    "function_call": (None, "auto", "none"),
    "suffix": (None, ""),
    "functions": (None, []),
}
_THINK = {
    "none": False,
    "minimal": "low",
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "max",
}


def unsupported(field: str, why: str) -> InvalidRequest:
    """The 400 for a field (or a value of it) that the Ollama backend cannot honour."""
    return field_unsupported(field, "Ollama", why)


def native_body(
    endpoint: Endpoint, body: dict[str, Any], upstream_model: str, stream: bool, logprobs: bool | None = None
) -> dict[str, Any]:
    """The Ollama request for an OpenAI `body` on `endpoint`; raises InvalidRequest for what Ollama cannot do.
    `logprobs`: whether this Ollama returns logprobs (None: not known yet, so they are asked for)."""
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
    _refusals(endpoint, body)
    native_options = body.get("options")
    if isinstance(native_options, dict):
        options.update(native_options)
    if options:
        out["options"] = options
    _format(body, out)
    _logprobs(endpoint, body, out, logprobs)
    effort = body.get("reasoning_effort")
    if isinstance(effort, str) and "think" not in out:
        if effort not in _THINK:
            raise InvalidRequest(
                f"reasoning_effort {effort!r} is not one of {sorted(_THINK)}", param="reasoning_effort"
            )
        out["think"] = _THINK[effort]
    if out.get("truncate") is None:  # an error, not a cut prompt (Ollama >= 0.12.6; older ones ignore it)
        out["truncate"] = False
    if endpoint == "chat":
        out["messages"] = _messages(body.get("messages"))
        _tools(body, out)
    elif endpoint == "completions":
        out["prompt"] = _prompt(body.get("prompt"))
        out.setdefault("raw", True)  # OpenAI completions take the prompt as it is
    else:
        out.pop("stream", None)
        out["input"] = _embed_input(body.get("input"))
    return out


def _refusals(endpoint: Endpoint, body: dict[str, Any]) -> None:
    """400 for every field (or value) of `body` that Ollama cannot honour (see `CHAT_FIELDS`)."""
    table = CHAT_FIELDS if endpoint == "chat" else COMPLETIONS_FIELDS if endpoint == "completions" else {}
    for k, (how, why) in table.items():
        if how == REFUSED and body.get(k) not in _DEFAULTS.get(k, (None,)):
            raise unsupported(k, why)
    n = body.get("n")
    if n not in (None, 1):
        raise unsupported("n", "n > 1 (Ollama generates one choice per request)")
    if endpoint == "completions":
        if body.get("echo") not in (None, False):
            raise unsupported("echo", "Ollama does not return the prompt with the completion")
        if body.get("best_of") not in (None, 1):
            raise unsupported("best_of", "best_of > 1 (Ollama generates one completion per request)")
        return
    if endpoint != "chat":
        return
    if body.get("parallel_tool_calls") is False:
        raise unsupported("parallel_tool_calls", "false (Ollama cannot limit an answer to one tool call)")
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise unsupported("modalities", "Ollama answers text only")
    if body.get("verbosity") not in (None, "medium"):
        raise unsupported("verbosity", "Ollama has no verbosity control (only 'medium', the default)")


def _tools(body: dict[str, Any], out: dict[str, Any]) -> None:
    """`tools` (function tools only) and `tool_choice` (auto or none: Ollama cannot force a call)."""
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, t in enumerate(tools):
            if not isinstance(t, dict) or t.get("type", "function") != "function":
                kind = t.get("type") if isinstance(t, dict) else type(t).__name__
                raise unsupported("tools", f"tools[{i}] is of type {kind!r}; Ollama calls function tools only")
    choice = body.get("tool_choice")
    if choice in (None, "auto"):
        return
    if choice == "none":
        out.pop("tools", None)  # the model cannot call what it is not shown
        return
    what = "required" if choice == "required" else "a named function" if isinstance(choice, dict) else repr(choice)
    raise unsupported("tool_choice", f"{what} (Ollama cannot force a tool call; 'auto' and 'none' are accepted)")


def _logprobs(endpoint: Endpoint, body: dict[str, Any], out: dict[str, Any], supported: bool | None) -> None:
    """OpenAI's logprobs as Ollama's `logprobs` + `top_logprobs` (ollama/ollama api/types.go ChatRequest and
    GenerateRequest, added by 59241c5be, v0.12.11 c1149875234a51aa1e5e60b74f3807f5982c60fa)."""
    lp, top = body.get("logprobs"), body.get("top_logprobs")
    if endpoint == "completions":
        if lp is None or lp is False:
            return
        if isinstance(lp, bool) or not isinstance(lp, int) or lp < 0:
            raise InvalidRequest("'logprobs' must be a non-negative integer", param="logprobs")
        asked, top = True, lp
    elif endpoint == "chat":
        if lp not in (None, False, True):
            raise InvalidRequest("'logprobs' must be a boolean", param="logprobs")
        asked = lp is True
        if top is not None and not asked:
            raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
    else:
        return
    if not asked:
        return
    if supported is False:
        raise unsupported("logprobs", "this Ollama version returns no log probabilities (they came in 0.12.11)")
    out["logprobs"] = True
    if top:
        out["top_logprobs"] = top


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
        raise InvalidRequest(
            f"response_format type {t!r} is not supported by Ollama (it takes json_object and json_schema)",
            param="response_format",
            code="unsupported_parameter",
        )


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
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidRequest("the Ollama backend takes one string prompt per request", param="prompt")
    if not prompt:  # ollama/ollama server/routes.go GenerateHandler: an empty prompt only loads the model
        raise unsupported("prompt", "an empty prompt (Ollama reads it as a request to load the model)")
    return prompt


def _embed_input(value: Any) -> str | list[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise InvalidRequest("the Ollama backend embeds strings or arrays of strings, not token ids", param="input")
