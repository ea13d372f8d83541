"""Anthropic Messages tools and request options as OpenAI chat fields: `tools`, `tool_choice`,
`thinking` and `output_config` (see anthropic_request.py for the whole mapping).

Tools become function tools (server and built-in tools are refused: the gateway cannot run them);
tool_choice auto / any / tool / none becomes "auto" / "required" / the named function / "none";
thinking becomes `chat_template_kwargs.enable_thinking`; output_config.format (json_schema) becomes
`response_format`. `context_management` is accepted when its edits only clear earlier turns' thinking
(what Claude Code sends by default): the translation drops that thinking from the context anyway.
Edits that clear tool uses would change the context, which is not implemented: those are a 400.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.dialects.field_checks import (
    Hint,
    as_bool,
    as_int,
    as_obj,
    as_str,
    bad,
    check_hint,
    only_fields,
)
from llm_gateway.errors import InvalidRequest

#: tool fields read as hints: prompt caching, streaming, Anthropic's tool search and programmatic calling
TOOL_HINTS: dict[str, Hint] = {
    "cache_control": "object",
    "eager_input_streaming": "boolean",
    "defer_loading": "boolean",
    "allowed_callers": "array",
    "input_examples": "array",
}
EFFORTS = ("low", "medium", "high", "xhigh", "max")
THINKING_DISPLAYS = ("summarized", "omitted")

_TOOL_FIELDS = frozenset({"name", "description", "input_schema", "type", "strict", *TOOL_HINTS})


def tool(t: Any, j: int) -> dict[str, Any]:
    # an agent sends 20-odd tools with every turn: a field's path (tools.{j}...) is built for its error only
    t = t if isinstance(t, dict) else as_obj(t, f"tools.{j}")
    kind = t.get("type")
    if kind not in (None, "custom"):
        raise InvalidRequest(
            f"tools.{j}.type: '{kind}' is an Anthropic server or built-in tool, which this gateway does not provide "
            "(define it as a custom tool with an input_schema instead)",
            param=f"tools.{j}.type",
            code="unsupported_parameter",
        )
    if not t.keys() <= _TOOL_FIELDS:
        only_fields(t, _TOOL_FIELDS, f"tools.{j}")
    name = t.get("name")
    if not isinstance(name, str):
        as_str(name, f"tools.{j}.name")
    if not name:
        raise bad("String should have at least 1 character", f"tools.{j}.name")
    if "input_schema" not in t:
        raise bad("Field required", f"tools.{j}.input_schema")
    schema = t["input_schema"]
    fn: dict[str, Any] = {
        "name": name,
        "parameters": schema if isinstance(schema, dict) else as_obj(schema, f"tools.{j}.input_schema"),
    }
    desc = t.get("description")
    if desc is not None:
        fn["description"] = desc if isinstance(desc, str) else as_str(desc, f"tools.{j}.description")
    if t.get("strict") is not None:
        fn["strict"] = as_bool(t["strict"], f"tools.{j}.strict")
    if not t.keys().isdisjoint(TOOL_HINTS):  # usually none: then no loop over the hints
        for k, hint in TOOL_HINTS.items():
            check_hint(t.get(k), f"tools.{j}.{k}", hint)
    return {"type": "function", "function": fn}


def tool_choice(tc: Any, body: dict[str, Any]) -> None:
    tc = as_obj(tc, "tool_choice")
    kind = tc.get("type")
    if kind == "tool":
        only_fields(tc, frozenset({"type", "name", "disable_parallel_tool_use"}), "tool_choice")
        name = as_str(tc.get("name"), "tool_choice.name")
        body["tool_choice"] = {"type": "function", "function": {"name": name}}
    elif kind in ("auto", "any"):
        only_fields(tc, frozenset({"type", "disable_parallel_tool_use"}), "tool_choice")
        body["tool_choice"] = "auto" if kind == "auto" else "required"
    elif kind == "none":
        only_fields(tc, frozenset({"type"}), "tool_choice")
        body["tool_choice"] = "none"
    else:
        raise bad("Input tag should be 'auto', 'any', 'tool' or 'none'", "tool_choice.type")
    dp = tc.get("disable_parallel_tool_use")
    if dp is not None and as_bool(dp, "tool_choice.disable_parallel_tool_use"):
        body["parallel_tool_calls"] = False


def thinking(th: Any, body: dict[str, Any]) -> None:
    th = as_obj(th, "thinking")
    kind = th.get("type")
    check_hint(th.get("display"), "thinking.display", THINKING_DISPLAYS)
    if kind == "enabled":
        only_fields(th, frozenset({"type", "budget_tokens", "display"}), "thinking")
        if "budget_tokens" not in th:
            raise bad("Field required", "thinking.budget_tokens")
        as_int(th["budget_tokens"], "thinking.budget_tokens", 1024)  # not enforced: engines have no such budget
        on = True
    elif kind == "adaptive":
        only_fields(th, frozenset({"type", "display"}), "thinking")
        on = True
    elif kind == "disabled":
        only_fields(th, frozenset({"type"}), "thinking")
        on = False
    else:
        raise bad("Input tag should be 'enabled', 'adaptive' or 'disabled'", "thinking.type")
    body["chat_template_kwargs"] = {"enable_thinking": on}


def output_config(oc: Any, body: dict[str, Any]) -> None:
    oc = as_obj(oc, "output_config")
    only_fields(oc, frozenset({"effort", "format"}), "output_config")
    check_hint(oc.get("effort"), "output_config.effort", EFFORTS)
    fmt = oc.get("format")
    if fmt is None:
        return
    fmt = as_obj(fmt, "output_config.format")
    if fmt.get("type") != "json_schema":
        raise bad("Input tag should be 'json_schema'", "output_config.format.type")
    schema = as_obj(fmt.get("schema"), "output_config.format.schema")
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def context_management(value: Any) -> None:
    """Accept `{"edits": [...]}` whose edits all clear thinking (`clear_thinking_*`); refuse the others."""
    cm = as_obj(value, "context_management")
    only_fields(cm, frozenset({"edits"}), "context_management")
    edits = cm.get("edits")
    if edits is None:
        return
    if not isinstance(edits, list):
        raise bad("Input should be a valid list", "context_management.edits")
    for j, e in enumerate(edits):
        kind = as_obj(e, f"context_management.edits.{j}").get("type")
        if not isinstance(kind, str):
            raise bad("Field required", f"context_management.edits.{j}.type")
        if not kind.startswith("clear_thinking_"):
            raise InvalidRequest(
                f"context_management.edits.{j}.type: '{kind}' edits are not supported by this gateway (only "
                "clear_thinking edits are: earlier thinking is never sent to the engine)",
                param=f"context_management.edits.{j}.type",
                code="unsupported_parameter",
            )
