"""Budgets across replicas: three gateway processes share one real Redis, in front of a vLLM emulator.

Under concurrent load on all three, a daily token budget is never exceeded and is used up to within one
request's reservation, and the counter the replicas share equals exactly the sum of the engine's real usage
of every admitted request (each reservation settled once, on whichever replica served it). A cost budget
counts the same way, priced by the model's `price`. A spent budget answers 429 `insufficient_quota` with
the time to the next UTC midnight, and the openai SDK raises `RateLimitError` for it. The UTC days and
months that the Redis script computes from Redis's clock are checked against Python's for edge dates.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest
import redis as redis_py

from llm_gateway.access.keys import digest_of
from llm_gateway.access.redis_scripts import PERIODS
from llm_gateway.access.store import period_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisNotInstalled, RedisServer

DANA, ERIK, FAY = "sk-dana-1111", "sk-erik-2222", "sk-fay-3333"
TOKENS = 600
COST = 0.5  # 500 tokens at 0.001 each
MAX_TOKENS = 10
CONFIG = f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: dana, sha256: "{digest_of(DANA)}", budget: {{tokens: {TOKENS}, period: day}}}}
    - {{name: erik, sha256: "{digest_of(ERIK)}", budget: {{cost: {COST}, period: month}}}}
    - {{name: fay, sha256: "{digest_of(FAY)}"}}
limits:
  store: redis
  redis_url: "${{REDIS_URL}}"
  store_timeout_ms: 1000
backends:
  - {{name: emu, engine: vllm, url: "${{ENGINE_URL}}", capacity: 64, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    price: {{input_per_million: 1000, output_per_million: 1000}}
    deployments:
      - {{backend: emu, model: tiny, format: safetensors}}
"""
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": MAX_TOKENS}
# a prompt whose length the gateway's estimate and the emulator's count agree on (a multiple of 4 characters):
# its reservation is exactly its real usage, so a budget can be checked to the token
COMPLETION = {"model": "tiny", "prompt": "hello there!", "max_tokens": MAX_TOKENS}


def _require(exc: Exception) -> None:
    if os.environ.get("LLM_GATEWAY_REQUIRE_TOOLS") == "1":
        pytest.fail(str(exc))
    pytest.skip(str(exc))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RedisNotInstalled as e:
        _require(e)
    with server:
        yield server


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    # every request takes a while, so that the replicas' reservations overlap under load
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=64, ttft_ms=150)) as emu:
        yield emu


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, redis, engine) -> Iterator[list[GatewayProcess]]:
    tmp = tmp_path_factory.mktemp("gws")
    env = {"REDIS_URL": redis.url, "ENGINE_URL": engine.url}
    gws = [GatewayProcess(CONFIG, tmp, env=env, name=f"gw{i}") for i in range(3)]
    try:
        for g in gws:
            g.start()
        yield gws
    finally:
        for g in gws:
            g.stop()


def _client(server: RedisServer) -> redis_py.Redis:
    return redis_py.Redis.from_url(server.url, socket_timeout=5)


def _flush(server: RedisServer) -> None:
    with _client(server) as c:
        assert c.flushall()


async def _burst(urls: list[str], key: str, per_gateway: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=60, headers={"authorization": f"Bearer {key}"}) as c:
        tasks = [c.post(u + "/v1/completions", json=COMPLETION) for _ in range(per_gateway) for u in urls]
        return list(await asyncio.gather(*tasks))


def _remaining(r: httpx.Response, what: str) -> str:
    return r.headers[f"x-ratelimit-remaining-budget-{what}"]


def test_a_token_budget_is_exact_across_three_replicas_under_concurrent_load(replicas, redis) -> None:
    _flush(redis)
    urls = [g.url for g in replicas]
    # the cost of one request: what it reserves (the header of its own answer) and what the engine used
    probe = httpx.post(urls[0] + "/v1/completions", json=COMPLETION, headers={"authorization": f"Bearer {DANA}"})
    assert probe.status_code == 200, probe.text
    reserved = TOKENS - int(_remaining(probe, "tokens"))
    used = probe.json()["usage"]["total_tokens"]
    assert used == reserved, (used, reserved)  # the estimate is the real usage: the budget holds to the token
    admitted, rounds = [used], 0
    statuses: Counter[int] = Counter()
    while True:  # bursts on all three at once, until a whole burst is refused (nothing was in flight then)
        rounds += 1
        assert rounds < 20, "the budget never ran out"
        results = asyncio.run(_burst(urls, DANA, 8))
        statuses.update(r.status_code for r in results)
        assert {r.status_code for r in results} <= {200, 429}, [r.text for r in results if r.status_code >= 500]
        ok = [r for r in results if r.status_code == 200]
        admitted += [r.json()["usage"]["total_tokens"] for r in ok]
        if not ok:
            break
        assert len({r.url.port for r in ok}) >= 2 or len(ok) < 3  # the replicas share the work
    spent = sum(admitted)
    assert spent <= TOKENS  # never over the budget, however the replicas raced
    # the shared counter is exactly the engine's usage of every admitted request: one more that fits is
    # answered with the budget left after its own reservation
    assert TOKENS - spent < reserved, (spent, reserved)  # used up to within one reservation: the refusals were due
    refused = results[0]
    err = refused.json()["error"]
    assert (err["type"], err["code"]) == ("insufficient_quota", "insufficient_quota"), err
    assert int(_remaining(refused, "tokens")) == TOKENS - spent
    now = dt.datetime.now(dt.UTC)
    midnight = dt.datetime(now.year, now.month, now.day, tzinfo=dt.UTC) + dt.timedelta(days=1)
    assert abs(int(refused.headers["retry-after"]) - (midnight - now).total_seconds()) < 5
    assert f"resets at {midnight:%Y-%m-%dT%H:%M:%SZ}" in err["message"]
    assert statuses[200] + 1 == len(admitted) and statuses[429] >= 24


