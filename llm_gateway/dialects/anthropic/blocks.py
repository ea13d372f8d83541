"""An Anthropic Messages request's content as OpenAI chat messages: the system prompt, each message's content
blocks (text, images, documents, tool use and tool results, thinking), with the checks Anthropic makes of
each block and a clear 400 for the blocks the gateway cannot honour. to_chat (request.py) calls `messages`
for the messages (`message` for each but the usual ones) and `system_text` for the system prompt. As each
chat message is built, what read_request sizes of it is gathered too (`Seen.gathered`: its texts, tool call
ids, tool calls, images), so that the chat messages are not walked again to size them (issue 36).
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.dialects.field_checks import (
    PromptChars,
    as_bool,
    as_list,
    as_obj,
    as_str,
    bad,
)
from llm_gateway.dialects.history import Histories, Marks
from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.gathered import Gathered

BILLING_HEADER = "x-anthropic-billing-header:"
#: the translations of the last few agents' histories (dialects/history.py)
HISTORIES = Histories()


class Seen(PromptChars):
    """The characters of prompt text seen, and what read_request sizes of the chat messages built (in their order)."""

    __slots__ = ("gathered",)

    def __init__(self) -> None:
        super().__init__()
        self.gathered = Gathered()


def system_text(system: Any, seen: PromptChars, param: str = "system") -> str:
    if isinstance(system, str):
        seen.chars += len(system)
        return system
    parts = []
    for j, b in enumerate(as_list(system, param)):
        b = as_obj(b, f"{param}.{j}")
        if b.get("type") != "text":
            raise bad("Input tag should be 'text'", f"{param}.{j}.type")
        text = as_str(b.get("text"), f"{param}.{j}.text")
        if text.startswith(BILLING_HEADER):
            continue  # Claude Code's attribution line for Anthropic's billing: not for the model
        seen.chars += len(text)
        parts.append(text)
    return "\n\n".join(parts)


def messages(raw: list[Any], out: list[dict[str, Any]], seen: Seen) -> Marks | None:
    """Every message of `raw` into `out`, as `message` does each: a user or assistant message of blocks (an agent's
    every turn) goes to its blocks' translation at once, without `message`'s call and checks (issue 36 item 2).
    Leading messages equal to a kept history's are that history's translation (dialects/history.py). Gives the
    history's marks (their JSON: `history.encoded_messages`), or None for a short list."""
    g = seen.gathered
    start, chars, marks = HISTORIES.reuse(raw, out, g) if g.fresh else (0, 0, None)
    base = seen.chars
    seen.chars += chars
    for i in range(start, len(raw)):
        m = raw[i]
        if type(m) is dict:
            content = m.get("content")
            if type(content) is list and content:
                role = m.get("role")
                if role == "assistant":
                    out.append(_assistant(content, i, seen))
                    if marks is not None:
                        marks.mark(g, seen.chars - base, g.fresh)
                    continue
                if role == "user":
                    _user(content, i, out, seen)
                    if marks is not None:
                        marks.mark(g, seen.chars - base, g.fresh)
                    continue
        message(m, i, out, seen)
        if marks is not None:
            marks.mark(g, seen.chars - base, g.fresh)
    if marks is not None and start < len(raw):
        marks.keep(g)
    return marks


def message(m: Any, i: int, out: list[dict[str, Any]], seen: Seen) -> None:
    """One message's chat messages into `out`; its 16 characters of overhead are the caller's to count (to_chat:
    once for all of them). An agent's history is dozens of turns of blocks: a field's path (messages.{i}...) is
    built for its error only."""
    if type(m) is not dict:
        m = as_obj(m, f"messages.{i}")
    role = m.get("role")
    try:
        content = m["content"]
    except KeyError:
        content = None
    if content is None or not (role == "user" or role == "assistant" or role == "system"):
        if role not in ("user", "assistant", "system"):
            raise bad("Input should be 'user', 'assistant' or 'system'", f"messages.{i}.role")
        if "content" not in m:
            raise bad("Field required", f"messages.{i}.content")
    if role == "system":  # a system message between the turns: a string or text blocks
        if isinstance(content, list) and not content:
            raise bad("List should have at least 1 item after validation, not 0", f"messages.{i}.content")
        text = system_text(content, seen, f"messages.{i}.content")
        out.append({"role": "system", "content": text})
        seen.gathered.texts.append(text)
        return
    if isinstance(content, str):
        seen.chars += len(content)
        out.append({"role": role, "content": content})
        seen.gathered.texts.append(content)
        if role == "assistant":
            seen.gathered.fresh = False
        return
    if not isinstance(content, list) or not content:
        as_list(content, f"messages.{i}.content")
        raise bad("List should have at least 1 item after validation, not 0", f"messages.{i}.content")
    if role == "assistant":
        out.append(_assistant(content, i, seen))
    else:
        _user(content, i, out, seen)


