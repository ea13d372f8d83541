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

An agent's history (messages of text, function calls, their string outputs) is read a kind at a time, each
field over all the items of its kind in C (`_usual_input`), and makes exactly what reading it item by item
makes; any other input is read item by item, which answers the first item in error.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, compress, count, repeat
from operator import itemgetter
from typing import Any

from llm_gateway.dialects.field_checks import PromptChars, as_list, as_obj, as_str, check_hint
from llm_gateway.errors import GatewayError, InvalidRequest


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
    try:  # the usual input: objects that all have their type (read in C, not item by item)
        if None not in (kinds := set(map(dict.get, value, _TYPES))) and "item_reference" not in kinds:
            return []
    except TypeError:  # an item that is not an object (input_messages answers it)
        pass
    return [it["id"] for it in value if isinstance(it, dict) and _is_reference(it) and isinstance(it.get("id"), str)]


# -- input items --------------------------------------------------------------------------------------


def input_messages(
    value: Any,
    seen: PromptChars,
    found: Mapping[str, dict[str, Any]] | None = None,
    referenced: set[str] | None = None,
    *,
    items_too: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input as chat messages and as items; `found`: the stored items its references name (by id),
    and the ids of those it used are added to `referenced`. `items_too` false: no items (an empty list),
    for a response that is not stored, their one use (an agent's history is 60-odd items, each given an id).

    An agent's input is dozens of items: their types are read in C; an input of the usual kinds is read a kind
    at a time (`_usual_input`), any other item by item (`_item_by_item`: paths built for errors only)."""
    if isinstance(value, str):
        seen.chars += len(value)
        if not items_too:
            return [{"role": "user", "content": value}], []
        item = {
            "id": new_id("msg_"),
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": value}],
        }
        return [{"role": "user", "content": value}], [item]
    chars = 16 * len(as_list(value, "input"))
    try:
        kinds: list[Any] = list(map(dict.get, value, _TYPES))
    except TypeError:  # an item that is not an object: read item by item, which answers it
        kinds = [None]
    resolved: list[tuple[dict[str, Any], Any]] | None = None  # the items with their types, when not as sent
    pairs: Iterable[tuple[dict[str, Any], Any]] = zip(value, kinds, strict=True)
    if None in kinds or "item_reference" in kinds:  # references, or items without their type
        resolved = []
        pairs = _resolved(value, found, referenced, resolved)
    got = _usual_input(value, kinds) if resolved is None else None
    messages, more = got if got is not None else _item_by_item(pairs, seen)
    seen.chars += chars + more
    if not items_too:
        return messages, []
    return messages, [
        _item(it, kind) for it, kind in (zip(value, kinds, strict=True) if resolved is None else resolved)
    ]


_TYPES, _TEXTS = repeat("type"), repeat("text")  # map(dict.get, items, _TYPES): each item's type
_CALL_FIELDS = itemgetter("call_id", "name", "arguments")
_OUTPUT_FIELDS = itemgetter("call_id", "output")
_TEXT_PARTS = frozenset({"input_text", "output_text"})
_str_len = str.__len__  # a string's length, and a TypeError for anything else


_USUAL_KINDS = frozenset({"message", "function_call", "function_call_output"})
_IS_CALL, _IS_OUTPUT, _IS_MESSAGE = "function_call".__eq__, "function_call_output".__eq__, "message".__eq__
_ROLE, _CONTENT = itemgetter("role"), itemgetter("content")
_ARGUMENTS, _OUTPUT = itemgetter(2), itemgetter(1)
_STR_ONLY = frozenset({str})


def _usual_input(value: list[dict[str, Any]], kinds: list[Any]) -> tuple[list[dict[str, Any]], int] | None:
    """The usual input (messages of text, function calls, their string outputs: an agent's history), as chat
    messages with the characters of its text, read field by field over all the items of a kind at once (in C,
    not item by item); None for any other input or any item in error (`_item_by_item` reads those, and answers
    the first item in error). What it makes is exactly what `_item_by_item` makes of the same input."""
    try:
        if not _USUAL_KINDS.issuperset(kinds):
            return None
        is_call = list(map(_IS_CALL, kinds))
        calls = list(map(_CALL_FIELDS, compress(value, is_call)))  # (call_id, name, arguments)
        outputs = list(map(_OUTPUT_FIELDS, compress(value, map(_IS_OUTPUT, kinds))))  # (call_id, output)
        said = list(compress(value, map(_IS_MESSAGE, kinds)))
        roles = list(map(_ROLES.__getitem__, map(_ROLE, said)))
        texts = _texts(list(map(_CONTENT, said)))
    except (KeyError, TypeError):  # a type, role or content that is not one, a field missing
        return None
    if not (
        _STR_ONLY.issuperset(map(type, chain.from_iterable(calls)))
        and _STR_ONLY.issuperset(map(type, chain.from_iterable(outputs)))
        and _STR_ONLY.issuperset(map(type, texts))
    ):
        return None
    chars = sum(map(len, map(_ARGUMENTS, calls))) + sum(map(len, texts))
    chars += sum(map(len, map(_OUTPUT, outputs))) + 16 * len(outputs)
    # each kind's chat messages, then all of them in the items' order (each kind's next, in C); a call's
    # place is None until it is known whether it begins an assistant message
    of_kind = {
        "message": iter([{"role": r, "content": t} for r, t in zip(roles, texts, strict=True)]),
        "function_call": repeat(None),
        "function_call_output": iter([{"role": "tool", "tool_call_id": c, "content": o} for c, o in outputs]),
    }
    pieces: list[Any] = list(map(next, map(of_kind.__getitem__, kinds)))
    # a function call joins the calls just before it, or the assistant message just before it, else begins one
    befores = list(compress(chain((_START,), pieces), is_call))
    turn: list[dict[str, Any]] = []
    for i, (c, n, a), before in zip(compress(count(), is_call), calls, befores, strict=True):
        call = {"id": c, "type": "function", "function": {"name": n, "arguments": a}}
        if before is None:  # a call
            turn.append(call)
        elif before["role"] == "assistant":
            before["tool_calls"] = turn = [call]
            if before["content"] == "":
                before["content"] = None
        else:
            turn = [call]
            pieces[i] = {"role": "assistant", "content": None, "tool_calls": turn}
    return list(filter(None, pieces)), chars


def _texts(contents: list[Any]) -> list[Any]:
    """The text of each message's content: a string, or text parts joined (None for other content, or a
    TypeError). Read in C when all are strings, or all one text part (an agent's history is either)."""
    kinds = set(map(type, contents))
    if kinds <= _STR_ONLY:
        return contents
    if kinds <= _LIST_ONLY and set(map(len, contents)) == _ONE:
        parts = list(map(_FIRST, contents))
        if _TEXT_PARTS.issuperset(map(dict.get, parts, _TYPES)):
            return list(map(dict.get, parts, _TEXTS))
    return [c if isinstance(c, str) else _parts_text(c) for c in contents]


_LIST_ONLY, _ONE, _FIRST = frozenset({list}), {1}, itemgetter(0)
_START = {"role": None}  # what is before the first item


def _parts_text(content: Any) -> str | None:
    """The text of content parts that are all text; None for other content, or a TypeError."""
    if isinstance(content, list) and _TEXT_PARTS.issuperset(map(dict.get, content, _TYPES)):
        return "".join(map(dict.get, content, _TEXTS))  # type: ignore[arg-type]
    return None


def _item_by_item(pairs: Iterable[tuple[dict[str, Any], Any]], seen: PromptChars) -> tuple[list[dict[str, Any]], int]:
    """Items (with their types) as chat messages, one by one, answering the first that is wrong; with the
    characters of text read (the helpers add theirs to `seen`)."""
    chars = 0
    messages: list[dict[str, Any]] = []
    reasoning: list[str] = []  # reasoning items waiting for the assistant turn they belong to
    asst: dict[str, Any] | None = None  # the last message, when function calls that follow join it
    calls: list[dict[str, Any]] | None = None  # its tool calls, once it has some
    for i, (it, kind) in enumerate(pairs):
        if kind == "function_call":
            try:
                call_id, name, args = _CALL_FIELDS(it)
                chars += _str_len(args)  # and a TypeError when the arguments are not a string
            except (KeyError, TypeError):
                _call_fields(it, f"input.{i}")
                raise
            if not isinstance(call_id, str) or not isinstance(name, str):
                _call_fields(it, f"input.{i}")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if calls is not None:
                calls.append(call)
            elif asst is not None:
                asst["tool_calls"] = calls = [call]
                if asst["content"] == "":
                    asst["content"] = None
            else:
                calls = [call]
                asst = {"role": "assistant", "content": None, "tool_calls": calls}
                if reasoning:
                    asst["reasoning_content"] = "\n\n".join(reasoning)
                    reasoning = []
                messages.append(asst)
        elif kind == "function_call_output":
            try:
                call_id, out = _OUTPUT_FIELDS(it)
                chars += _str_len(out) + 16  # a TypeError when the output is parts
            except (KeyError, TypeError):
                _tool_output(it, f"input.{i}", messages, seen)
            else:
                if not isinstance(call_id, str):
                    _tool_output(it, f"input.{i}", messages, seen)
                messages.append({"role": "tool", "tool_call_id": call_id, "content": out})
            asst = calls = None
        elif kind == "message":
            try:  # a known role, and a string or text parts: anything else is a KeyError or a TypeError
                role = _ROLES[it["role"]]
                content = it["content"]
                if isinstance(content, list) and _TEXT_PARTS.issuperset(map(dict.get, content, _TYPES)):
                    content = "".join(map(dict.get, content, _TEXTS))  # type: ignore[arg-type]
                chars += _str_len(content)  # a TypeError for parts that are not all text
                msg = {"role": role, "content": content}
            except (KeyError, TypeError):
                msg = _message(it, f"input.{i}", seen)
            if msg["role"] == "assistant":
                if reasoning:
                    msg["reasoning_content"] = "\n\n".join(reasoning)
                    reasoning = []
                asst, calls = msg, None
            else:
                asst = calls = None
            messages.append(msg)
        elif kind == "reasoning":
            text = _reasoning_text(it, f"input.{i}")
            chars += len(text)
            if text:
                reasoning.append(text)
                asst = calls = None  # the next assistant turn is a new message, with this reasoning
        elif isinstance(kind, str):
            raise unsupported(f"'{kind}' input items are not supported by this gateway", f"input.{i}.type")
        else:
            raise invalid("expected an input item type.", f"input.{i}.type")
    return messages, chars


def _resolved(
    value: list[Any],
    found: Mapping[str, dict[str, Any]] | None,
    referenced: set[str] | None,
    out: list[tuple[dict[str, Any], Any]],
) -> Iterator[tuple[dict[str, Any], Any]]:
    """The items with their types, references replaced by the items they name, each checked in its turn (so
    that the first item in error is the one answered); what it yields is kept in `out` too."""
    for i, raw in enumerate(value):
        it = as_obj(raw, f"input.{i}")
        if _is_reference(it):
            ref = as_str(it.get("id"), f"input.{i}.id")
            stored = found.get(ref) if found is not None else None
            if stored is None:
                raise missing_item(ref)
            it = stored
            if referenced is not None:
                referenced.add(ref)
        out.append((it, it.get("type", "message")))
        yield out[-1]


def _call_fields(it: dict[str, Any], p: str) -> None:
    """Answers what is wrong with a function call's fields."""
    as_str(it.get("arguments"), f"{p}.arguments")
    as_str(it.get("call_id"), f"{p}.call_id")
    as_str(it.get("name"), f"{p}.name")


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


def _message(it: dict[str, Any], p: str, seen: PromptChars) -> dict[str, Any]:
    role = it.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise invalid("expected 'user', 'assistant', 'system' or 'developer'.", f"{p}.role")
    content = it.get("content")
    if isinstance(content, str):
        seen.chars += len(content)
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
        return {"role": _ROLES[role], "content": "".join(q["text"] for q in parts)}
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


def _tool_output(it: dict[str, Any], p: str, messages: list[dict[str, Any]], seen: PromptChars) -> None:
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
    if images:
        seen.chars += 1024 * len(images)
        messages.append({"role": "user", "content": images})


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