def test_each_reservation_is_settled_with_the_real_usage_on_whichever_replica_served_it(replicas, redis) -> None:
    _flush(redis)
    spent, reservations = 0, set()
    for i in range(6):
        # a chat's prompt is counted by the engine's template as more than the gateway's estimate: each
        # settlement corrects the shared counter upwards, on the replica that served the request
        r = httpx.post(
            replicas[i % 3].url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {DANA}"}
        )
        assert r.status_code == 200, r.text
        reservations.add(TOKENS - spent - int(_remaining(r, "tokens")))  # what is left: less settled, less this one
        spent += r.json()["usage"]["total_tokens"]
    (reserved,) = reservations  # the same each time: every earlier request counted at its real usage
    assert reserved != r.json()["usage"]["total_tokens"]  # so the settlements did change the counter


def test_a_cost_budget_counts_the_same_way_across_replicas(replicas, redis) -> None:
    _flush(redis)
    urls = [g.url for g in replicas]
    spent_tokens, last = 0, None
    for i in range(200):
        r = httpx.post(urls[i % 3] + "/v1/completions", json=COMPLETION, headers={"authorization": f"Bearer {ERIK}"})
        if r.status_code == 429:
            break
        assert r.status_code == 200, r.text
        spent_tokens += r.json()["usage"]["total_tokens"]
        last = r
    else:
        pytest.fail("the cost budget never ran out")
    assert last is not None
    assert r.json()["error"]["code"] == "insufficient_quota" and "Cost budget exhausted" in r.json()["error"]["message"]
    # 0.001 per token, in or out: what is left is the budget less the real usage of every admitted request
    assert float(_remaining(r, "cost")) == pytest.approx(COST - spent_tokens * 0.001, abs=1e-9)
    assert spent_tokens * 0.001 <= COST
    assert r.headers["x-ratelimit-limit-budget-cost"] == "0.5"
    first_of_next_month = period_of("month", time.time())[1]
    assert abs(int(r.headers["retry-after"]) - (first_of_next_month - time.time())) < 5


def test_the_openai_sdk_raises_rate_limit_error_for_a_spent_budget_and_other_keys_are_untouched(
    replicas, redis
) -> None:
    _flush(redis)
    url = replicas[2].url + "/v1"
    dana = openai.OpenAI(base_url=url, api_key=DANA, max_retries=0)
    with pytest.raises(openai.RateLimitError) as ei:
        for _ in range(100):
            dana.chat.completions.create(**CHAT)
    assert ei.value.code == "insufficient_quota"
    fay = openai.OpenAI(base_url=url, api_key=FAY, max_retries=0)  # no budget
    assert fay.chat.completions.create(**CHAT).usage is not None


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        dt.datetime(2024, 2, 29, 23, 59, 59, tzinfo=dt.UTC),
        dt.datetime(2024, 3, 1, tzinfo=dt.UTC),
        dt.datetime(2026, 12, 31, 23, 59, 59, tzinfo=dt.UTC),
        dt.datetime(2027, 1, 1, tzinfo=dt.UTC),
        dt.datetime(2100, 2, 28, 12, tzinfo=dt.UTC),  # not a leap year
        dt.datetime(2000, 2, 29, 12, tzinfo=dt.UTC),  # a leap year
        dt.datetime(2026, 6, 30, 23, 59, 59, tzinfo=dt.UTC),
    ],
    ids=lambda d: d.strftime("%Y-%m-%dT%H:%M:%S"),
)
def test_the_redis_scripts_utc_days_and_months_agree_with_python(redis, when: dt.datetime) -> None:
    secs = int(when.timestamp())
    script = "local secs = tonumber(ARGV[1])\n" + PERIODS + "return {day, month, ends[1], ends[2]}"
    with _client(redis) as c:
        day, month, day_end_ms, month_end_ms = (int(x) for x in c.eval(script, 0, secs))
    assert f"d{day}" == period_of("day", secs)[0] and day_end_ms == period_of("day", secs)[1] * 1000
    assert f"m{month}" == period_of("month", secs)[0] and month_end_ms == period_of("month", secs)[1] * 1000
