"""The `input` of a Responses request, item by item, as OpenAI chat messages; and the errors the Responses
translation answers with (OpenAI's codes: unknown_parameter, invalid_value, unsupported_parameter).

A string is one user message; items: messages (`role` user / assistant / system / developer -> system;
content a string or parts: `input_text` / `output_text` / `refusal` -> text, `input_image` with an
`image_url` -> an `image_url` part with its `detail`), `function_call` items -> the assistant's
`tool_calls` (merged into the assistant message just before them), `function_call_output` -> `tool`
messages (images in an output follow in a user message), `reasoning` items -> the next assistant turn's
`reasoning_content`. Every item is also listed back with an id (GET /v1/responses/{id}/input_items).
An `item_reference` (`{"type": "item_reference", "id"}`, or OpenAI's short form: an id with neither
`type` nor `role`) stands for an item the gateway stored for the same key: the handler looks up every
reference of a request in one query (`item_references` lists them without reading the rest) and the
item is read as if the client had sent it; one the key has no such item for is OpenAI's 404 (`param`
input). File inputs and other item types are a 400.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from itertools import repeat
from typing import Any

from llm_gateway.dialects.field_checks import PromptChars, as_list, as_obj, as_str, check_hint
from llm_gateway.dialects.history import Histories, encoded_messages
from llm_gateway.errors import GatewayError, InvalidRequest
from llm_gateway.routing.gathered import Gathered

#: the translations of the last few agents' histories (dialects/history.py)
HISTORIES = Histories()


def unknown(param: str) -> InvalidRequest:
    return InvalidRequest(f"Unknown parameter: '{param}'.", param=param, code="unknown_parameter")


def invalid(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def unsupported(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(f"{param}: {message}", param=param, code="unsupported_parameter")


def new_id(prefix: str) -> str:
    return prefix + os.urandom(24).hex()


def missing_item(item_id: str) -> GatewayError:
    """OpenAI's answer to a reference to an item it does not hold for the key (status, envelope and text)."""
    return GatewayError(
        f"Item with id '{item_id}' not found.", status=404, type_="invalid_request_error", param="input"
    )


def _is_reference(it: dict[str, Any]) -> bool:
    kind = it.get("type")
    return kind == "item_reference" or (kind is None and "role" not in it and "id" in it)


def item_references(value: Any) -> list[str]:
    """The ids an `input` refers to (none for a string, or for items that are all given whole)."""
    if not isinstance(value, list):
        return []
    try:  # the usual input: objects that all have their type (read in C, not item by item; a list, not a set: the
        # types are new strings each request, and a set would hash every one)
        if None not in (kinds := list(map(dict.get, value, repeat("type")))) and "item_reference" not in kinds:
            return []
    except TypeError:  # an item that is not an object (input_messages answers it)
        pass
    return [it["id"] for it in value if isinstance(it, dict) and _is_reference(it) and isinstance(it.get("id"), str)]


def _path(value: list[Any], it: Any) -> str:
    """The parameter path of an input item, for its error (built only when there is one)."""
    return f"input.{next(i for i, x in enumerate(value) if x is it)}"


# -- input items --------------------------------------------------------------------------------------


