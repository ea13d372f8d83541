"""An Anthropic Messages request (`POST /v1/messages`, `/v1/messages/count_tokens`) as an OpenAI chat body.

What maps, field by field:
- `system` (a string or text blocks) -> a first `system` message (blocks joined by a blank line), and
  a `system` message between the turns -> a `system` message there;
- `messages`: text -> text, `image` (base64 or url source) -> `image_url` parts (base64 as a data
  URL), `document` with a text source (plain text, or text blocks) -> text (its title first); an
  assistant's `tool_use` blocks -> its `tool_calls` (`input` as JSON arguments); a user's
  `tool_result` blocks -> `tool` messages placed before the rest of that user turn (text content;
  `is_error` prefixes "Error: "; images in a result follow in a user message); `thinking` /
  `redacted_thinking` blocks of earlier turns are dropped, as Anthropic itself drops them from the
  context; `cache_control` and `citations` are ignored;
- `tools` (name, description, input_schema, strict) -> function tools; `tool_choice` auto / any /
  tool / none -> "auto" / "required" / the named function / "none"; `disable_parallel_tool_use`
  -> `parallel_tool_calls: false`;
- `max_tokens` (required: a missing one is a 400, as Anthropic answers), `stop_sequences` -> `stop`,
  `temperature` (0..1), `top_p` (0..1), `top_k`, `metadata.user_id` -> `user`, `stream` (the gateway
  then asks for the usage chunk, which the stream translation turns into Anthropic's usage);
- `thinking` {type: enabled, budget_tokens} (or `adaptive`) -> `chat_template_kwargs.enable_thinking`
  true ({type: disabled} -> false): engines whose chat template reasons do, and their reasoning
  output comes back as thinking blocks; `budget_tokens` must be >= 1024, as Anthropic has it, but is
  not enforced (engines have no such budget);
- `output_config.format` (json_schema) -> `response_format` json_schema; `output_config.effort` is a
  hint and is ignored, as are `service_tier`, `speed`, `inference_geo`, `diagnostics`, the account
  fields `user_profile_id` / `workspace_id`, a top-level `cache_control`, `thinking.display`, and the
  tool hints (`cache_control`, `eager_input_streaming`, `defer_loading`, `allowed_callers`,
  `input_examples`); `context_management` whose edits only clear thinking (see anthropic_options), and a
  system block that is Claude Code's billing attribution (`x-anthropic-billing-header: ...`) is dropped.

A tool list byte for byte the same as one of the last 8 (an agent's, on every turn) is not translated again:
its chat tools, and their JSON, are kept (`chat_tools`).

An explicit null is taken as an absent optional field. Anthropic rejects top-level fields it does not
know ("x: Extra inputs are not permitted"); so does this (and in tools, tool_choice, thinking,
metadata, output_config; content blocks may carry extra keys, such as `citations`). Fields
Anthropic knows that the gateway cannot honour (`container`, `mcp_servers`, other context edits,
server tools such as web search, PDF documents, file sources) are a clear 400, never dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_gateway.dialects.anthropic.blocks import Seen, messages, system_text
from llm_gateway.dialects.anthropic.options import context_management, output_config, thinking, tool, tool_choice
from llm_gateway.dialects.field_checks import (
    Hint,
    as_bool,
    as_int,
    as_list,
    as_number,
    as_obj,
    as_str,
    bad,
    check_hint,
    only_fields,
)
from llm_gateway.dialects.history import encoded_messages
from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.gathered import Gathered
from llm_gateway.wire import body_json
from llm_gateway.wire.client_body import EncodedList, encoded_list
from llm_gateway.wire.recent import Recent, Same

#: Messages fields the translation reads
_MESSAGES_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "metadata",
        "tools",
        "tool_choice",
        "thinking",
        "output_config",
    }
)
#: what count_tokens checks as a message does but does not use (the sampling fields cannot change a count)
_SAMPLING_KEYS = ("max_tokens", "stream", "stream_options", "stop", "temperature", "top_p", "top_k", "user")
#: hints and account attribution with no effect on what the answer means: checked for their type
#: (as Anthropic does), then ignored. A JSON type name, or the values allowed; null is always allowed.
HINTS: dict[str, Hint] = {
    "service_tier": ("auto", "standard_only"),
    "speed": ("standard", "fast"),
    "inference_geo": "string",
    "cache_control": "object",
    "diagnostics": "object",
    "user_profile_id": "string",
    "workspace_id": "string",
}
#: the system block Claude Code starts with (`cc_version=...; cc_entrypoint=...`): Anthropic's billing
#: attribution, dropped so that it never reaches an engine's prompt (nor defeats its prefix cache)
#: Anthropic features the gateway cannot provide: refused with a reason
_UNSUPPORTED = {
    "container": "code-execution containers are Anthropic's own servers",
    "mcp_servers": "the MCP connector needs Anthropic's servers; run MCP tools on the client instead",
}


@dataclass(frozen=True, slots=True)
class MessagesRequest:
    """The OpenAI chat body for one Anthropic request, and what translating its answer needs."""

    body: dict[str, Any]
    stream: bool
    stop_sequences: tuple[str, ...]
    #: input tokens by the characters/4 rule, for `message_start` before the engine's own count
    prompt_estimate: int
    #: what read_request sizes of the body's messages, gathered as they were built (`read_request(gathered=)`)
    gathered: Gathered | None = None


def to_chat(req: dict[str, Any], *, count_only: bool = False, raw: bytes | None = None) -> MessagesRequest:
    """The OpenAI chat body for an Anthropic Messages request (`count_only`: a count_tokens request; `raw`: the
    bytes `req` was parsed from, where the handler has them, in which its tools are looked for: `chat_tools`).
    Raises InvalidRequest as Anthropic would (a missing `max_tokens`, an unknown field, a bad block)."""
    for k, v in req.items():
        if k in _MESSAGES_FIELDS:
            continue
        if k in HINTS:
            check_hint(v, k, HINTS[k])
            continue
        if k == "context_management":
            if v is not None:
                context_management(v)
            continue
        if k in _UNSUPPORTED:
            raise InvalidRequest(
                f"{k}: not supported by this gateway ({_UNSUPPORTED[k]})", param=k, code="unsupported_parameter"
            )
        raise bad("Extra inputs are not permitted", k)
    model = req.get("model")
    if model is None:
        raise bad("Field required", "model")
    if not isinstance(model, str) or not model:
        raise bad("String should have at least 1 character", "model")
    if "messages" not in req:
        raise bad("Field required", "messages")
    seen = Seen()
    chat: list[dict[str, Any]] = []
    if req.get("system") is not None:
        chat.append({"role": "system", "content": system_text(req["system"], seen)})
        seen.gathered.texts.append(chat[0]["content"])
    given = as_list(req["messages"], "messages")
    if not given:
        raise bad("at least one message is required", "messages")
    marks = messages(given, chat, seen)
    seen.chars += 16 * len(given)  # each message's overhead
    # a kept history's JSON is not made again (dialects/history.py)
    body: dict[str, Any] = {"model": model, "messages": encoded_messages(chat, marks)}
    if req.get("max_tokens") is None and not count_only:
        raise bad("Field required", "max_tokens")
    stream, stops = _sampling(req, body)
    if req.get("tools") is not None:
        encoded = chat_tools(as_list(req["tools"], "tools"), raw)
        if encoded:
            # their JSON bytes in the estimate, as read_request counts a chat body's tools, and in the engine's
            # body (wire/client_body.py): one encoding for all three
            body["tools"] = encoded
            seen.gathered.tools_json = encoded.json
            seen.chars += len(encoded.json)
    if req.get("tool_choice") is not None:
        tool_choice(req["tool_choice"], body)
    if req.get("thinking") is not None:
        thinking(req["thinking"], body)
    if req.get("output_config") is not None:
        output_config(req["output_config"], body)
    if count_only:
        for k in _SAMPLING_KEYS:
            body.pop(k, None)
        stream, stops = False, ()
    return MessagesRequest(body, stream, stops, seen.chars // 4 + 1, seen.gathered)


#: the chat tools of the last few distinct tool lists, by the JSON of the client's (an agent sends the same
#: 20-odd tools on every turn: translating them again cost more than encoding them as the key)
RECENT_TOOLS = 8
_RECENT_TOOLS: Recent[EncodedList] = Recent(RECENT_TOOLS)
#: the same, by the identity of the parsed list (body_json's kept lists): found without looking for their bytes
_SAME_TOOLS: Same[EncodedList] = Same(RECENT_TOOLS)


def chat_tools(tools: list[Any], raw: bytes | None = None) -> EncodedList:
    """The chat function tools for Anthropic `tools`, with their JSON: kept for a list whose JSON is byte for byte
    one of the last `RECENT_TOOLS`, found without encoding them (`body_json.translated_tools`: by the list's
    identity, or in `raw`, the request's bytes)."""
    return body_json.translated_tools(
        tools, raw, _RECENT_TOOLS, _SAME_TOOLS, lambda: encoded_list([tool(t, j) for j, t in enumerate(tools)])
    )


def _sampling(req: dict[str, Any], body: dict[str, Any]) -> tuple[bool, tuple[str, ...]]:
    """max_tokens, stream, stop_sequences, temperature, top_p, top_k, metadata into `body`."""
    if req.get("max_tokens") is not None:
        body["max_tokens"] = as_int(req["max_tokens"], "max_tokens", 1)
    stream = False
    if req.get("stream") is not None:
        stream = as_bool(req["stream"], "stream")
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}  # the usage chunk becomes Anthropic's usage
    stops: tuple[str, ...] = ()
    if req.get("stop_sequences") is not None:
        seqs = as_list(req["stop_sequences"], "stop_sequences")
        stops = tuple(as_str(v, f"stop_sequences.{j}") for j, v in enumerate(seqs))
        if stops:
            body["stop"] = list(stops)
    if req.get("temperature") is not None:
        body["temperature"] = as_number(req["temperature"], "temperature", 0.0, 1.0)
    if req.get("top_p") is not None:
        body["top_p"] = as_number(req["top_p"], "top_p", 0.0, 1.0)
    if req.get("top_k") is not None:
        body["top_k"] = as_int(req["top_k"], "top_k", 0)
    if req.get("metadata") is not None:
        meta = as_obj(req["metadata"], "metadata")
        only_fields(meta, frozenset({"user_id"}), "metadata")
        user = meta.get("user_id")
        if user is not None:
            body["user"] = as_str(user, "metadata.user_id")
    return stream, stops


# -- system and messages -------------------------------------------------------------------------------
