"""Session and prefix affinity through HTTP (strategy `prefix_affinity`, four deployments): requests with
the same session header (`routing.session_header`, default `x-session-id`) land on the same backend
every time, whatever their prompts; different sessions spread over several backends; without the
header, requests whose prompts share their first `affinity.prefix_chars` characters land together.

Which backend served each request is read from x-gateway-backend and checked against the engine URL
that FakeUpstream saw called. Affinity is rendezvous hashing of fixed strings, so these outcomes are
deterministic, not probabilistic.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import httpx

from llm_gateway.settings import RoutingConfig
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

NAMES = ["engine-a", "engine-b", "engine-c", "engine-d"]
PREFIX_CHARS = 64
SYSTEM = "You are a careful assistant for the billing team of a large company. " * 2  # > 64 characters


def config(strategy: str = "prefix_affinity", routing: str = "{}") -> Any:
    backends = "".join(f'  - {{name: {n}, engine: vllm, url: "http://{n}.test"}}\n' for n in NAMES)
    deps = "".join(f"      - {{backend: {n}, model: upstream-model, format: safetensors}}\n" for n in NAMES)
    return make_config(
        f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
routing: {routing}
backends:
{backends}models:
  - name: sticky
    strategy: {strategy}
    affinity: {{prefix_chars: {PREFIX_CHARS}}}
    deployments:
{deps}"""
    )


def engines() -> FakeUpstream:
    return FakeUpstream(
        {
            ("POST", "/v1/chat/completions"): FakeAnswer.json(
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion",
                    "created": 1,
                    "model": "upstream-model",
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
                }
            )
        }
    )


def chat(*contents: str) -> dict[str, Any]:
    roles = ["system", "user", "assistant", "user"]
    return {"model": "sticky", "messages": [{"role": roles[i % 4], "content": c} for i, c in enumerate(contents)]}


def served(rs: list[httpx.Response], up: FakeUpstream) -> list[str]:
    """The backend of each answer, checked against the engine that was called for it."""
    assert [r.status_code for r in rs] == [200] * len(rs), [r.text for r in rs if r.status_code != 200]
    names = [r.headers["x-gateway-backend"] for r in rs]
    called = [str(urlsplit(c.url).hostname).removesuffix(".test") for c in up.calls]
    assert called == names
    return names


def test_the_session_header_is_x_session_id_by_default() -> None:
    assert RoutingConfig().session_header == "x-session-id"
    assert config().routing.session_header == "x-session-id"


async def test_requests_of_one_session_land_on_one_backend_whatever_their_prompts() -> None:
    up = engines()
    sessions = [f"session-{i}" for i in range(6)]  # not a multiple of 4: rotation cannot mimic affinity
    async with gateway_client(config(), upstream=up) as (client, _):
        rs = [
            await client.post(
                "/v1/chat/completions",
                json=chat(f"question {k} of {s}: " + "x" * k * 50),  # a different prompt every time
                headers={"x-session-id": s},
            )
            for k in range(5)
            for s in sessions
        ]
    by_session: dict[str, set[str]] = {}
    for r, name in zip(rs, served(rs, up), strict=True):
        by_session.setdefault(r.request.headers["x-session-id"], set()).add(name)
    assert all(len(backends) == 1 for backends in by_session.values()), by_session
    # and the sessions are spread: not everything on one backend
    assert len({next(iter(b)) for b in by_session.values()}) > 1, by_session


async def test_the_same_session_sticks_even_when_its_prompt_prefix_changes_and_others_prefixes_do_not_matter() -> None:
    up = engines()
    async with gateway_client(config(), upstream=up) as (client, _):
        rs = [
            await client.post("/v1/chat/completions", json=chat(f"{i} " * 40), headers={"x-session-id": "conv-42"})
            for i in range(12)
        ]
    assert len(set(served(rs, up))) == 1


async def test_without_the_header_the_same_long_prompt_prefix_lands_on_the_same_backend() -> None:
    up = engines()
    async with gateway_client(config(), upstream=up) as (client, _):
        # the first 64 characters (the system prompt) are the same; what follows differs every time
        rs = [await client.post("/v1/chat/completions", json=chat(SYSTEM, f"user question {i}")) for i in range(12)]
        tail = [
            await client.post("/v1/chat/completions", json=chat(SYSTEM + f" variant {i}", "same question"))
            for i in range(6)
        ]
    names = served(rs + tail, up)
    assert len(set(names)) == 1, Counter(names)  # past prefix_chars, differences do not move the request


async def test_without_the_header_different_prompt_prefixes_spread_over_several_backends() -> None:
    up = engines()
    async with gateway_client(config(), upstream=up) as (client, _):
        rs = []
        for i in range(8):
            prefix = f"Tenant {i} system prompt: answer in the voice of persona number {i}. " * 2
            for k in range(3):  # three requests per prefix, each must land where the first did
                rs.append(await client.post("/v1/chat/completions", json=chat(prefix, f"question {k}")))
    names = served(rs, up)
    per_prefix = [set(names[i : i + 3]) for i in range(0, len(names), 3)]
    assert all(len(s) == 1 for s in per_prefix), per_prefix
    assert len({next(iter(s)) for s in per_prefix}) > 1, per_prefix


async def test_the_configured_session_header_is_the_one_that_counts() -> None:
    up = engines()
    cfg = config(routing="{session_header: X-Conversation}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        # same conversation, different prompts and different x-session-id values: one backend
        rs = [
            await client.post(
                "/v1/chat/completions",
                json=chat(f"prompt {i} " * 20),
                headers={"x-conversation": "c-7", "x-session-id": f"ignored-{i}"},
            )
            for i in range(10)
        ]
    assert len(set(served(rs, up))) == 1


async def test_least_load_ignores_sessions_and_spreads_the_same_session() -> None:
    """The control: the affinity above comes from the strategy, not from chance or ordering."""
    up = engines()
    async with gateway_client(config(strategy="least_load"), upstream=up) as (client, _):
        rs = [
            await client.post("/v1/chat/completions", json=chat(SYSTEM, "same"), headers={"x-session-id": "s"})
            for _ in range(8)
        ]
    assert set(served(rs, up)) == set(NAMES)
