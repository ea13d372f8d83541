"""The sizes of chat messages, gathered in one pass: their texts, other string fields, tool calls and images
(`Gathered`), summed in C (`Gathered.sums`) into the typical characters, the affinity text, the texts the floor
counts and the ceiling that request_info.py's estimate and window checks need (see its docstring for what each
number means). A translation that builds chat messages (the Anthropic and Responses ones) fills a `Gathered` as it
builds them, so that nothing walks them twice (issue 36). Split from request_info.py, which reads the rest of a
request and calls `messages_sums` for a chat body's messages.
"""

from __future__ import annotations

from typing import Any

import orjson

from llm_gateway.errors import InvalidRequest

#: the ceiling's allowances, in tokens, for what a chat template adds (see the module's docstring)
CEILING_BASE = 256
CEILING_PER_MESSAGE = 32
CEILING_TOOLS = 1024
CEILING_PER_IMAGE = 16384


def _utf8_size(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Gathered:
    """What sizing chat messages reads of them, gathered in one pass over them (`_messages`), or by a translation as
    it builds them (the Anthropic and Responses ones: `read_request(..., gathered=)`), so that nothing walks them
    twice; `sums` are the numbers. Texts in the order of their messages (the first four are the affinity text)."""

    __slots__ = ("as_json", "fresh", "images", "other_parts", "strings", "texts", "tools_json")

    def __init__(self) -> None:
        self.texts: list[str] = []  # contents and text parts: characters for the estimate, UTF-8 bytes for the ceiling
        self.strings: list[str] = []  # the other fields that are strings (tool_call_id, name...): their bytes
        self.as_json: list[Any] = []  # the other fields that are not strings (tool calls): their JSON bytes
        self.images = 0
        self.other_parts = 0  # the JSON bytes of content parts neither text nor image (audio, files...)
        self.fresh = True  # no assistant or tool message
        self.tools_json = b""  # the body's `tools` as JSON, where the translation encoded them

    def sums(self, count: int, needs: set[str]) -> tuple[int, str, list[str], int, bool]:
        """(typical characters, affinity text, the texts the floor counts, ceiling, fresh) of `count` messages."""
        texts, strings, as_json = self.texts, self.strings, self.as_json
        size = sum(map(len, texts))
        chars = 16 * count + size
        ceiling = CEILING_BASE + CEILING_PER_MESSAGE * count + self.other_parts
        ceiling += size if all(map(str.isascii, texts)) else sum(map(_utf8_size, texts))
        if self.images:
            needs.add("vision")
            chars += 1024 * self.images
            ceiling += CEILING_PER_IMAGE * self.images
        if strings:
            size = sum(map(len, strings)) if all(map(str.isascii, strings)) else sum(map(_utf8_size, strings))
            chars += size
            ceiling += size
        if as_json:  # their JSON bytes, in one encoding: a list's is theirs, n - 1 commas and its brackets
            size = len(orjson.dumps(as_json)) - len(as_json) - 1
            chars += size
            ceiling += size
        return chars, "\x00".join(texts[:4]), texts, ceiling, self.fresh


def messages_sums(messages: Any, needs: set[str]) -> tuple[int, str, list[str], int, bool]:
    """(typical characters, affinity text, the texts the floor counts, ceiling, fresh: no assistant or tool
    turn) of chat messages."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("'messages' must be a non-empty array", param="messages")
    g = _gather_by_key(messages)
    if g is None:
        g = _gather_each(messages)
    return g.sums(len(messages), needs)


#: the types a message's role and content have on the fast path (`_gather_by_key`)
_STR = {str}
_TEXT_OR_NONE = {str, type(None)}
_ROLE_AND_CONTENT = {"role", "content"}


def _gather_by_key(messages: list[Any]) -> Gathered | None:
    """`_gather_each`'s gathering, a field at a time over all messages in C (map, filter, set), not a message at a
    time in Python (issue 36); None where a message is not an object, a role not a string or a content neither a
    string nor null: the walk then gathers, or names what is wrong. Texts keep their messages' order (the affinity
    text is the first four); the other fields come a field at a time, an order their sums do not see."""
    try:
        roles = [m.get("role") for m in messages]
    except AttributeError:  # a message that is not an object
        return None
    contents = [m.get("content") for m in messages]
    if set(map(type, roles)) != _STR or not set(map(type, contents)) <= _TEXT_OR_NONE:
        return None
    g = Gathered()
    g.texts = [c for c in contents if c is not None]
    g.fresh = "assistant" not in roles and "tool" not in roles
    strings, as_json = g.strings, g.as_json
    for key in set().union(*messages) - _ROLE_AND_CONTENT:  # name, tool_calls, tool_call_id...
        values = [v for m in messages if (v := m.get(key)) is not None]
        kinds = set(map(type, values))
        if kinds == _STR:
            strings += values
        elif str not in kinds:
            as_json += values
        else:
            for v in values:
                (strings if isinstance(v, str) else as_json).append(v)
    return g


def _gather_each(messages: list[Any]) -> Gathered:
    """What sizing `messages` reads of them, a message at a time; raises for one the chat API does not allow."""
    # one pass that only gathers (issue 36: an agent's request has ~50 messages, most of them a text and one more
    # field, a tool call or its id), then each sum in C (`Gathered.sums`)
    g = Gathered()
    texts, strings, as_json = g.texts, g.strings, g.as_json
    fresh = True
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise InvalidRequest(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str):
            raise InvalidRequest(f"messages[{i}].role must be a string", param=f"messages[{i}].role")
        if fresh and (role == "assistant" or role == "tool"):
            fresh = False
        content = m.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                if not isinstance(part, dict):
                    continue
                t = part.get("type")
                if t in ("image_url", "input_image", "image"):
                    g.images += 1
                elif isinstance(part.get("text"), str):
                    texts.append(part["text"])
                else:  # audio, files, ...: their JSON, which holds more bytes than their tokens
                    g.other_parts += len(orjson.dumps(part))
        elif content is not None and role != "assistant":
            raise InvalidRequest(f"messages[{i}].content must be a string or an array", param=f"messages[{i}].content")
        if len(m) > 2 or "content" not in m:  # name, tool_calls, tool_call_id...: rendered by templates too
            for k, v in m.items():
                if k == "role" or k == "content" or v is None:
                    continue
                if isinstance(v, str):
                    strings.append(v)
                else:
                    as_json.append(v)
    g.fresh = fresh
    return g
