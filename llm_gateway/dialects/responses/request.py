"""An OpenAI Responses request (`POST /v1/responses`) as an OpenAI chat body, and what its answer echoes.

What maps, field by field:
- `instructions` -> a first `system` message (not carried over from a previous response, as OpenAI
  has it); `input` (read in responses_items.py) as a string -> one user message; as items: messages
  (`role` user / assistant / system / developer -> system; content a string or parts: `input_text` /
  `output_text` -> text, `refusal` -> text, `input_image` with an `image_url` -> an `image_url` part with its `detail`),
  `function_call` items -> the assistant's `tool_calls` (merged into the assistant message just
  before them), `function_call_output` -> `tool` messages (text; images in an output follow in a
  user message), `reasoning` items -> the reasoning text of the next assistant message
  (`reasoning_content`, so engines whose chat template replays reasoning get it back: a
  translation that drops it breaks thinking models, maximhq/bifrost#2446);
- `previous_response_id`: the stored conversation of that response goes before this input (the
  handler loads it; `ResponsesRequest.chat_body` joins them);
- `tools` (function tools, responses/tools.py) -> chat function tools; `tool_choice` auto / none / required / a named
  function; `parallel_tool_calls`;
- `max_output_tokens` -> `max_tokens`, `temperature`, `top_p`, `top_logprobs` (and `include`
  `message.output_text.logprobs`) -> `logprobs`/`top_logprobs`, `user` (or `safety_identifier`)
  -> `user`, `text.format` json_schema / json_object -> `response_format`, `reasoning.effort` ->
  `reasoning_effort` (`none` -> `chat_template_kwargs.enable_thinking: false`), `stream` (the
  gateway then asks for the usage chunk, which becomes the response's usage);
- `store` (default true, as OpenAI's), `metadata` (up to 16 string pairs), `truncation`
  (`disabled`; `auto` is accepted and means the same here: the engine refuses what does not fit)
  are echoed in the answer; `service_tier`, `prompt_cache_key`, `prompt_cache_retention`,
  `prompt_cache_options`, `stream_options`, `client_metadata`, `text.verbosity`, `reasoning.summary`
  are hints.

An explicit null is an absent field. Unknown top-level fields are a 400 (OpenAI: "Unknown
parameter"). What the gateway cannot honour is a clear 400, never dropped: `background`,
`conversation`, `prompt` templates, `context_management`, `max_tool_calls`, built-in tools (web
search, file search, computer use, MCP, code interpreter, image generation) and file inputs.
`item_reference` input items are the items the gateway stored for the key (`parse`'s `found`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from llm_gateway.dialects.field_checks import (
    Hint,
    PromptChars,
    as_bool,
    as_int,
    as_list,
    as_number,
    as_obj,
    as_str,
    check_hint,
    only_fields,
)
from llm_gateway.dialects.history import with_lead
from llm_gateway.dialects.responses.items import input_messages, invalid, unknown, unsupported
from llm_gateway.dialects.responses.tools import function_tools
from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.gathered import Gathered

_FIELDS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "store",
        "stream",
        "max_output_tokens",
        "temperature",
        "top_p",
        "top_logprobs",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "text",
        "reasoning",
        "metadata",
        "truncation",
        "user",
        "safety_identifier",
        "include",
    }
)
HINTS: dict[str, Hint] = {
    "service_tier": ("auto", "default", "flex", "scale", "priority"),
    "prompt_cache_key": "string",
    "prompt_cache_retention": "string",
    "prompt_cache_options": "object",
    "stream_options": "object",
    "client_metadata": "object",  # Codex sends its installation, thread and turn ids here, on every request
}
_UNSUPPORTED = {
    "background": "background responses are not implemented; stream instead",
    "conversation": "the Conversations API is not implemented; chain with previous_response_id",
    "prompt": "stored prompt templates are OpenAI's own",
    "context_management": "server-side context management is not implemented",
    "max_tool_calls": "the engines cannot bound the number of tool calls",
}
_INCLUDES = frozenset(
    {
        "message.output_text.logprobs",
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
    }
)
_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")


@dataclass(slots=True)
class ResponsesRequest:
    """One Responses request, checked: the chat fields, this input as chat messages and as items, and
    the fields its Response object echoes."""

    model: str
    stream: bool
    store: bool
    previous_response_id: str | None
    instructions: str | None
    #: this request's input as chat messages (no instructions, no earlier conversation)
    messages: list[dict[str, Any]]
    #: this request's input items, each with an id (GET /v1/responses/{id}/input_items); empty when not stored
    items: list[dict[str, Any]]
    #: chat body fields other than `messages`
    options: dict[str, Any]
    #: the request fields the Response object carries back
    echo: dict[str, Any] = field(default_factory=dict)
    prompt_estimate: int = 0
    #: the ids of the stored items this input referred to (listed in `items`, not stored again)
    referenced: frozenset[str] = frozenset()
    #: what read_request sizes of the instructions' and this input's chat messages, gathered as they were built
    gathered: Gathered | None = None

    def chat_body(self, earlier: list[dict[str, Any]]) -> dict[str, Any]:
        """The chat body: instructions, then the earlier conversation, then this input."""
        messages: list[dict[str, Any]] = []
        if self.instructions:
            messages.append({"role": "system", "content": self.instructions})
        messages += earlier
        messages += self.messages
        if not earlier:
            messages = with_lead(messages, self.messages)  # a kept history's JSON (dialects/history.py) not made again
        return {"model": self.model, "messages": messages, **self.options}

    def gathered_for(self, earlier: list[dict[str, Any]]) -> Gathered | None:
        """What read_request sizes of `chat_body(earlier)`'s messages (`read_request(gathered=)`); None when there
        is an earlier conversation (stored chat messages, not gathered: read_request walks the messages then)."""
        return None if earlier else self.gathered


def parse(
    req: dict[str, Any], found: Mapping[str, dict[str, Any]] | None = None, raw: bytes | None = None
) -> ResponsesRequest:
    """Check a Responses request and translate what maps; `found`: the stored items its `item_reference`s
    name, by id (`responses_items.item_references` lists those); `raw`: the bytes `req` was parsed from, where
    the handler has them (its tools are looked for there: tools.py). Raises GatewayError as OpenAI would."""
    for k, v in req.items():
        if k in _FIELDS or v is None:
            continue
        if k in HINTS:
            check_hint(v, k, HINTS[k])
            continue
        if k in _UNSUPPORTED:
            if k == "background" and v is False:
                continue
            raise unsupported(f"not supported by this gateway ({_UNSUPPORTED[k]})", k)
        raise unknown(k)
    model = req.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
    if req.get("input") is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
    seen = PromptChars()
    gathered = Gathered()  # in the order of chat_body's messages: the instructions first
    instructions = None
    if req.get("instructions") is not None:
        instructions = as_str(req["instructions"], "instructions")
        seen.chars += len(instructions)
        if instructions:
            gathered.texts.append(instructions)
    referenced: set[str] = set()
    # the items are stored with the response (GET .../input_items lists them): none to build when it is not
    items_too = req.get("store") is not False
    messages, items = input_messages(req["input"], seen, found, referenced, items_too=items_too, gathered=gathered)
    options: dict[str, Any] = {}
    echo: dict[str, Any] = {"instructions": instructions}
    stream = req.get("stream") is not None and as_bool(req["stream"], "stream")
    store = True if req.get("store") is None else as_bool(req["store"], "store")
    if stream:
        options["stream"] = True
        options["stream_options"] = {"include_usage": True}  # the usage chunk becomes the response's usage
    _sampling(req, options, echo)
    _tools(req, options, echo, seen, gathered, raw)
    _text(req, options, echo)
    _reasoning(req, options, echo)
    prev = req.get("previous_response_id")
    if prev is not None:
        prev = as_str(prev, "previous_response_id")
        if not prev.startswith("resp_"):
            raise invalid("expected an ID that begins with 'resp_'.", "previous_response_id")
    echo["store"] = store
    return ResponsesRequest(
        model,
        stream,
        store,
        prev,
        instructions,
        messages,
        items,
        options,
        echo,
        seen.chars // 4 + 1,
        frozenset(referenced),
        gathered,
    )


# -- sampling, tools, text, reasoning ----------------------------------------------------------------


def _sampling(req: dict[str, Any], options: dict[str, Any], echo: dict[str, Any]) -> None:
    echo["max_output_tokens"] = None
    if req.get("max_output_tokens") is not None:
        options["max_tokens"] = echo["max_output_tokens"] = as_int(req["max_output_tokens"], "max_output_tokens", 1)
    echo["temperature"] = 1.0
    if req.get("temperature") is not None:
        options["temperature"] = echo["temperature"] = as_number(req["temperature"], "temperature", 0.0, 2.0)
    echo["top_p"] = 1.0
    if req.get("top_p") is not None:
        options["top_p"] = echo["top_p"] = as_number(req["top_p"], "top_p", 0.0, 1.0)
    include = []
    if req.get("include") is not None:
        for j, v in enumerate(as_list(req["include"], "include")):
            v = as_str(v, f"include.{j}")
            if v not in _INCLUDES:
                raise invalid(f"'{v}' is not one of the supported values.", f"include.{j}")
            include.append(v)
    echo["top_logprobs"] = 0
    if req.get("top_logprobs") is not None:
        n = as_int(req["top_logprobs"], "top_logprobs", 0)
        if n > 20:
            raise invalid("must be at most 20.", "top_logprobs")
        echo["top_logprobs"] = n
        if n:
            options["logprobs"] = True
            options["top_logprobs"] = n
    if "message.output_text.logprobs" in include:
        options["logprobs"] = True
    user = req.get("user")
    safety = req.get("safety_identifier")
    if safety is not None:
        safety = as_str(safety, "safety_identifier")
    if user is None:
        user = safety
        if user is not None:
            echo["safety_identifier"] = user
    else:
        user = as_str(user, "user")
        echo["user"] = user
    if user is not None:
        options["user"] = user
    echo["metadata"] = {}
    if req.get("metadata") is not None:
        meta = as_obj(req["metadata"], "metadata")
        if len(meta) > 16:
            raise invalid("at most 16 key-value pairs.", "metadata")
        for k, v in meta.items():
            if len(k) > 64 or not isinstance(v, str) or len(v) > 512:
                raise invalid("keys are strings of at most 64 characters, values of at most 512.", f"metadata.{k}")
        echo["metadata"] = meta
    echo["truncation"] = "disabled"
    if req.get("truncation") is not None:
        check_hint(req["truncation"], "truncation", ("auto", "disabled"))
        echo["truncation"] = req["truncation"]


def _tools(
    req: dict[str, Any],
    options: dict[str, Any],
    echo: dict[str, Any],
    seen: PromptChars,
    gathered: Gathered,
    raw: bytes | None = None,
) -> None:
    echo["tools"] = []
    if req.get("tools") is not None:
        tools, echo["tools"] = function_tools(as_list(req["tools"], "tools"), raw)  # kept for an agent's next turn
        if tools:
            # their JSON bytes in the estimate, as read_request counts a chat body's tools, and in the engine's
            # body (wire/client_body.py): one encoding for all three
            options["tools"] = tools
            gathered.tools_json = tools.json
            seen.chars += len(tools.json)
    echo["tool_choice"] = "auto"
    choice = req.get("tool_choice")
    if choice is not None:
        if isinstance(choice, str):
            if choice not in ("auto", "none", "required"):
                raise invalid("expected 'auto', 'none', 'required' or a function.", "tool_choice")
            options["tool_choice"] = choice
        else:
            choice = as_obj(choice, "tool_choice")
            if choice.get("type") != "function":
                raise unsupported(
                    f"tool choice '{choice.get('type')}' is not supported by this gateway", "tool_choice.type"
                )
            name = as_str(choice.get("name"), "tool_choice.name")
            options["tool_choice"] = {"type": "function", "function": {"name": name}}
        echo["tool_choice"] = choice
    echo["parallel_tool_calls"] = True
    if req.get("parallel_tool_calls") is not None:
        options["parallel_tool_calls"] = echo["parallel_tool_calls"] = as_bool(
            req["parallel_tool_calls"], "parallel_tool_calls"
        )


def _text(req: dict[str, Any], options: dict[str, Any], echo: dict[str, Any]) -> None:
    echo["text"] = {"format": {"type": "text"}, "verbosity": "medium"}
    if req.get("text") is None:
        return
    text = as_obj(req["text"], "text")
    only_fields(text, frozenset({"format", "verbosity"}), "text")
    out: dict[str, Any] = {"format": {"type": "text"}, "verbosity": "medium"}
    if text.get("verbosity") is not None:
        check_hint(text["verbosity"], "text.verbosity", ("low", "medium", "high"))
        out["verbosity"] = text["verbosity"]
    fmt = text.get("format")
    if fmt is not None:
        fmt = as_obj(fmt, "text.format")
        kind = fmt.get("type")
        if kind == "json_schema":
            only_fields(fmt, frozenset({"type", "name", "schema", "strict", "description"}), "text.format")
            schema: dict[str, Any] = {
                "name": as_str(fmt.get("name"), "text.format.name"),
                "schema": as_obj(fmt.get("schema"), "text.format.schema"),
            }
            if fmt.get("strict") is not None:
                schema["strict"] = as_bool(fmt["strict"], "text.format.strict")
            if fmt.get("description") is not None:
                schema["description"] = as_str(fmt["description"], "text.format.description")
            options["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif kind == "json_object":
            options["response_format"] = {"type": "json_object"}
        elif kind != "text":
            raise invalid("expected 'text', 'json_object' or 'json_schema'.", "text.format.type")
        out["format"] = fmt
    echo["text"] = out


def _reasoning(req: dict[str, Any], options: dict[str, Any], echo: dict[str, Any]) -> None:
    echo["reasoning"] = {"effort": None, "summary": None}
    if req.get("reasoning") is None:
        return
    r = as_obj(req["reasoning"], "reasoning")
    only_fields(r, frozenset({"effort", "summary", "generate_summary"}), "reasoning")
    effort = r.get("effort")
    if effort is not None:
        check_hint(effort, "reasoning.effort", _EFFORTS)
        if effort == "none":
            options["chat_template_kwargs"] = {"enable_thinking": False}
        else:
            options["reasoning_effort"] = effort
    check_hint(r.get("generate_summary"), "reasoning.generate_summary", ("auto", "concise", "detailed"))
    summary = r.get("summary", r.get("generate_summary"))
    check_hint(summary, "reasoning.summary", ("auto", "concise", "detailed"))
    echo["reasoning"] = {"effort": effort, "summary": summary}
