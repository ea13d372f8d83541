"""The x-ratelimit-* headers through HTTP: a streamed answer carries the same quota headers as a whole
answer (limit, remaining, reset for requests and tokens), the remaining counts go down across
requests of one key (tokens settled with the engine's real usage), and a 429 from the key's limits
carries them too, with Retry-After, before any engine is asked.

Token arithmetic: a chat request reserves its prompt estimate plus max_tokens. The estimate for one
message "hello" is (16 + 5) // 4 + 1 = 6, so max_tokens 100 reserves 106; when the request ends, the
reservation is settled with the engine's usage (7 total tokens in the answers below).
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import orjson
import pytest

from tests.conftest import ONE_BACKEND, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, refused

ENGINE_CHAT = "http://engine-a.test/v1/chat/completions"
CHAT = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 100}
RESERVED = 6 + 100  # prompt estimate + max_tokens
USED = 7  # the engine's usage.total_tokens in both answers
QUOTA_HEADERS = [
    f"x-ratelimit-{what}-{dim}" for what in ("limit", "remaining", "reset") for dim in ("requests", "tokens")
]


def limited(limits: str) -> Any:
    return make_config(
        ONE_BACKEND.replace(
            '{name: alice, sha256: "${ALICE_SHA}"}', f'{{name: alice, sha256: "${{ALICE_SHA}}", limits: {limits}}}'
        )
    )


def whole() -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "upstream-model",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": USED},
        }
    )


def streamed() -> FakeAnswer:
    def ev(obj: dict[str, Any]) -> bytes:
        return b"data: " + orjson.dumps(obj) + b"\n\n"

    head = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "upstream-model"}
    return FakeAnswer.sse(
        ev({**head, "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}),
        ev({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ev({**head, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": USED}}),
        b"data: [DONE]\n\n",
    )


def engine(stream: bool) -> FakeUpstream:
    return FakeUpstream({("POST", ENGINE_CHAT): streamed() if stream else whole()})


def reset_seconds(value: str) -> float:
    """OpenAI's reset format ("1m0s", "59.9s", "250ms") in seconds."""
    m = re.fullmatch(r"(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?|(\d+)ms", value)
    assert m is not None and value, f"not a reset value: {value!r}"
    if m.group(3) is not None:
        return int(m.group(3)) / 1000
    return int(m.group(1) or 0) * 60 + float(m.group(2) or 0)


def quota(r: httpx.Response) -> dict[str, Any]:
    missing = [h for h in QUOTA_HEADERS if h not in r.headers]
    assert not missing, f"missing {missing} in {dict(r.headers)}"
    return {
        "limit-requests": int(r.headers["x-ratelimit-limit-requests"]),
        "remaining-requests": int(r.headers["x-ratelimit-remaining-requests"]),
        "limit-tokens": int(r.headers["x-ratelimit-limit-tokens"]),
        "remaining-tokens": int(r.headers["x-ratelimit-remaining-tokens"]),
    }


def assert_resets_within_the_window(r: httpx.Response) -> None:
    for dim in ("requests", "tokens"):
        s = reset_seconds(r.headers[f"x-ratelimit-reset-{dim}"])
        assert 50.0 < s <= 60.0, (dim, r.headers[f"x-ratelimit-reset-{dim}"])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_quota_headers_count_down_across_requests_on_streamed_and_whole_answers(stream: bool) -> None:
    cfg = limited("{rpm: 5, tpm: 10000}")
    up = engine(stream)
    async with gateway_client(cfg, upstream=up) as (client, _):
        rs = [await client.post("/v1/chat/completions", json={**CHAT, "stream": stream}) for _ in range(3)]
    assert [r.status_code for r in rs] == [200, 200, 200], rs[-1].text
    if stream:
        assert all(r.headers["content-type"].startswith("text/event-stream") for r in rs)
        assert all(r.text.rstrip().endswith("data: [DONE]") for r in rs)
    # each request takes one of 5 requests and reserves 106 tokens; the earlier ones were settled at 7
    assert [quota(r) for r in rs] == [
        {"limit-requests": 5, "remaining-requests": 4, "limit-tokens": 10000, "remaining-tokens": 10000 - RESERVED},
        {
            "limit-requests": 5,
            "remaining-requests": 3,
            "limit-tokens": 10000,
            "remaining-tokens": 10000 - USED - RESERVED,
        },
        {
            "limit-requests": 5,
            "remaining-requests": 2,
            "limit-tokens": 10000,
            "remaining-tokens": 10000 - 2 * USED - RESERVED,
        },
    ]
    for r in rs:
        assert_resets_within_the_window(r)
        assert r.headers["x-gateway-backend"] == "engine-a"
    assert len(up.calls_to(ENGINE_CHAT)) == 3