def _at(blocks: list[Any], b: Any) -> int:
    """The index of block `b` (for the path of its error: built only then)."""
    return next(j for j, x in enumerate(blocks) if x is b)


def _assistant(blocks: list[Any], i: int, seen: Seen) -> dict[str, Any]:
    """`i`: the message's index (its blocks are `messages.{i}.content.{j}`)."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    chars = 0
    for b in blocks:
        if type(b) is not dict:
            as_obj(b, f"messages.{i}.content.{_at(blocks, b)}")  # raises
        t = b.get("type")
        if t == "tool_use":
            args_in, call_id, name = b.get("input"), b.get("id"), b.get("name")
            if type(args_in) is not dict or type(call_id) is not str or type(name) is not str:
                p = f"messages.{i}.content.{_at(blocks, b)}"
                args_in = args_in if isinstance(args_in, dict) else as_obj(args_in, f"{p}.input")
                call_id = call_id if isinstance(call_id, str) else as_str(call_id, f"{p}.id")
                name = name if isinstance(name, str) else as_str(name, f"{p}.name")
            args = orjson.dumps(args_in).decode()
            chars += len(args)
            calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": args}})
        elif t == "text":
            text = b.get("text")
            if type(text) is not str:
                text = as_str(text, f"messages.{i}.content.{_at(blocks, b)}.text")
            chars += len(text)
            texts.append(text)
        elif t in ("thinking", "redacted_thinking"):
            continue  # earlier turns' reasoning is not part of the context (Anthropic drops it too)
        else:
            raise _unsupported_block(t, f"messages.{i}.content.{_at(blocks, b)}", "an assistant message")
    seen.chars += chars
    g = seen.gathered
    g.fresh = False
    msg: dict[str, Any] = {"role": "assistant", "content": None}
    if texts:
        msg["content"] = text = "\n\n".join(texts)
        g.texts.append(text)
    if calls:
        msg["tool_calls"] = calls
        g.as_json.append(calls)
    elif not texts:
        msg["content"] = ""
        g.texts.append("")
    return msg


def _user(blocks: list[Any], i: int, out: list[dict[str, Any]], seen: Seen) -> None:
    """`i`: the message's index (its blocks are `messages.{i}.content.{j}`)."""
    parts: list[dict[str, Any]] = []
    g = seen.gathered
    chars = 0
    for b in blocks:
        if type(b) is not dict:
            as_obj(b, f"messages.{i}.content.{_at(blocks, b)}")  # raises
        t = b.get("type")
        if t == "tool_result":
            text = b.get("content")
            if type(text) is str:  # the usual result: one text (`_tool_result` inlined, paths built for errors)
                tid, err = b.get("tool_use_id"), b.get("is_error")
                if type(tid) is not str:
                    tid = as_str(tid, f"messages.{i}.content.{_at(blocks, b)}.tool_use_id")
                if err is not None and as_bool(err, f"messages.{i}.content.{_at(blocks, b)}.is_error"):
                    text = "Error: " + text
                chars += len(text) + 16
                out.append({"role": "tool", "tool_call_id": tid, "content": text})
                g.texts.append(text)
                g.strings.append(tid)
                g.fresh = False
                continue
        elif t == "text":
            text = b.get("text")
            if type(text) is not str:
                text = as_str(text, f"messages.{i}.content.{_at(blocks, b)}.text")
            chars += len(text)
            parts.append({"type": "text", "text": text})
            continue
        p = f"messages.{i}.content.{_at(blocks, b)}"
        if t == "image":
            seen.chars += 1024
            parts.append(_image(b, p))
        elif t == "document":
            parts.append({"type": "text", "text": _document(b, p, seen)})
        elif t == "tool_result":
            _tool_result(b, p, out, seen)  # tool messages must follow the assistant's tool calls at once
        else:
            raise _unsupported_block(t, p, "a user message")
    seen.chars += chars
    if not parts:
        return
    if len(parts) == 1 and parts[0]["type"] == "text":
        out.append({"role": "user", "content": parts[0]["text"]})
        g.texts.append(parts[0]["text"])
        return
    out.append({"role": "user", "content": parts})
    for part in parts:
        if part["type"] == "text":
            g.texts.append(part["text"])
        else:
            g.images += 1


