"""Which conversation a request belongs to, from what coding agents already send (issue 37 item 2).

The affinity key of `prefix_affinity` and `cache_aware` (selection.py). The first of these that the request
carries, in this order:

1. the configured header (`routing.session_header`, default `x-session-id`): the explicit way, for any client;
2. `x-claude-code-session-id`, with `x-claude-code-agent-id` when a subagent sends it (its own conversation):
   Claude Code sends both on every API call (`@anthropic-ai/claude-code` 2.1.332, the minified `cli.js` in its
   binary: the default headers `{"x-app": "cli", "User-Agent": ..., "X-Claude-Code-Session-Id": <session>}` and
   `x-claude-code-agent-id` for an agent);
3. `session_id`, then `conversation_id`: Codex sends its conversation id as `session_id`
   (openai/codex `codex-rs/codex-api/src/requests/headers.rs` @546585f, `build_conversation_headers`);
4. `x-opencode-session`: OpenCode, to its own providers (anomalyco/opencode
   `packages/opencode/src/session/llm.ts` @8759bf3);
5. the body's `prompt_cache_key` (OpenAI's field for this very purpose): Codex sets it to its conversation id,
   OpenCode to its session id for the `openai` provider or with `setCacheKey` (anomalyco/opencode
   `packages/opencode/src/provider/transform.ts` @000f628, `options()`);
6. the body's `user` when it carries a session: Anthropic's `metadata.user_id` becomes `user` in the gateway's
   chat body (dialects/anthropic/request.py), and Claude Code puts its session there, as
   `user_<hash>_account_<uuid>_session_<uuid>` (older releases) or a JSON object with `session_id` (2.x).

The OpenAI Agents SDK sends no session id (openai/openai-agents-python `src/agents/models/openai_responses.py`
@038cde8: `previous_response_id` and `conversation` in the Responses body, `User-Agent: Agents/Python`); its
`previous_response_id` chains reach routing as the whole conversation (the gateway expands the stored one,
dialects/responses/exchange.py), which the prefix record (prefix_cache.py) matches like any resent history.

The key is the source and a 64-bit digest of the value: the value itself (a user id may be in it) is never
kept. Nothing here is logged or exported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import orjson

#: the agents' headers, in the order they are looked up (lower-case, as the server gives them)
AGENT_HEADERS = (
    (b"x-claude-code-session-id", "claude-code"),
    (b"session_id", "codex"),
    (b"conversation_id", "codex"),
    (b"x-opencode-session", "opencode"),
)
CLAUDE_AGENT_HEADER = b"x-claude-code-agent-id"
MAX_VALUE = 512  # longer values are cut before hashing


def session_of(header: Callable[[bytes], bytes | None], configured: bytes, body: dict[str, Any]) -> str | None:
    """The request's session key (see the module's docstring for the sources), or None."""
    v = header(configured)
    if v:
        return _key("header", v)
    for name, source in AGENT_HEADERS:
        v = header(name)
        if v:
            if source == "claude-code":
                agent = header(CLAUDE_AGENT_HEADER)
                if agent:
                    v = v[:MAX_VALUE] + b"\0" + agent[:MAX_VALUE]
            return _key(source, v)
    pck = body.get("prompt_cache_key")
    if isinstance(pck, str) and pck:
        return _key("prompt_cache_key", pck.encode("utf-8", "surrogatepass"))
    user = body.get("user")
    if isinstance(user, str) and "session" in user:
        found = _session_in_user(user)
        if found:
            return _key("user", found.encode("utf-8", "surrogatepass"))
    return None


def _session_in_user(user: str) -> str | None:
    """Claude Code's session in `metadata.user_id`: after `_session_`, or a JSON object's `session_id`."""
    if user.startswith("{"):
        try:
            obj = orjson.loads(user)
        except orjson.JSONDecodeError:
            return None
        sid = obj.get("session_id") if isinstance(obj, dict) else None
        return sid if isinstance(sid, str) and sid else None
    _, sep, sid = user.rpartition("_session_")
    return sid if sep and sid else None


def _key(source: str, value: bytes) -> str:
    return f"{source}:{hashlib.blake2b(value[:MAX_VALUE], digest_size=8).hexdigest()}"
