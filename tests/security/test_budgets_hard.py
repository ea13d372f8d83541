"""Budgets and limits that hold against a hostile tenant (issue 34; ../shared/redteam-2026-12-04.md H1, M4,
L1, L2), in-process: the gateway over ASGI, engines played at the upstream seam (FakeUpstream), so that
what the engine is asked for, and what an engine that ignores it does, can be seen exactly.

- H1: the reservation is what a request may spend. The engine is held to it (`max_tokens`, per choice, in
  the field its adapter reads: both OpenAI names, Ollama's `num_predict`, Anthropic's own body), a request
  without `max_tokens` included; `max_completion_tokens: null` is absent; `n` multiplies the reservation;
  a budget with less room grants less; and a stream that goes past its reservation anyway (an engine that
  ignores `max_tokens`) is ended there with finish reason `length`.
- M4: token counting counts against rpm.
- L1: a key named like another key's per-model scope shares nothing with it.
- L2: requests refused before admission (unknown model, bad body) count against rpm.
The same reproductions against real processes (an engine emulator, restarts, Redis) are in
test_budgets_process.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import orjson
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.access.memory import MemoryStore, spend_of
from llm_gateway.access.store import COST_UNITS, ScopeLimits, Shrink, period_of
from tests.conftest import TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

ENGINE = "http://engine-a.test"
CHAT_URL = ENGINE + "/v1/chat/completions"
OTHER_KEY = "sk-test-colliding-0123456789"

CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}", limits: {limits}}}
usage: {{ledger: true}}
backends:
  - name: engine-a
    engine: {engine}
    url: http://engine-a.test
    timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 5, total_s: 20}}
models:
  - name: alpha-8b
    deployments:
      - {{backend: engine-a, model: tiny, format: {fmt}, capabilities: [chat, completions]}}
"""


def config(limits: str, engine: str = "vllm") -> Any:
    fmt = "gguf" if engine == "ollama" else "safetensors"
    return make_config(CONFIG.format(limits=limits, engine=engine, fmt=fmt))


def chat_answer(completion: int, choices: int = 1) -> FakeAnswer:
    return FakeAnswer.json(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "tiny",
            "choices": [
                {"index": i, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
                for i in range(choices)
            ],
            "usage": {"prompt_tokens": 2, "completion_tokens": completion, "total_tokens": 2 + completion},
        }
    )


HI = [{"role": "user", "content": "hi"}]  # a prompt the gateway estimates at 5 tokens (16 + 2 characters, / 4, + 1)
PROMPT = 5


def sent(up: FakeUpstream, url: str = CHAT_URL) -> dict[str, Any]:
    calls = up.calls_to(url)
    assert calls, f"the engine was never asked at {url}"
    body: dict[str, Any] = calls[-1].json()
    return body


# -- H1: what the engine is asked for ----------------------------------------------------------------


async def test_a_request_without_max_tokens_is_held_to_its_reservation():
    """Reproduction: no max_tokens, a 6,000-token budget: the engine generated up to its own limit (3,000)."""
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(10)})
    cfg = config("{budget: {tokens: 6000}, concurrency: 4}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={"model": "alpha-8b", "messages": HI})
    assert r.status_code == 200, r.text
    body = sent(up)
    # the default reservation (limits.default_max_tokens), under both names the engines read
    assert (body["max_tokens"], body["max_completion_tokens"]) == (1024, 1024)
    assert r.headers["x-ratelimit-remaining-budget-tokens"] == str(6000 - PROMPT - 1024)


async def test_a_null_max_completion_tokens_beside_max_tokens_reserves_max_tokens():
    """Reproduction: `"max_completion_tokens": null, "max_tokens": 2000` reserved 1,032 and spent 2,008."""
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(2000)})
    cfg = config("{budget: {tokens: 100000}}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "alpha-8b", "messages": HI, "max_completion_tokens": None, "max_tokens": 2000},
        )
    assert r.status_code == 200, r.text
    assert r.headers["x-ratelimit-remaining-budget-tokens"] == str(100000 - PROMPT - 2000)  # reserved what it may use
    body = sent(up)
    assert (body["max_tokens"], body["max_completion_tokens"]) == (2000, 2000)


