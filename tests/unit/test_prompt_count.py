"""Exact prompt counts where a window is ambiguous (llm_gateway/routing/prompt_count.py): the upper bound of a
chat prompt, the engine's count deciding a request between the bounds (routing it, or refusing it with
the count), no count far from every window, the cache (hits, its bound), and the fall back to the lower
bound when the engine cannot count. Engines are played at the upstream seam (tests/unit/test_context_windows
has the config: vLLM windows 2,048 `small` and 32,768 `big`, llama-server 4,096)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llm_gateway.observability.metrics import Metrics
from llm_gateway.routing.gathered import CEILING_BASE, CEILING_PER_IMAGE, CEILING_PER_MESSAGE, CEILING_TOOLS
from llm_gateway.routing.prompt_count import PromptCounter, ambiguous_routes
from llm_gateway.routing.request_info import read_request
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, refused
from tests.unit.test_context_windows import CONFIG, chat, chat_answer, engines, posted, probed

SMALL_TOKENIZE = "http://small.test/tokenize"


def counting(count: int | FakeAnswer | BaseException, *, on: str = "small") -> FakeUpstream:
    """The engines, `on`'s /tokenize answering `count` (vLLM's shape) or the given answer."""
    up = engines()
    answer = FakeAnswer.json({"count": count, "max_model_len": 1, "tokens": []}) if isinstance(count, int) else count
    up.route("POST", f"http://{on}.test/tokenize", answer)
    return up


def counts(app: Any) -> dict[str, float]:
    m = app.gw.metrics.prompt_counts
    return {r: m.labels(r)._value.get() for r in ("counted", "cached", "failed")}


# -- the upper bound -----------------------------------------------------------------------------------


def test_the_ceiling_is_every_byte_a_token_plus_the_templates_allowances() -> None:
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "字" * 100}]
    r = read_request("chat", {"model": "m", "messages": msgs})
    assert r.prompt_ceiling == CEILING_BASE + 2 * CEILING_PER_MESSAGE + 8 + 300
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f"}}]}
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/i.png"}}]}
    t = read_request("chat", {"model": "m", "messages": [*msgs, call, image], "tools": tools})
    extra = CEILING_TOOLS + len(orjson.dumps(tools)) + len(orjson.dumps(call["tool_calls"])) + CEILING_PER_IMAGE
    assert t.prompt_ceiling == r.prompt_ceiling + 2 * CEILING_PER_MESSAGE + extra
    assert r.prompt_floor < r.prompt_ceiling


def test_only_chat_has_a_ceiling_and_a_prompt_the_engine_cuts_has_none() -> None:
    assert read_request("completions", {"model": "m", "prompt": "x" * 9000}).prompt_ceiling is None
    assert read_request("embeddings", {"model": "m", "input": "x" * 9000}).prompt_ceiling is None
    body = chat("m", 9000, truncate_prompt_tokens=100)
    assert read_request("chat", body).prompt_ceiling is None


# -- the ambiguous zone ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine_count", "lands_on"), [(3000, "big"), (1000, "small")])
async def test_between_the_bounds_the_engines_count_decides_the_route(engine_count: int, lands_on: str) -> None:
    # 12,000 bytes: floor 1,500 fits small's 2,048, ceiling ~12,300 does not: the engine counts
    up = counting(engine_count)
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("two", 12_000))
        got = counts(app)
    assert (r.status_code, r.headers["x-gateway-backend"]) == (200, lands_on)
    # counted on the ambiguous deployment's own engine, the generation on the one it fits
    assert posted(up) == [SMALL_TOKENIZE, f"http://{lands_on}.test/v1/chat/completions"]
    assert up.calls_to(SMALL_TOKENIZE)[0].json()["messages"] == chat("two", 12_000)["messages"]
    assert got == {"counted": 1, "cached": 0, "failed": 0}


async def test_an_exact_count_over_every_window_is_400_naming_the_window_and_the_count() -> None:
    up = counting(2100)
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("small-only", 12_000, stream=True))
        with_out = await client.post("/v1/chat/completions", json=chat("small-only", 12_000, max_tokens=100))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("context_length_exceeded", "messages")
    assert "2048 tokens" in err["message"] and "needs 2100 tokens" in err["message"]
    assert "engine's own tokenizer" in err["message"]
    assert "needs 2200 tokens (2100 of prompt and max_tokens 100)" in with_out.json()["error"]["message"]
    assert posted(up) == [SMALL_TOKENIZE]  # counted once (cached for the second), never generated


async def test_llama_server_counts_with_its_template_and_tokenizer() -> None:
    up = engines()
    up.route("POST", "http://llama.test/apply-template", FakeAnswer.json({"prompt": "<|im_start|>user ..."}))
    up.route("POST", "http://llama.test/tokenize", FakeAnswer.json({"tokens": list(range(5000))}))
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("llama", 20_000))  # floor 2,500 fits 4,096
    assert r.status_code == 400 and "needs 5000 tokens" in r.json()["error"]["message"]
    assert posted(up) == ["http://llama.test/apply-template", "http://llama.test/tokenize"]


async def test_far_from_every_window_nothing_is_counted() -> None:
    up = counting(1)
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        short = await client.post("/v1/chat/completions", json=chat("two", 800))  # ceiling ~1,100 < 2,048
        # floor 3,750 > 2,048 and ceiling ~30,300 < 32,768: the bounds decide both windows
        long = await client.post("/v1/chat/completions", json=chat("two", 30_000, max_tokens=10))
        got = counts(app)
    assert short.headers["x-gateway-backend"] == "small" and long.headers["x-gateway-backend"] == "big"
    assert not up.calls_to(SMALL_TOKENIZE) and not up.calls_to("http://big.test/tokenize")
    assert got == {"counted": 0, "cached": 0, "failed": 0}
    info = read_request("chat", chat("two", 800))
    assert ambiguous_routes(app.gw.runtime.table, app.gw.runtime.table.resolve("two"), info) == []


async def test_a_model_whose_engines_cannot_count_is_decided_on_the_floor_without_hashing() -> None:
    cfg = """
