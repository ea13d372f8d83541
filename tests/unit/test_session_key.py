"""Session keys from what agents send (routing/session_key.py), and their effect through HTTP: a conversation
whose prompt gives no prefix to match still stays on one engine when its agent names its session.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.routing.session_key import session_of
from tests.conftest import gateway_client
from tests.unit.test_cache_aware import config as cache_config
from tests.unit.test_cache_aware import engines


def key(headers: dict[bytes, bytes], body: dict[str, Any] | None = None, configured: bytes = b"x-session-id"):
    return session_of(headers.get, configured, body or {})


def test_no_identifier_no_session() -> None:
    assert key({}) is None
    assert key({b"user-agent": b"curl"}, {"user": "alice"}) is None


def test_each_agents_identifier_is_a_session() -> None:
    assert key({b"x-session-id": b"s1"}) is not None
    assert key({b"x-claude-code-session-id": b"0b6f"}) is not None  # Claude Code
    assert key({b"session_id": b"019a"}) is not None  # Codex
    assert key({b"x-opencode-session": b"ses_1"}) is not None  # OpenCode
    assert key({}, {"prompt_cache_key": "019a"}) is not None  # Codex, OpenCode's openai provider
    old = "user_9f2c_account_a929b7ef-d758_session_34832e57-9b65"
    assert key({}, {"user": old}) == key({}, {"user": "user_other_account_x_session_34832e57-9b65"})
    new = '{"device_id":"d","account_uuid":"a","session_id":"34832e57-9b65"}'
    assert key({}, {"user": new}) is not None


def test_the_same_value_from_different_sources_is_a_different_session_and_the_value_is_not_kept() -> None:
    a = key({b"x-session-id": b"abc"})
    b = key({b"session_id": b"abc"})
    assert a is not None and b is not None and a != b
    assert "abc" not in a and "34832e57" not in str(key({}, {"user": "u_session_34832e57"}))


def test_the_configured_header_goes_first_then_the_agents_headers_then_the_body() -> None:
    both = {b"x-conversation": b"mine", b"x-claude-code-session-id": b"cc"}
    assert key(both, configured=b"x-conversation") == key({b"x-conversation": b"mine"}, configured=b"x-conversation")
    assert key({b"session_id": b"cx"}, {"prompt_cache_key": "other"}) == key({b"session_id": b"cx"})
    assert key({}, {"prompt_cache_key": "pk", "user": "u_session_s"}) == key({}, {"prompt_cache_key": "pk"})


def test_a_claude_code_subagent_is_its_own_conversation() -> None:
    main = key({b"x-claude-code-session-id": b"s"})
    sub = key({b"x-claude-code-session-id": b"s", b"x-claude-code-agent-id": b"agent-1"})
    sub2 = key({b"x-claude-code-session-id": b"s", b"x-claude-code-agent-id": b"agent-2"})
    assert len({main, sub, sub2}) == 3


def chat(text: str) -> dict[str, Any]:
    return {"model": "agent", "messages": [{"role": "user", "content": text}, {"role": "assistant", "content": "x"}]}


async def route(headers_of: Any, turns: int = 4, sessions: int = 3) -> dict[int, set[str]]:
    """Each turn's prompt is new text (no prefix to match): where each session's turns went."""
    out: dict[int, set[str]] = {s: set() for s in range(sessions)}
    async with gateway_client(cache_config("cache_aware"), upstream=engines()) as (client, _):
        for t in range(turns):
            for s in range(sessions):
                body = chat(f"turn {t} of session {s}: " + f"{t}{s} " * 200)
                r = await client.post("/v1/chat/completions", json=body, headers=headers_of(s))
                assert r.status_code == 200, r.text
                out[s].add(r.headers["x-gateway-backend"])
    return out


async def test_an_agent_session_header_keeps_its_turns_on_one_engine_under_cache_aware() -> None:
    for name in ("x-claude-code-session-id", "session_id", "x-opencode-session", "x-session-id"):
        served = await route(lambda s, n=name: {n: f"sess-{s}"})
        assert all(len(engines) == 1 for engines in served.values()), (name, served)


async def test_without_a_session_the_same_prompts_move_between_engines() -> None:
    """The control: the stickiness above is the session's, not the prompts' or the rotation's."""
    served = await route(lambda s: {})
    assert any(len(engines) > 1 for engines in served.values()), served