async def test_n_choices_are_reserved_n_times_and_cut_to_what_the_budget_holds():
    """Reproduction: max_tokens 1000 and n 8 reserved 1,008 against a 3,000 budget and tpm; vLLM generates
    8,000. Now 8 choices of 1,000 do not fit: the request gets the whole tokens per choice that do."""
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(8 * 374, 8)})
    cfg = config("{budget: {tokens: 3000}, tpm: 3000}")
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={"model": "alpha-8b", "messages": HI, "max_tokens": 1000, "n": 8}
        )
        assert r.status_code == 200, r.text
        assert sent(up)["max_tokens"] == (3000 - PROMPT) // 8 == 374  # per choice: 8 x 374 + 5 <= 3000
        # the budget is spent to within a choice's rounding: not even one token per choice is left for 8 more
        again = await client.post("/v1/chat/completions", json={"model": "alpha-8b", "messages": HI, "n": 8})
    assert again.status_code == 429 and again.json()["error"]["code"] == "insufficient_quota"
    assert len(up.calls_to(CHAT_URL)) == 1


async def test_a_tpm_key_is_held_to_its_reservation_too():
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(10)})
    async with gateway_client(config("{tpm: 100000}"), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={"model": "alpha-8b", "messages": HI, "n": 3})
    assert r.status_code == 200, r.text
    assert sent(up)["max_tokens"] == 1024
    assert r.headers["x-ratelimit-remaining-tokens"] == str(100000 - PROMPT - 3 * 1024)


async def test_a_key_without_token_limits_is_not_rewritten():
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(10)})
    async with gateway_client(config("{rpm: 100}"), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={"model": "alpha-8b", "messages": HI})
    assert r.status_code == 200, r.text
    assert "max_tokens" not in sent(up)


async def test_ollama_is_held_through_num_predict():
    url = ENGINE + "/api/chat"
    answer = {
        "model": "tiny",
        "created_at": "2026-12-04T00:00:00Z",
        "message": {"role": "assistant", "content": "x"},
        "done": True,
        "done_reason": "length",
        "prompt_eval_count": 2,
        "eval_count": 7,
    }
    up = FakeUpstream({("POST", url): FakeAnswer.json(answer)})
    async with gateway_client(config("{budget: {tokens: 50}}", engine="ollama"), upstream=up) as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={"model": "alpha-8b", "messages": HI, "max_completion_tokens": 4096}
        )
    assert r.status_code == 200, r.text
    assert sent(up, url)["options"]["num_predict"] == 50 - PROMPT


async def test_messages_and_responses_are_held_in_the_body_the_engine_gets():
    native = ENGINE + "/v1/messages"
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "tiny",
        "content": [{"type": "text", "text": "x"}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": 2, "output_tokens": 3},
    }
    up = FakeUpstream({("POST", native): FakeAnswer.json(message), ("POST", CHAT_URL): chat_answer(3)})
    async with gateway_client(config("{budget: {tokens: 300}}"), upstream=up) as (client, _):
        m = await client.post(
            "/v1/messages",
            json={"model": "alpha-8b", "max_tokens": 100000, "messages": HI},
            headers={"x-api-key": TEST_KEY},
        )
        assert m.status_code == 200, m.text
        assert sent(up, native)["max_tokens"] == 300 - PROMPT  # vLLM serves Messages itself: its own body is held
        r = await client.post("/v1/responses", json={"model": "alpha-8b", "input": "hi", "store": False})
        assert r.status_code == 200, r.text
    # what is left after the first settled at 5 tokens: the estimate of "hi" as one input item, and the rest
    assert 0 < sent(up)["max_tokens"] <= 300 - 5 - PROMPT


# -- H1: an engine that ignores max_tokens ---------------------------------------------------------------


def _token(i: int) -> bytes:
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "tiny",
        "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def _events(raw: bytes) -> list[Any]:
    out = []
    for block in raw.split(b"\n\n"):
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            out.append(orjson.loads(block[6:]))
    return out


