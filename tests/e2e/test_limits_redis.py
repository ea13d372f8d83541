"""Keys and limits across replicas: three gateway processes share one real Redis.

Together they admit exactly the configured RPM (not 3x), the TPM budget holds for streams whose
client did not ask for usage (the gateway asks the engine, settles with the real count, and
strips the extra chunk), Redis dying mid-run makes the configured policy apply without hanging,
and the openai SDK raises the exception OpenAI's own API would cause.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import openai
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.redis_server import RedisNotInstalled, RedisServer
from tests.support.waiting import metric, sample, scrape, wait_until

ALICE, BOB, CAROL, DAVE, ERIN = "sk-alice-1111", "sk-bob-2222", "sk-carol-3333", "sk-dave-4444", "sk-erin-5555"
RPM = 30
TPM = 150
STORE_TIMEOUT_MS = 250
# "promptly" while the store is down: a request waits for the store at most a couple of times its timeout; this
# bound is 20 of them, so a loaded machine still fits and a hung store call (the client gives up at 30 s) does not
PROMPT_S = 20 * STORE_TIMEOUT_MS / 1000

CONFIG = f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{digest_of(ALICE)}", limits: {{rpm: {RPM}}}}}
    - {{name: bob, sha256: "{digest_of(BOB)}", limits: {{tpm: {TPM}}}}}
    - {{name: carol, sha256: "{digest_of(CAROL)}"}}
    - {{name: dave, sha256: "{digest_of(DAVE)}", models: ["other-*"]}}
    - {{name: erin, sha256: "{digest_of(ERIN)}", models: ["nothing-*"]}}
limits:
  store: redis
  redis_url: "${{REDIS_URL}}"
  on_store_error: ${{ON_STORE_ERROR:-open}}
  store_timeout_ms: {STORE_TIMEOUT_MS}
backends:
  - {{name: emu, engine: vllm, url: "${{ENGINE_URL}}", capacity: 64, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments:
      - {{backend: emu, model: tiny, format: safetensors}}
  - name: other-tiny
    aliases: [other-alias]
    deployments:
      - {{backend: emu, model: tiny, format: safetensors}}
"""
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 10}


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
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=64)) as emu:
        yield emu


def _gateways(tmp, redis: RedisServer, engine: EmulatorThread, n: int, on_error: str = "open") -> list[GatewayProcess]:
    env = {"REDIS_URL": redis.url, "ENGINE_URL": engine.url, "ON_STORE_ERROR": on_error}
    return [GatewayProcess(CONFIG, tmp, env=env, name=f"gw{i}-{on_error}") for i in range(n)]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, redis, engine) -> Iterator[list[GatewayProcess]]:
    gws = _gateways(tmp_path_factory.mktemp("gws"), redis, engine, 3)
    try:
        for g in gws:
            g.start()
        yield gws
    finally:
        for g in gws:
            g.stop()


def _flush(redis: RedisServer) -> None:
    import socket

    with socket.create_connection(("127.0.0.1", redis.port), timeout=2) as s:
        s.sendall(b"FLUSHALL\r\n")
        assert s.recv(16).startswith(b"+OK")


async def _hammer(urls: list[str], key: str, per_gateway: int, body: dict) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"}) as c:
        tasks = [c.post(u + "/v1/chat/completions", json=body) for _ in range(per_gateway) for u in urls]
        return list(await asyncio.gather(*tasks))


def test_three_replicas_together_admit_exactly_the_rpm(replicas, redis) -> None:
    _flush(redis)
    t = time.monotonic()
    # two replicas take a third of the budget each, one request at a time ...
    third = RPM // 3
    early = [
        httpx.post(g.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {ALICE}"}, timeout=30)
        for g in replicas[:2]
        for _ in range(third)
    ]
    assert [r.status_code for r in early] == [200] * (2 * third)
    # ... then 3 x RPM requests at once on all three: together they admit only what is left, not RPM each
    results = asyncio.run(_hammer([g.url for g in replicas], ALICE, RPM, CHAT))
    assert time.monotonic() - t < 50  # all inside one window
    statuses = Counter(r.status_code for r in results)
    assert statuses == {200: RPM - 2 * third, 429: 3 * RPM - (RPM - 2 * third)}, statuses
    by_gateway = Counter(r.url.port for r in early + results if r.status_code == 200)
    assert sum(by_gateway.values()) == RPM
    assert len(by_gateway) >= 2 and all(by_gateway[g.port] >= third for g in replicas[:2]), by_gateway
    rejected = next(r for r in results if r.status_code == 429)
    err = rejected.json()["error"]
    assert err["type"] == "requests" and err["code"] == "rate_limit_exceeded"
    assert int(rejected.headers["retry-after"]) >= 1
    assert rejected.headers["x-ratelimit-remaining-requests"] == "0"
    assert rejected.headers["x-ratelimit-limit-requests"] == str(RPM)


def _stream_tokens(url: str, key: str, want_usage: bool) -> tuple[int, int | None]:
    body = {**CHAT, "stream": True}
    if want_usage:
        body["stream_options"] = {"include_usage": True}
    events, usage = 0, None
    with (
        httpx.Client(timeout=30) as c,
        c.stream("POST", url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}) as r,
    ):
        if r.status_code != 200:
            r.read()
            return r.status_code, None
        for line in r.iter_lines():
            if line.startswith("data: {"):
                events += 1
                if '"usage":{' in line:
                    import orjson

                    usage = orjson.loads(line[6:])["usage"]["total_tokens"]
    return 200, usage