def input_messages(
    value: Any,
    seen: PromptChars,
    found: Mapping[str, dict[str, Any]] | None = None,
    referenced: set[str] | None = None,
    *,
    items_too: bool = True,
    gathered: Gathered | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input as chat messages and as items; `found`: the stored items its references name (by id),
    and the ids of those it used are added to `referenced`. `items_too` false: no items (an empty list),
    for a response that is not stored, their one use (an agent's history is 60-odd items, each given an id).

    An agent's input is dozens of items: the usual ones (function calls and their string outputs, messages
    of text) are read inline, paths are built for errors only, and the rest goes through the helpers.
    `gathered`: what read_request sizes of the chat messages is added to it as they are built, in their order
    (request_info.Gathered: their texts, tool call ids and reasoning, tool calls, images), so that read_request
    does not walk them again (issue 36)."""
    g = gathered if gathered is not None else Gathered()
    if isinstance(value, str):
        seen.chars += len(value)
        g.texts.append(value)
        if not items_too:
            return [{"role": "user", "content": value}], []
        item = {
            "id": new_id("msg_"),
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": value}],
        }
        return [{"role": "user", "content": value}], [item]
    messages: list[dict[str, Any]] = []
    items: list[dict[str, Any]] = []
    reasoning: list[str] = []  # reasoning items waiting for the assistant turn they belong to
    chars = 16 * len(as_list(value, "input"))
    asst: dict[str, Any] | None = None  # the last message, when function calls that follow join it
    calls: list[dict[str, Any]] | None = None  # its tool calls, once it has some
    texts, strings, as_json = g.texts, g.strings, g.as_json
    fresh = True  # no assistant or tool message yet
    # an agent's resent history (not stored: no items to build): its leading items' translation reused
    start, reused, marks = HISTORIES.reuse(value, messages, g) if not items_too and g.fresh else (0, 0, None)
    if start:
        chars += reused
        fresh = g.fresh
        g.fresh = True  # set once, below, as a translation from the first item does
    chars0, seen0, keep = chars - reused, seen.chars, marks is not None
    for raw in value[start:] if start else value:
        try:
            kind = raw.get("type")
        except AttributeError:  # a JSON value other than an object has no .get
            as_obj(raw, _path(value, raw))  # raises
            raise
        it = raw
        if kind is None or kind == "item_reference":
            if kind is None and "role" in it:
                kind = "message"
            elif kind == "item_reference" or "id" in it:
                keep = False  # a stored item's translation: not for another request
                ref = as_str(it.get("id"), f"{_path(value, raw)}.id")
                stored = found.get(ref) if found is not None else None
                if stored is None:
                    raise missing_item(ref)
                it = stored
                if referenced is not None:
                    referenced.add(ref)
                kind = it.get("type", "message")
            else:
                kind = "message"
        if kind == "function_call":
            try:
                args, call_id, name = it["arguments"], it["call_id"], it["name"]
            except KeyError:
                args = call_id = name = None
            if not isinstance(args, str) or not isinstance(call_id, str) or not isinstance(name, str):
                p = _path(value, raw)
                as_str(it.get("arguments"), f"{p}.arguments")
                as_str(it.get("call_id"), f"{p}.call_id")
                as_str(it.get("name"), f"{p}.name")
            chars += len(args)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if calls is not None:
                calls.append(call)
            elif asst is not None:
                asst["tool_calls"] = calls = [call]
                as_json.append(calls)  # gathered as a list that the calls that follow join
                if asst["content"] == "":
                    asst["content"] = None
                    texts.pop()  # its text, the last gathered: any other message since would have ended `asst`
            else:
                asst = {"role": "assistant", "content": None, "tool_calls": [call]}
                calls = asst["tool_calls"]
                as_json.append(calls)
                fresh = False
                if reasoning:
                    asst["reasoning_content"] = text = "\n\n".join(reasoning)
                    strings.append(text)
                    reasoning = []
                messages.append(asst)
        elif kind == "function_call_output":
            try:
                out, call_id = it["output"], it["call_id"]
            except KeyError:
                out = call_id = None
            if isinstance(out, str) and isinstance(call_id, str):
                chars += len(out) + 16
                messages.append({"role": "tool", "tool_call_id": call_id, "content": out})
                texts.append(out)
                strings.append(call_id)
            else:
                _tool_output(it, _path(value, raw), messages, seen, g)
            fresh = False
            asst = calls = None
        elif kind == "message":
            msg = _text_message(it)
            if msg is None:
                msg = _message(it, _path(value, raw), seen, g)
            else:
                chars += len(msg["content"])
                texts.append(msg["content"])
            if msg["role"] == "assistant":
                fresh = False
                if reasoning:
                    msg["reasoning_content"] = text = "\n\n".join(reasoning)
                    strings.append(text)
                    reasoning = []
                asst, calls = msg, None
            else:
                asst = calls = None
            messages.append(msg)
        elif kind == "reasoning":
            text = _reasoning_text(it, _path(value, raw))
            chars += len(text)
            if text:
                reasoning.append(text)
                asst = calls = None  # the next assistant turn is a new message, with this reasoning
        elif isinstance(kind, str):
            raise unsupported(f"'{kind}' input items are not supported by this gateway", f"{_path(value, raw)}.type")
        else:
            raise invalid("expected an input item type.", f"{_path(value, raw)}.type")
        if items_too:
            items.append(_item(it, kind))
        elif marks is not None:
            marks.mark(g, chars - chars0 + seen.chars - seen0, fresh, asst is None and not reasoning)
    if keep and marks is not None and start < len(value):
        marks.keep(g)
    seen.chars += chars
    if not fresh:
        g.fresh = False
    # with a kept history's JSON (history.with_lead puts the instructions before it)
    return encoded_messages(messages, marks), items


def _item(it: dict[str, Any], kind: str) -> dict[str, Any]:
    """An input item as OpenAI lists it back: with an id, and a message with its `type` and content parts."""
    out = {"id": it["id"] if isinstance(it.get("id"), str) else new_id(_ID_PREFIX.get(kind, "item_")), **it}
    if kind == "message":
        out["type"] = "message"
        if isinstance(out.get("content"), str):
            part = "output_text" if out.get("role") == "assistant" else "input_text"
            out["content"] = [{"type": part, "text": out["content"]}]
    return out


_ID_PREFIX = {"message": "msg_", "function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text")


def _text_message(it: dict[str, Any]) -> dict[str, Any] | None:
    """The usual message, read without paths: a known role, its content a string or text parts; None for any
    other (`_message` reads it, and answers what is wrong with it)."""
    try:
        role = _ROLES[it.get("role")]  # type: ignore[index]
    except (KeyError, TypeError):  # not a role, or not even a string
        return None
    content = it.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        return None
    if len(content) == 1:  # the usual: one text part
        part = content[0]
        if isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
            text = part.get("text")
            if isinstance(text, str):
                return {"role": role, "content": text}
        return None
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
            return None
        text = part.get("text")
        if not isinstance(text, str):
            return None
        texts.append(text)
    return {"role": role, "content": "".join(texts)}


def _message(it: dict[str, Any], p: str, seen: PromptChars, g: Gathered) -> dict[str, Any]:
    """`g`: its texts and images are gathered there."""
    role = it.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise invalid("expected 'user', 'assistant', 'system' or 'developer'.", f"{p}.role")
    content = it.get("content")
    if isinstance(content, str):
        seen.chars += len(content)
        g.texts.append(content)
        return {"role": _ROLES[role], "content": content}
    parts: list[dict[str, Any]] = []
    for j, raw in enumerate(content if isinstance(content, list) else as_list(content, f"{p}.content")):
        part = raw if isinstance(raw, dict) else as_obj(raw, f"{p}.content.{j}")
        t = part.get("type")
        if t in ("input_text", "output_text"):  # the usual part: its path is built for its error only
            text = part.get("text")
            text = text if isinstance(text, str) else as_str(text, f"{p}.content.{j}.text")
            seen.chars += len(text)
            parts.append({"type": "text", "text": text})
            continue
        cp = f"{p}.content.{j}"
        if t == "refusal":
            text = as_str(part.get("refusal"), f"{cp}.refusal")
            seen.chars += len(text)
            parts.append({"type": "text", "text": text})
        elif t == "input_image":
            seen.chars += 1024
            parts.append(_image(part, cp))
        elif isinstance(t, str):
            raise unsupported(f"'{t}' content is not supported by this gateway", f"{cp}.type")
        else:
            raise invalid("expected a content part type.", f"{cp}.type")
    if _ROLES[role] != "user" or all(q["type"] == "text" for q in parts):
        if any(q["type"] != "text" for q in parts):
            raise unsupported("images are allowed in user messages only", f"{p}.content")
        text = "".join(q["text"] for q in parts)
        g.texts.append(text)
        return {"role": _ROLES[role], "content": text}
    for q in parts:
        if q["type"] == "text":
            g.texts.append(q["text"])
        else:
            g.images += 1
    return {"role": "user", "content": parts}


def _image(part: dict[str, Any], p: str) -> dict[str, Any]:
    url = part.get("image_url")
    if url is None:
        if part.get("file_id") is not None:
            raise unsupported(
                "file ids are not supported by this gateway; send the image as a URL or data URL", f"{p}.file_id"
            )
        raise InvalidRequest(f"Missing required parameter: '{p}.image_url'.", param=f"{p}.image_url")
    img: dict[str, Any] = {"url": as_str(url, f"{p}.image_url")}
    if part.get("detail") is not None:
        check_hint(part["detail"], f"{p}.detail", ("auto", "low", "high", "original"))
        img["detail"] = part["detail"]
    return {"type": "image_url", "image_url": img}


def _tool_output(it: dict[str, Any], p: str, messages: list[dict[str, Any]], seen: PromptChars, g: Gathered) -> None:
    """`g`: what read_request sizes of the messages it adds is gathered there."""
    call_id = it.get("call_id")
    call_id = call_id if isinstance(call_id, str) else as_str(call_id, f"{p}.call_id")
    out = it.get("output")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(out, str):
        texts.append(out)
    else:
        for j, raw in enumerate(as_list(out, f"{p}.output")):
            cp = f"{p}.output.{j}"
            part = as_obj(raw, cp)
            t = part.get("type")
            if t in ("input_text", "output_text"):
                texts.append(as_str(part.get("text"), f"{cp}.text"))
            elif t == "input_image":
                images.append(_image(part, cp))
            else:
                raise unsupported(f"'{t}' tool output content is not supported by this gateway", f"{cp}.type")
    text = "".join(texts)
    seen.chars += len(text) + 16
    messages.append({"role": "tool", "tool_call_id": call_id, "content": text})
    g.texts.append(text)
    g.strings.append(call_id)
    g.fresh = False
    if images:
        seen.chars += 1024 * len(images)
        messages.append({"role": "user", "content": images})
        g.images += len(images)


def _reasoning_text(it: dict[str, Any], p: str) -> str:
    """The text of a reasoning item: its reasoning content if it has any, else its summary (both checked)."""
    found: list[list[str]] = []
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = it.get(key)
        texts = []
        for j, raw in enumerate(as_list(parts, f"{p}.{key}") if parts is not None else []):
            part = as_obj(raw, f"{p}.{key}.{j}")
            if part.get("type") == kind:
                texts.append(as_str(part.get("text"), f"{p}.{key}.{j}.text"))
        found.append(texts)
    return "".join(next((texts for texts in found if texts), []))