@pytest.mark.parametrize("client_usage", [False, True])
async def test_a_stream_past_its_reservation_ends_there_with_finish_reason_length(client_usage: bool):
    """An engine that ignores max_tokens streams on (here 200 tokens, never finishing by itself): the client
    gets what was reserved, then finish_reason length and [DONE]; the engine's stream is closed, not drained."""
    up = FakeUpstream({("POST", CHAT_URL): FakeAnswer.sse(*(_token(i) for i in range(200)))})
    body: dict[str, Any] = {"model": "alpha-8b", "messages": HI, "max_tokens": 8, "stream": True}
    if client_usage:
        body["stream_options"] = {"include_usage": True}
    async with gateway_client(config("{budget: {tokens: 1000}}"), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        events = _events(r.content)
        after = await client.post("/v1/chat/completions", json={"model": "alpha-8b", "messages": HI, "max_tokens": 1})
    assert r.content.endswith(b"data: [DONE]\n\n")
    content = [e for e in events if e["choices"] and e["choices"][0].get("delta", {}).get("content")]
    assert 8 <= len(content) < 12, len(content)  # the reservation, and at most what arrived with the last chunk
    ends = [c["finish_reason"] for e in events for c in e["choices"] if c.get("finish_reason")]
    assert ends == ["length"]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == (1 if client_usage else 0)
    # billed what was relayed (estimated), not the 200 the engine would have gone on to send
    spent = 1000 - int(after.headers["x-ratelimit-remaining-budget-tokens"]) - (PROMPT + 1)
    assert PROMPT + 8 <= spent <= PROMPT + 12, spent


async def test_a_native_messages_stream_past_its_reservation_ends_as_anthropic_ends_one_at_max_tokens():
    native = ENGINE + "/v1/messages"

    def ev(name: str, obj: dict[str, Any]) -> bytes:
        return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"

    start = {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "tiny",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 2, "output_tokens": 0},
        },
    }
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    deltas = [
        ev(
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ab "}},
        )
        for _ in range(100)
    ]
    up = FakeUpstream(
        {("POST", native): FakeAnswer.sse(ev("message_start", start), ev("content_block_start", block), *deltas)}
    )
    async with gateway_client(config("{budget: {tokens: 1000}}"), upstream=up) as (client, _):
        r = await client.post(
            "/v1/messages",
            json={"model": "alpha-8b", "max_tokens": 6, "messages": HI, "stream": True},
            headers={"x-api-key": TEST_KEY},
        )
    assert r.status_code == 200, r.text
    names = [line[7:] for line in r.text.splitlines() if line.startswith("event: ")]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names[-5:]
    assert 6 <= names.count("content_block_delta") < 10
    delta = next(orjson.loads(b[b.index(b"data: ") + 6 :]) for b in r.content.split(b"\n\n") if b"message_delta" in b)
    assert delta["delta"]["stop_reason"] == "max_tokens"


# -- M4: token counting counts against rpm -------------------------------------------------------------


async def test_count_tokens_and_input_tokens_count_against_rpm_even_with_a_spent_budget():
    """Reproduction: a key with a spent budget and rpm 40 had 45 of 45 count_tokens calls answered by the
    engine's tokenizer. They generate nothing (no tokens charged), but each one is a request."""
    up = FakeUpstream(
        {
            ("POST", ENGINE + "/v1/messages/count_tokens"): FakeAnswer.json({"input_tokens": 3}),
            ("POST", ENGINE + "/tokenize"): FakeAnswer.json({"count": 3, "max_model_len": 4096, "tokens": [1, 2, 3]}),
        }
    )
    cfg = config("{rpm: 4, budget: {tokens: 3}}")  # a budget no generation fits in: counting needs none
    async with gateway_client(cfg, upstream=up) as (client, _):
        statuses = []
        for i in range(6):
            if i % 2:
                r = await client.post("/v1/responses/input_tokens", json={"model": "alpha-8b", "input": "hi"})
            else:
                r = await client.post(
                    "/v1/messages/count_tokens",
                    json={"model": "alpha-8b", "messages": HI},
                    headers={"x-api-key": TEST_KEY},
                )
            statuses.append(r.status_code)
    assert statuses == [200, 200, 200, 200, 429, 429]
    engine_calls = len(up.calls_to("/v1/messages/count_tokens")) + len(up.calls_to("/tokenize"))
    assert engine_calls == 4


# -- L1: scopes that cannot collide ------------------------------------------------------------------


async def test_a_key_named_like_another_keys_model_scope_shares_none_of_its_limits():
    """Reproduction: key `ml` (alpha-8b at 3 rpm) and key `ml:m:alpha-8b` (1,000 rpm): three requests of the
    second used up the first's per-model minute."""
    text = CONFIG.format(limits="{rpm: 100}", engine="vllm", fmt="safetensors").replace(
        '{name: alice, sha256: "${ALICE_SHA}", limits: {rpm: 100}}',
        '{name: ml, sha256: "${ALICE_SHA}", limits: {rpm: 100}, model_limits: {"alpha-8b": {rpm: 3}}}\n'
        f'    - {{name: "ml:m:alpha-8b", sha256: "{digest_of(OTHER_KEY)}", limits: {{rpm: 1000}}}}',
    )
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(1)})
    chat = {"model": "alpha-8b", "messages": HI, "max_tokens": 1}
    async with gateway_client(make_config(text), upstream=up) as (client, _):
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
        other = {"authorization": f"Bearer {OTHER_KEY}"}
        assert [
            (await client.post("/v1/chat/completions", json=chat, headers=other)).status_code for _ in range(3)
        ] == [200] * 3
        assert [(await client.post("/v1/chat/completions", json=chat)).status_code for _ in range(3)] == [200, 200, 429]


