"""A Responses request's `tools` as chat function tools and as the Response echoes them, translated once for the
last few distinct tool lists.

Only function tools are served (built-in tools are a clear 400); each is checked as OpenAI checks it, becomes a
chat `function` tool (its JSON encoded once: the size estimate's, and the engine body's, wire/client_body.py) and
is echoed with its defaults (`description` null, `strict` true). An agent sends the same 20-odd tools on every
turn: a list whose JSON is byte for byte one of the last `KEPT` (equal bytes are equal values, types included)
gets the kept translation, which nothing changes once made (issue 36 item 2).
"""

from __future__ import annotations

from typing import Any

from llm_gateway.dialects.field_checks import as_bool, as_obj, as_str, only_fields
from llm_gateway.dialects.responses.items import unsupported
from llm_gateway.errors import InvalidRequest
from llm_gateway.wire import body_json
from llm_gateway.wire.client_body import EncodedList, encoded_list
from llm_gateway.wire.recent import Recent, Same

_TOOL_FIELDS = frozenset({"type", "name", "description", "parameters", "strict", "defer_loading"})
#: distinct tool lists whose translation is kept
KEPT = 8
_kept: Recent[tuple[EncodedList, list[dict[str, Any]]]] = Recent(KEPT)
#: the same, by the identity of the parsed list (body_json's kept lists): found without looking for their bytes
_same: Same[tuple[EncodedList, list[dict[str, Any]]]] = Same(KEPT)


def function_tools(tools: list[Any], raw: bytes | None = None) -> tuple[EncodedList, list[dict[str, Any]]]:
    """The chat tools (with their JSON) and the echoed tools for a request's `tools` list (checked: raises
    GatewayError as OpenAI would), kept for the last `KEPT` lists, found without encoding them
    (`body_json.translated_tools`: by the list's identity, or in `raw`, the request's bytes)."""
    return body_json.translated_tools(tools, raw, _kept, _same, lambda: _translate(tools))


def _translate(tools: list[Any]) -> tuple[EncodedList, list[dict[str, Any]]]:
    fns: list[dict[str, Any]] = []  # the chat functions
    echoed: list[dict[str, Any]] = []
    for j, t in enumerate(tools):  # paths built for their errors only
        if not isinstance(t, dict):
            as_obj(t, f"tools.{j}")
        kind = t.get("type")
        if kind != "function":
            if not isinstance(kind, str):
                raise InvalidRequest(f"Missing required parameter: 'tools[{j}].type'.", param=f"tools.{j}.type")
            raise unsupported(
                f"'{kind}' tools are not supported by this gateway (only function tools are)", f"tools.{j}.type"
            )
        if not t.keys() <= _TOOL_FIELDS:
            only_fields(t, _TOOL_FIELDS, f"tools.{j}")
        name, desc, params, strict = t.get("name"), t.get("description"), t.get("parameters"), t.get("strict")
        if not isinstance(name, str):
            as_str(name, f"tools.{j}.name")
        fn: dict[str, Any] = {"name": name}
        if desc is not None:
            if not isinstance(desc, str):
                as_str(desc, f"tools.{j}.description")
            fn["description"] = desc
        if params is not None:
            if not isinstance(params, dict):
                as_obj(params, f"tools.{j}.parameters")
            fn["parameters"] = params
        if strict is not None:
            fn["strict"] = as_bool(strict, f"tools.{j}.strict")
        else:
            strict = True
        fns.append(fn)
        echoed.append({"type": "function", "name": name, "description": desc, "parameters": params, "strict": strict})
    return encoded_list([{"type": "function", "function": fn} for fn in fns] if fns else []), echoed