server: {access_log: false}
auth: {mode: none}
backends: [{name: tabby, engine: tabbyapi, url: "http://tabby.test"}]
models: [{name: t, deployments: [{backend: tabby, model: up, format: exl2, context_length: 1000}]}]
"""
    up = engines()
    up.route("POST", "http://tabby.test/v1/chat/completions", chat_answer())
    async with gateway_client(make_config(cfg), upstream=up) as (client, app):
        table = app.gw.runtime.table
        info = read_request("chat", chat("t", 4000))  # floor 500 fits 1,000, the ceiling does not
        assert info.prompt_floor < 1000 < (info.prompt_ceiling or 0)
        assert ambiguous_routes(table, table.resolve("t"), info) == []
        r = await client.post("/v1/chat/completions", json=chat("t", 4000))
        got = counts(app)
    assert r.status_code == 200 and posted(up) == ["http://tabby.test/v1/chat/completions"]
    assert got == {"counted": 0, "cached": 0, "failed": 0}


# -- the cache -------------------------------------------------------------------------------------------


async def test_the_same_prompt_is_counted_once_and_another_prompt_again() -> None:
    up = counting(3000)
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        for _ in range(3):  # a different max_tokens or stream flag is the same prompt
            r = await client.post("/v1/chat/completions", json=chat("two", 12_000, max_tokens=5))
            assert r.headers["x-gateway-backend"] == "big"
        other = await client.post("/v1/chat/completions", json=chat("two", 12_001))
        got = counts(app)
    assert other.headers["x-gateway-backend"] == "big"
    assert len(up.calls_to(SMALL_TOKENIZE)) == 2
    assert got == {"counted": 2, "cached": 2, "failed": 0}


async def test_the_cache_keeps_only_the_most_recent_prompts() -> None:
    up = counting(3000)
    async with gateway_client(make_config(CONFIG), upstream=up) as (_client, app):
        await probed(app, up)
        table = app.gw.runtime.table
        route = table.resolve("two")
        counter = PromptCounter(Metrics(), size=2)
        bodies = [chat("two", 12_000 + i) for i in range(3)]
        for body in [*bodies, bodies[2], bodies[0]]:  # the third evicts the first: it is counted again
            info = read_request("chat", body)
            await counter.settle(up, ambiguous_routes(table, route, info), body, info)
            assert info.prompt_exact == {"two": 3000}
    assert len(counter) == 2
    counted = [orjson.loads(c.body or b"")["messages"][0]["content"] for c in up.calls_to(SMALL_TOKENIZE)]
    assert [len(c) for c in counted] == [12_000, 12_001, 12_002, 12_000]


# -- counting fails: the lower bound decides ---------------------------------------------------------------


NO_ENDPOINT_ANSWER = FakeAnswer.json({"detail": "Not Found"}, status=404)


@pytest.mark.parametrize(
    "failure",
    [NO_ENDPOINT_ANSWER, FakeAnswer.json({"error": "boom"}, status=500), refused()],
    ids=["no-endpoint", "error", "refused"],
)
async def test_when_the_engine_cannot_count_the_floor_decides(failure: FakeAnswer | BaseException) -> None:
    up = counting(failure)
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        r = await client.post("/v1/chat/completions", json=chat("small-only", 12_000))
        again = await client.post("/v1/chat/completions", json=chat("small-only", 12_000))
        got = counts(app)
    assert r.status_code == 200 and again.status_code == 200  # the engine's to judge, as before
    assert posted(up).count("http://small.test/v1/chat/completions") == 2
    assert got == {"counted": 0, "cached": 0, "failed": 2}  # a failure is no count
    # an engine without the endpoint is not asked again for a while; a failing one is, on the next request
    assert len(up.calls_to(SMALL_TOKENIZE)) == (1 if failure is NO_ENDPOINT_ANSWER else 2)


async def test_a_count_that_takes_too_long_is_given_up() -> None:
    up = counting(FakeAnswer(200, {"content-type": "application/json"}, [b'{"count": 5000}'], delay_s=4.0))
    async with gateway_client(make_config(CONFIG), upstream=up) as (client, app):
        await probed(app, up)
        app.context.service.counter.budget_s = 0.1
        r = await client.post("/v1/chat/completions", json=chat("small-only", 12_000))
    assert r.status_code == 200 and counts(app)["failed"] == 1