# -- L2: refusals before admission are metered ----------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"model": "nope", "messages": HI},  # 404: no such model
        {"model": "alpha-8b", "messages": "not a list"},  # 400: a bad body
        {"model": "alpha-8b"},  # 400: no messages
    ],
    ids=["unknown-model", "bad-messages", "missing-messages"],
)
async def test_bad_requests_count_against_rpm_and_are_limited_once_it_is_spent(bad: dict[str, Any]):
    """Reproduction: a key at 2 rpm with its minute spent still got 40 x 404 (each a ledger row)."""
    up = FakeUpstream({("POST", CHAT_URL): chat_answer(1)})
    chat = {"model": "alpha-8b", "messages": HI, "max_tokens": 1}
    async with gateway_client(config("{rpm: 3}"), upstream=up) as (client, _):
        first = [(await client.post("/v1/chat/completions", json=bad)).status_code for _ in range(2)]
        ok = await client.post("/v1/chat/completions", json=chat)  # the third request of the minute
        flood = [await client.post("/v1/chat/completions", json=bad) for _ in range(10)]
        valid = await client.post("/v1/chat/completions", json=chat)
    assert all(400 <= s < 500 and s != 429 for s in first), first
    assert ok.status_code == 200
    assert {r.status_code for r in flood} == {429}
    assert flood[0].json()["error"]["type"] == "requests" and "retry-after" in flood[0].headers
    assert valid.status_code == 429
    assert len(up.calls_to(CHAT_URL)) == 1


async def test_a_forbidden_model_counts_against_rpm_on_the_anthropic_route_in_its_envelope():
    text = CONFIG.format(limits="{rpm: 1}", engine="vllm", fmt="safetensors").replace(
        "limits: {rpm: 1}}", 'limits: {rpm: 1}, models: ["beta*"]}'
    )
    async with gateway_client(make_config(text)) as (client, _):
        rs = [
            await client.post(
                "/v1/messages",
                json={"model": "alpha-8b", "max_tokens": 5, "messages": HI},
                headers={"x-api-key": TEST_KEY},
            )
            for _ in range(3)
        ]
    assert [r.status_code for r in rs] == [403, 429, 429]
    assert rs[1].json()["type"] == "error" and rs[1].json()["error"]["type"] == "rate_limit_error"


# -- the stores' arithmetic ------------------------------------------------------------------------------


def test_a_budget_grants_whole_tokens_per_choice_in_tokens_and_in_cost():
    now = 1_800_000_000.0
    store = MemoryStore(wall=lambda: now)
    both = ScopeLimits("k:a", None, None, None, 3600.0, 1000, 10 * COST_UNITS)
    # 10 + 4 x 300 asked; 1,000 tokens: 10 + 4 x 247 granted
    d, res = store.reserve_now("r", [both], 1210, 0, Shrink(10, 4, 0, 0.0))
    assert d.allowed and res.tokens == 10 + 4 * 247
    # cost alone: 1 unit of currency a token of output, 10 of which are left, the prompt costing 2: 8 tokens
    cost = ScopeLimits("k:b", None, None, None, 3600.0, None, 10 * COST_UNITS)
    d, res = store.reserve_now("r", [cost], 105, 100 * COST_UNITS, Shrink(5, 1, 2 * COST_UNITS, float(COST_UNITS)))
    assert d.allowed and (res.tokens, res.cost) == (5 + 8, 10 * COST_UNITS)
    d, _ = store.reserve_now("r", [cost], 105, 100 * COST_UNITS, Shrink(5, 1, 2 * COST_UNITS, float(COST_UNITS)))
    assert not d.allowed and d.kind == "budget"
    # what the ledger says was spent today is where a restarted memory store starts
    today = dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%d")
    spend = spend_of(
        [("a", "m", today, 100, 200), ("a", "other", today, 1, 1), ("a", "m", "2000-01-01", 9, 9)], {}, now
    )
    assert spend[("k:a", period_of("day", now)[0])] == (302, 0)
    assert spend[("k:a@m:m", period_of("day", now)[0])] == (300, 0)
    fresh = MemoryStore(wall=lambda: now)
    fresh.restore(spend)
    left = ScopeLimits("k:a", None, None, None, 3600.0, 1000)
    d, res = fresh.reserve_now("r", [left], 2000, 0, Shrink(10))
    assert d.allowed and res.tokens == 1000 - 302
