"""The acceptance of keys at runtime: three gateway processes share one real Postgres (the keys table, the
audit log) and one real Redis (the limits), in front of a vLLM emulator.

A key created through the admin API of one replica works on all three within 2 s of the create call; a
revoked or deleted one is refused (401) on all three within 2 s; a runtime key's RPM is exact across the
replicas (its counters live in Redis, as a config key's do); every replica reads the one audit log; and
no replica logs a key, a digest or the database's password. The third replica serves its admin API alone
on `server.admin_port`, so the same checks also cover that wiring.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.postgres_server import PostgresServer, running_postgres
from tests.support.real_engines import free_port
from tests.support.redis_server import RedisNotInstalled, RedisServer
from tests.support.waiting import wait_until

ADMIN_KEY = "sk-admin-e2e-0123456789abcdef"
CLIENT_KEY = "sk-client-e2e-0123456789abcdef"
#: the bound of the acceptance: a change is seen everywhere within this long after the admin call
PROPAGATION_S = 2.0

CONFIG = f"""
server: {{access_log: false ADMIN_PORT}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{digest_of(CLIENT_KEY)}"}}
admin:
  keys:
    - {{name: root, sha256: "{digest_of(ADMIN_KEY)}"}}
database: {{url: "${{DATABASE_URL}}"}}
limits: {{store: redis, redis_url: "${{REDIS_URL}}"}}
backends:
  - {{name: emu, engine: vllm, url: "${{ENGINE_URL}}", capacity: 64, probe: {{interval_s: 0.5}}}}
models:
  - name: tiny
    deployments:
      - {{backend: emu, model: tiny, format: safetensors}}
"""
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}


def _require(exc: Exception) -> None:
    if os.environ.get("LLM_GATEWAY_REQUIRE_TOOLS") == "1":
        pytest.fail(str(exc))
    pytest.skip(str(exc))


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


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


class Replica:
    def __init__(self, process: GatewayProcess, admin_url: str) -> None:
        self.process = process
        self.url = process.url
        self.admin_url = admin_url  # where its admin API is served


@pytest.fixture(scope="module")
def replicas(tmp_path_factory, postgres, redis, engine) -> Iterator[list[Replica]]:
    workdir: Path = tmp_path_factory.mktemp("replicas")
    env = {"DATABASE_URL": postgres.new_database(), "REDIS_URL": redis.url, "ENGINE_URL": engine.url}
    admin_port = free_port()
    out = []
    for i in range(3):
        own_port = f", admin_port: {admin_port}" if i == 2 else ""
        gw = GatewayProcess(CONFIG.replace(" ADMIN_PORT", own_port), workdir, env=env, name=f"replica{i + 1}")
        out.append(Replica(gw, f"http://127.0.0.1:{admin_port}" if i == 2 else gw.url))
    try:
        for r in out:
            r.process.start()
        yield out
    finally:
        for r in out:
            r.process.stop()
    for r in out:  # nothing secret in any replica's log
        log = r.process.log_text()
        assert postgres.password not in log
        assert ADMIN_KEY not in log and CLIENT_KEY not in log
        assert "sk-gw-" not in log  # no key created at runtime either


def _status(url: str, key: str) -> int:
    return httpx.get(url + "/v1/models", headers={"authorization": f"Bearer {key}"}, timeout=10).status_code


def _create(replica: Replica, name: str, **fields: object) -> dict:
    fields.setdefault("models", ["*"])  # required: a new key names the models it may use
    r = httpx.post(replica.admin_url + "/admin/keys", json={"name": name, **fields}, headers=ADMIN, timeout=10)
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


def _everywhere(replicas: list[Replica], key: str, want: int, since: float, what: str) -> list[float]:
    """Wait until every replica answers `key` with `want`, within PROPAGATION_S of `since`; the delays seen."""
    seen = []
    for r in replicas:
        left = max(0.0, since + PROPAGATION_S - time.monotonic())
        wait_until(lambda r=r: _status(r.url, key) == want, timeout=left, interval=0.02, what=f"{what} on {r.url}")
        seen.append(time.monotonic() - since)
    assert seen[-1] <= PROPAGATION_S, seen
    return seen


def test_a_created_key_works_on_every_replica_within_2s(replicas: list[Replica]) -> None:
    t0 = time.monotonic()
    created = _create(replicas[0], "ci-everywhere")
    key = created["key"]
    delays = _everywhere(replicas, key, 200, t0, "the new key to work")
    print(f"\ncreated on replica 1, accepted by replicas 1-3 after {[f'{d:.3f}' for d in delays]} s")
    for r in replicas:  # and a real request goes through on each
        answer = httpx.post(r.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
        assert answer.status_code == 200, answer.text
    # the shared audit log says who did it, on any replica that serves the admin API
    entries = httpx.get(replicas[2].admin_url + "/admin/audit", params={"target": "ci-everywhere"}, headers=ADMIN)
    assert [(e["action"], e["actor"], e["target_id"]) for e in entries.json()["data"]] == [
        ("key.create", "root", created["id"])
    ]
    # the key is one identity everywhere: the id minted at creation, read back from the shared table
    for r in replicas[1:]:
        listed = httpx.get(r.admin_url + "/admin/keys/ci-everywhere", headers=ADMIN, timeout=10).json()
        assert listed["id"] == created["id"]
    assert key not in entries.text and digest_of(key) not in entries.text


def test_a_revoked_or_deleted_key_is_refused_on_every_replica_within_2s(replicas: list[Replica]) -> None:
    revoked = _create(replicas[0], "ci-revoked")["key"]
    deleted = _create(replicas[1], "ci-deleted")["key"]
    t0 = time.monotonic()
    _everywhere(replicas, revoked, 200, t0, "the keys to work")
    _everywhere(replicas, deleted, 200, t0, "the keys to work")

    t1 = time.monotonic()
    r = httpx.post(replicas[2].admin_url + "/admin/keys/ci-revoked/revoke", headers=ADMIN, timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "revoked"
    delays = _everywhere(replicas, revoked, 401, t1, "the revoked key to be refused")
    print(f"\nrevoked on replica 3, refused by replicas 1-3 after {[f'{d:.3f}' for d in delays]} s")

    t2 = time.monotonic()
    assert httpx.delete(replicas[0].admin_url + "/admin/keys/ci-deleted", headers=ADMIN).status_code == 204
    delays = _everywhere(replicas, deleted, 401, t2, "the deleted key to be refused")
    print(f"deleted on replica 1, refused by replicas 1-3 after {[f'{d:.3f}' for d in delays]} s")
    assert _status(replicas[1].url, CLIENT_KEY) == 200  # the config key is untouched


async def _burst(urls: list[str], key: str, per_replica: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30, headers={"authorization": f"Bearer {key}"}) as c:
        return list(
            await asyncio.gather(
                *(c.post(u + "/v1/chat/completions", json=CHAT) for _ in range(per_replica) for u in urls)
            )
        )


def test_a_runtime_keys_rpm_is_exact_across_the_replicas(replicas: list[Replica]) -> None:
    t0 = time.monotonic()
    key = _create(replicas[0], "ci-rpm", limits={"rpm": 5})["key"]
    burst_key = _create(replicas[0], "ci-rpm-burst", limits={"rpm": 5})["key"]
    _everywhere(replicas, key, 200, t0, "the limited key to work")  # /v1/models is not rate limited
    _everywhere(replicas, burst_key, 200, t0, "the limited key to work")
    started = time.monotonic()
    statuses = [
        httpx.post(replicas[i % 3].url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
        for i in range(5)
    ]
    assert [r.status_code for r in statuses] == [200] * 5
    for r in replicas:  # the 6th, on any replica, is over the limit
        sixth = httpx.post(r.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {key}"})
        assert sixth.status_code == 429, sixth.text
        assert sixth.headers["x-ratelimit-limit-requests"] == "5"
        assert sixth.headers["x-ratelimit-remaining-requests"] == "0"
    # 15 at once over the three replicas: exactly 5 admitted, not 5 each
    results = asyncio.run(_burst([r.url for r in replicas], burst_key, 5))
    assert Counter(r.status_code for r in results) == {200: 5, 429: 10}
    assert time.monotonic() - started < 50  # all inside one window


def test_the_admin_api_is_for_admin_keys_only_and_only_where_it_is_served(replicas: list[Replica]) -> None:
    for r in replicas:
        assert (
            httpx.get(r.admin_url + "/admin/keys", headers={"authorization": f"Bearer {CLIENT_KEY}"}).status_code == 401
        )
        assert _status(r.url, ADMIN_KEY) == 401  # an admin key is no client key
    _create(replicas[0], "ci-listed")
    listed = {k["name"]: k for k in httpx.get(replicas[1].admin_url + "/admin/keys", headers=ADMIN).json()["data"]}
    assert listed["alice"]["source"] == "config" and listed["ci-listed"]["source"] == "runtime"
    # replica 3 serves its admin API on its admin port only
    assert httpx.get(replicas[2].url + "/admin/keys", headers=ADMIN).status_code == 404
