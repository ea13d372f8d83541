"""Errors in the names of the route the client called: what the chat path raises about the translated chat
body (`messages`, `max_tokens`, `response_format`...) names the client's own parameters on the Responses
and Messages routes.

Every error the chat path can raise for a translated body names a chat field: the context-window 400
(`param` messages, "max_tokens" in its text), request_info's checks (an empty `input` is empty
`messages`), an engine's field table ("'parallel_tool_calls' is not supported by ..."), an engine's own
400 (its `param`). `renamed` maps them once, where the route's handler hands the body to the service:
`param` by its first segment (an index into the chat messages is no index into the client's input, so
the whole param becomes the client's field), and the text where it quotes a chat field ('name') or
names one that cannot be an English word (one with an underscore). Names both dialects share
(`messages` and `max_tokens` on Messages, `tools`, `tool_choice`, `temperature`...) stay as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from llm_gateway.errors import GatewayError

#: chat field -> the Responses request's field that became it (ingress/responses_request.py)
RESPONSES: Mapping[str, str] = {
    "messages": "input",
    "prompt": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "logprobs": "top_logprobs",
    "response_format": "text.format",
    "reasoning_effort": "reasoning.effort",
    "chat_template_kwargs": "reasoning.effort",
    "stream_options": "stream",
}
#: chat field -> the Messages request's field that became it (ingress/anthropic_request.py)
MESSAGES: Mapping[str, str] = {
    "max_completion_tokens": "max_tokens",
    "stop": "stop_sequences",
    "user": "metadata.user_id",
    "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "chat_template_kwargs": "thinking",
    "response_format": "output_config.format",
    "reasoning_effort": "output_config.effort",
    "stream_options": "stream",
}
_HEAD = re.compile(r"[.\[]")


def _pattern(names: Mapping[str, str]) -> re.Pattern[str]:
    quoted = "|".join(map(re.escape, names))
    bare = "|".join(re.escape(n) for n in names if "_" in n)
    return re.compile(rf"'({quoted})'|(?<![\w.])({bare})(?![\w])")


_PATTERNS = {id(RESPONSES): _pattern(RESPONSES), id(MESSAGES): _pattern(MESSAGES)}


def renamed(e: GatewayError, names: Mapping[str, str]) -> GatewayError:
    """`e` with the chat fields it names (in `param` and in its text) as the route's own names (in place)."""
    if e.param:
        head = _HEAD.split(e.param, 1)[0]
        if head in names:
            e.param = names[head]
    pattern = _PATTERNS.get(id(names)) or _pattern(names)

    def swap(m: re.Match[str]) -> str:
        if m.group(1) is not None:
            return f"'{names[m.group(1)]}'"
        return names[m.group(2)]

    e.message = pattern.sub(swap, e.message)
    return e