def test_tpm_holds_across_replicas_for_streams_whose_client_did_not_ask_for_usage(replicas, redis) -> None:
    _flush(redis)
    status, real = _stream_tokens(replicas[0].url, CAROL, want_usage=True)  # learn the real cost (no limits)
    assert status == 200 and real is not None and real > 10
    admitted = 0
    for i in range(20):
        status, usage = _stream_tokens(replicas[i % 3].url, BOB, want_usage=False)
        assert usage is None  # the usage chunk the gateway asked for never reaches this client
        if status == 429:
            break
        assert status == 200
        admitted += 1
    else:
        pytest.fail("the TPM limit never triggered")
    # every admitted stream was billed its real usage: the budget holds, and the next one does not fit
    assert admitted * real <= TPM
    assert (admitted + 1) * real > TPM


def test_sdk_sees_authentication_permission_and_rate_limit_errors(replicas, redis) -> None:
    _flush(redis)
    url = replicas[1].url + "/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0).chat.completions.create(**CHAT)
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=url, api_key=DAVE, max_retries=0).chat.completions.create(**CHAT)
    # /v1/models lists only what the key may use: some, all or none of the models (aliases included)
    listed = {
        who: [m.id for m in openai.OpenAI(base_url=url, api_key=key, max_retries=0).models.list()]
        for who, key in (("dave", DAVE), ("carol", CAROL), ("erin", ERIN))
    }
    assert listed == {"dave": ["other-tiny", "other-alias"], "carol": ["tiny", "other-tiny", "other-alias"], "erin": []}
    dave = openai.OpenAI(base_url=url, api_key=DAVE, max_retries=0)
    assert dave.models.retrieve("other-tiny").id == "other-tiny"
    with pytest.raises(openai.NotFoundError):
        dave.models.retrieve("tiny")  # a model the key may not use does not exist for it
    assert dave.chat.completions.create(**{**CHAT, "model": "other-tiny"}).model == "other-tiny"
    alice = openai.OpenAI(base_url=url, api_key=ALICE, max_retries=0)
    for _ in range(RPM):
        alice.chat.completions.create(**CHAT)
    with pytest.raises(openai.RateLimitError) as ei:
        alice.chat.completions.create(**CHAT)
    assert ei.value.response.headers["retry-after"]


def _timed_post(url: str, key: str) -> tuple[int, float, dict]:
    with httpx.Client(timeout=30) as c:
        c.get(url + "/healthz")  # connected before the clock starts: it times the gateway, not the handshake
        t = time.monotonic()
        r = c.post(url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
        return r.status_code, time.monotonic() - t, r.json()


def test_redis_killed_mid_run_applies_the_policy_and_never_hangs(tmp_path, redis, engine) -> None:
    _flush(redis)
    open_gw, closed_gw = (
        _gateways(tmp_path, redis, engine, 1, "open")[0],
        _gateways(tmp_path, redis, engine, 1, "closed")[0],
    )
    with open_gw, closed_gw:
        assert _timed_post(open_gw.url, ALICE)[0] == 200
        assert _timed_post(closed_gw.url, ALICE)[0] == 200
        redis.kill()
        try:
            for _ in range(5):
                status, took, _ = _timed_post(open_gw.url, ALICE)
                assert status == 200 and took < PROMPT_S, took  # fail-open: served, promptly
                status, took, body = _timed_post(closed_gw.url, ALICE)
                assert status == 503 and took < PROMPT_S, took  # fail-closed: refused, promptly
                assert body["error"]["code"] == "limits_unavailable"
            m = scrape(open_gw.url)
            assert sample(m, "gateway_ratelimit_store_up") == 0.0
            assert (sample(m, "gateway_ratelimit_store_errors_total") or 0) >= 1
        finally:
            redis.start()  # same port
        # back: the store is used again (it is skipped for a second after a failure), and limits hold again
        wait_until(lambda: _timed_post(closed_gw.url, ALICE)[0] == 200, interval=0.2, what="the store to be used again")
        assert _timed_post(closed_gw.url, ALICE)[0] == 200
        assert metric(closed_gw.url, "gateway_ratelimit_store_up") == 1.0