def _image(b: dict[str, Any], p: str) -> dict[str, Any]:
    src = as_obj(b.get("source"), f"{p}.source")
    kind = src.get("type")
    if kind == "base64":
        media = as_str(src.get("media_type"), f"{p}.source.media_type")
        data = as_str(src.get("data"), f"{p}.source.data")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        url = as_str(src.get("url"), f"{p}.source.url")
    else:
        raise InvalidRequest(
            f"{p}.source.type: image source '{kind}' is not supported by this gateway (use base64 or url)",
            param=f"{p}.source.type",
            code="unsupported_parameter",
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _document(b: dict[str, Any], p: str, seen: Seen) -> str:
    src = as_obj(b.get("source"), f"{p}.source")
    kind = src.get("type")
    if kind in ("text", "content"):
        if kind == "text":
            text = as_str(src.get("data"), f"{p}.source.data")
        else:  # a document made of text blocks
            parts = []
            for k, c in enumerate(as_list(src.get("content"), f"{p}.source.content")):
                c = as_obj(c, f"{p}.source.content.{k}")
                if c.get("type") != "text":
                    raise _unsupported_block(c.get("type"), f"{p}.source.content.{k}", "a document")
                parts.append(as_str(c.get("text"), f"{p}.source.content.{k}.text"))
            text = "\n\n".join(parts)
        title = b.get("title")
        if isinstance(title, str) and title:
            text = f"{title}\n\n{text}"
        seen.chars += len(text)
        return text
    raise InvalidRequest(
        f"{p}.source.type: document source '{kind}' is not supported by this gateway (only text documents "
        "are; send PDF content as text or images)",
        param=f"{p}.source.type",
        code="unsupported_parameter",
    )


def _tool_result(b: dict[str, Any], p: str, out: list[dict[str, Any]], seen: Seen) -> None:
    tid = as_str(b.get("tool_use_id"), f"{p}.tool_use_id")
    content = b.get("content")
    texts: list[str] = []
    images: list[dict[str, Any]] = []
    if isinstance(content, str):
        texts.append(content)
    elif content is not None:
        for k, c in enumerate(as_list(content, f"{p}.content")):
            cp = f"{p}.content.{k}"
            c = as_obj(c, cp)
            t = c.get("type")
            if t == "text":
                texts.append(as_str(c.get("text"), f"{cp}.text"))
            elif t == "image":
                images.append(_image(c, cp))
            elif t == "document":
                texts.append(_document(c, cp, seen))
            else:
                raise _unsupported_block(t, cp, "a tool result")
    text = "\n\n".join(texts)
    err = b.get("is_error")
    if err is not None and as_bool(err, f"{p}.is_error"):
        text = "Error: " + text
    seen.chars += len(text) + 16
    out.append({"role": "tool", "tool_call_id": tid, "content": text})
    g = seen.gathered
    g.fresh = False
    g.texts.append(text)
    g.strings.append(tid)
    if images:
        seen.chars += 1024 * len(images)
        out.append({"role": "user", "content": images})
        g.images += len(images)


def _unsupported_block(t: Any, p: str, where: str) -> InvalidRequest:
    if not isinstance(t, str):
        return bad("Field required", f"{p}.type")
    return InvalidRequest(
        f"{p}.type: '{t}' blocks in {where} are not supported by this gateway",
        param=f"{p}.type",
        code="unsupported_parameter",
    )