async def test_streamed_and_whole_answers_of_one_key_share_the_same_counters() -> None:
    cfg = limited("{rpm: 4, tpm: 1000}")
    up = FakeUpstream({("POST", ENGINE_CHAT): [streamed(), whole(), streamed()]})
    async with gateway_client(cfg, upstream=up) as (client, _):
        s1 = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        w = await client.post("/v1/chat/completions", json=CHAT)
        s2 = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert [quota(r)["remaining-requests"] for r in (s1, w, s2)] == [3, 2, 1]
    assert [quota(r)["remaining-tokens"] for r in (s1, w, s2)] == [
        1000 - RESERVED,
        1000 - USED - RESERVED,
        1000 - 2 * USED - RESERVED,
    ]


async def test_the_requests_429_carries_the_quota_headers_and_retry_after_and_no_engine_is_asked() -> None:
    cfg = limited("{rpm: 2, tpm: 10000}")
    up = engine(stream=True)
    async with gateway_client(cfg, upstream=up) as (client, _):
        ok = [await client.post("/v1/chat/completions", json={**CHAT, "stream": True}) for _ in range(2)]
        refused_stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        refused_whole = await client.post("/v1/chat/completions", json=CHAT)
    assert [r.status_code for r in ok] == [200, 200]
    assert [quota(r)["remaining-requests"] for r in ok] == [1, 0]
    for r in (refused_stream, refused_whole):
        assert r.status_code == 429, r.text
        assert r.headers["content-type"] == "application/json"  # an error before any stream starts
        err = r.json()["error"]
        assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
        assert err["message"].startswith("Rate limit reached for requests: 2 per minute (key 'alice')")
        assert quota(r) == {
            "limit-requests": 2,
            "remaining-requests": 0,
            "limit-tokens": 10000,
            "remaining-tokens": 10000 - 2 * USED,
        }
        retry_after = int(r.headers["retry-after"])
        assert 50 <= retry_after <= 60  # the first request leaves the 60 s window then
        assert err["message"].endswith(f"Retry after {retry_after}s.")
        assert 50.0 < reset_seconds(r.headers["x-ratelimit-reset-requests"]) <= 60.0
    assert len(up.calls_to(ENGINE_CHAT)) == 2


async def test_the_tokens_429_names_tokens_and_carries_the_quota_headers() -> None:
    cfg = limited("{rpm: 100, tpm: 150}")
    up = engine(stream=True)
    async with gateway_client(cfg, upstream=up) as (client, _):
        first = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})  # 106 reserved, 7 used
        second = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})  # 7 + 106 <= 150
        third = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})  # 14 + 106 <= 150
        over = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": True, "max_tokens": 140}
        )  # 21 + 146 > 150
    assert [quota(r)["remaining-tokens"] for r in (first, second, third)] == [44, 37, 30]
    assert over.status_code == 429, over.text
    err = over.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "tokens"
    assert err["message"].startswith("Rate limit reached for tokens: 150 per minute, 129 left")
    assert quota(over) == {
        "limit-requests": 100,
        "remaining-requests": 97,
        "limit-tokens": 150,
        "remaining-tokens": 129,
    }
    assert 1 <= int(over.headers["retry-after"]) <= 60
    assert len(up.calls_to(ENGINE_CHAT)) == 3


async def test_a_stream_that_fails_before_its_first_byte_carries_the_quota_headers_and_gives_its_tokens_back() -> None:
    cfg = limited("{rpm: 5, tpm: 1000}")
    up = FakeUpstream({("POST", ENGINE_CHAT): [refused(), streamed()]})
    async with gateway_client(cfg, upstream=up) as (client, app):
        failed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        app.gw.runtime.table.backends["engine-a"].state = "ready"  # the refusal marked it down; a probe would revive it
        ok = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "upstream_unreachable"
    assert quota(failed) == {
        "limit-requests": 5,
        "remaining-requests": 4,
        "limit-tokens": 1000,
        "remaining-tokens": 1000 - RESERVED,
    }
    assert ok.status_code == 200 and ok.headers["content-type"].startswith("text/event-stream")
    # the failed request counted as a request, but its 106 reserved tokens were given back (settled at 0)
    assert quota(ok) == {
        "limit-requests": 5,
        "remaining-requests": 3,
        "limit-tokens": 1000,
        "remaining-tokens": 1000 - RESERVED,
    }
