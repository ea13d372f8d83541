"""A key is who it is, not what it is called (red-team report 2026-12-04, H2, H3 and M1).

Each test is a reproduction of the report run against a real gateway process (`llm-gateway serve`, its
own SQLite database) in front of a vLLM emulator:

- H2: a runtime key deleted and created again under the same name is a new key: it cannot read the old
  key's stored Responses, does not inherit its limiter windows, and its ledger rows are its own.
- H3: a config reload that gives a config key a runtime key's name is refused whole (the old config
  stays, the log says why), so the runtime key can still be revoked; a gateway that starts with such a
  config refuses the runtime key and lets the admin delete it; a config key and a runtime key of the
  same name never share stored responses.
- M1: a key's model globs and `model_limits` are judged against the canonical public model: an alias
  that matches a glob grants nothing, and a `model_limits` entry that names an alias limits its model.

And the upgrade: a database written before key ids (on SQLite and a real Postgres) gives each stored
response, usage row and audit entry the id of the key that made it, and a deleted key's rows to nobody.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy.ext.asyncio import create_async_engine

from llm_gateway.access.keys import config_key_id, digest_of, principal_of
from llm_gateway.routing.dispatch import ticket_for
from llm_gateway.settings import KeyConfig
from llm_gateway.state import database
from llm_gateway.state.database import Database
from llm_gateway.state.responses import ResponseStore
from llm_gateway.state.tables import api_keys, audit_log, responses, usage_ledger
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.postgres_server import PostgresServer, running_postgres
from tests.support.waiting import scrape, wait_until

ADMIN_KEY = "sk-admin-identity-0123456789abcdef"
A_KEY = "sk-gw-teamA-identity-0123456789abcdef"
B_KEY = "sk-gw-teamB-identity-0123456789abcdef"
CFGBUD_KEY = "sk-gw-cfgbud-identity-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}

CONFIG = """
server: {{access_log: false, data_dir: "{data_dir}", reload_poll_s: 0}}
admin:
  keys: [{{name: root, sha256: "{admin}"}}]
  key_poll_s: 0.2
usage: {{ledger: true, flush_interval_s: 0.2}}
auth:
  mode: keys
  keys:
    - name: team-a
      sha256: "{a}"
      models: ["alpha*"]
      model_limits: {{"alpha-small": {{rpm: 1}}}}
    - {{name: team-b, sha256: "{b}", models: ["*"]}}
{extra_keys}
backends:
  - {{name: emu-vllm, engine: vllm, url: "{engine}", probe: {{interval_s: 0.5}}}}
models:
  - name: alpha-8b
    aliases: [alpha-small]
    deployments: [{{backend: emu-vllm, model: tiny, format: safetensors, capabilities: [chat, completions, tools]}}]
  - name: beta-70b
    aliases: [alpha-big]
    deployments: [{{backend: emu-vllm, model: tiny, format: safetensors, capabilities: [chat, completions]}}]
"""
BUD_IN_CONFIG = f'    - {{name: bud, sha256: "{digest_of(CFGBUD_KEY)}", models: ["*"]}}'


def config(data_dir: Path, engine: str, *, extra_keys: str = "") -> str:
    return CONFIG.format(
        data_dir=data_dir,
        admin=digest_of(ADMIN_KEY),
        a=digest_of(A_KEY),
        b=digest_of(B_KEY),
        engine=engine,
        extra_keys=extra_keys,
    )


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(engine: EmulatorThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("identity")
    with GatewayProcess(config(work / "data", engine.url), work) as gw:
        yield gw


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def mk(gw: GatewayProcess, body: dict[str, Any]) -> str:
    r = httpx.post(gw.url + "/admin/keys", json=body, headers=ADMIN, timeout=30)
    assert r.status_code == 201, r.text
    return str(r.json()["key"])


def chat(gw: GatewayProcess, key: str, model: str = "alpha-8b") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers=bearer(key), timeout=30)


def respond(gw: GatewayProcess, key: str, text: str) -> str:
    body = {"model": "alpha-8b", "input": text, "max_output_tokens": 3}
    r = httpx.post(gw.url + "/v1/responses", json=body, headers=bearer(key), timeout=30)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def input_items(gw: GatewayProcess, key: str, rid: str) -> httpx.Response:
    return httpx.get(f"{gw.url}/v1/responses/{rid}/input_items", headers=bearer(key), timeout=30)


# -- H2: a reused name is a new key --------------------------------------------------------------------


def test_a_new_key_with_a_deleted_keys_name_cannot_read_its_stored_responses(gateway: GatewayProcess):
    ci = mk(gateway, {"name": "ci", "models": ["alpha-8b"]})
    rid = respond(gateway, ci, "ci-secret: deploy token abc123")
    assert input_items(gateway, ci, rid).status_code == 200
    assert httpx.delete(gateway.url + "/admin/keys/ci", headers=ADMIN, timeout=30).status_code == 204
    ci2 = mk(gateway, {"name": "ci", "models": ["alpha-8b"]})  # someone else's new key

    for r in (
        input_items(gateway, ci2, rid),
        httpx.get(f"{gateway.url}/v1/responses/{rid}", headers=bearer(ci2), timeout=30),
        httpx.delete(f"{gateway.url}/v1/responses/{rid}", headers=bearer(ci2), timeout=30),
    ):
        assert r.status_code == 404, r.text
        assert "abc123" not in r.text
    chained = httpx.post(
        gateway.url + "/v1/responses",
        json={"model": "alpha-8b", "input": "and?", "previous_response_id": rid, "max_output_tokens": 3},
        headers=bearer(ci2),
        timeout=30,
    )
    assert chained.status_code == 400, chained.text  # OpenAI's answer for a response the caller cannot see
    assert chained.json()["error"]["code"] == "previous_response_not_found"


def test_a_new_key_with_a_deleted_keys_name_starts_with_fresh_limits(gateway: GatewayProcess):
    old = mk(gateway, {"name": "lim", "models": ["alpha*"], "limits": {"rpm": 1}})
    assert chat(gateway, old).status_code == 200
    assert chat(gateway, old).status_code == 429  # its minute is spent
    assert httpx.delete(gateway.url + "/admin/keys/lim", headers=ADMIN, timeout=30).status_code == 204
    new = mk(gateway, {"name": "lim", "models": ["alpha*"], "limits": {"rpm": 1}})
    assert chat(gateway, new).status_code == 200  # not the old key's window


def test_ledger_rows_and_the_audit_log_name_the_key_by_its_id(gateway: GatewayProcess):
    first = httpx.post(
        gateway.url + "/admin/keys", json={"name": "led", "models": ["alpha*"]}, headers=ADMIN, timeout=30
    ).json()
    assert chat(gateway, first["key"]).status_code == 200
    assert httpx.delete(gateway.url + "/admin/keys/led", headers=ADMIN, timeout=30).status_code == 204
    second = httpx.post(
        gateway.url + "/admin/keys", json={"name": "led", "models": ["alpha*"]}, headers=ADMIN, timeout=30
    ).json()
    assert chat(gateway, second["key"]).status_code == 200
    assert first["id"] != second["id"]

    def rows() -> list[dict[str, Any]]:
        r = httpx.get(gateway.url + "/admin/usage", params={"by": "key", "since": "1h"}, headers=ADMIN, timeout=30)
        found = [d for d in r.json()["data"] if d["key"] == "led"]
        return found if sum(d["requests"] for d in found) == 2 else []

    found = wait_until(rows, what="both keys' ledger rows")
    assert sorted((d["key_id"], d["requests"]) for d in found) == sorted([(first["id"], 1), (second["id"], 1)])
    audit = httpx.get(gateway.url + "/admin/audit", params={"target": "led"}, headers=ADMIN, timeout=30).json()
    assert [(e["action"], e["target_id"]) for e in audit["data"]] == [
        ("key.create", second["id"]),
        ("key.delete", first["id"]),
        ("key.create", first["id"]),
    ]


# -- H3: one name, one key ---------------------------------------------------------------------------------


def test_a_reload_that_gives_a_config_key_a_runtime_keys_name_is_refused_and_the_key_stays_revocable(
    engine: EmulatorThread, tmp_path: Path
):
    data = tmp_path / "data"
    with GatewayProcess(config(data, engine.url), tmp_path) as gw:
        bud = mk(gw, {"name": "bud", "models": ["alpha*"]})
        rid = respond(gw, bud, "bud's private note")
        before = scrape(gw.url).get(("gateway_config_reloads_total", frozenset({("result", "failure")})), 0.0)
        gw.write_config(config(data, engine.url, extra_keys=BUD_IN_CONFIG))
        gw.signal(signal.SIGHUP)
        wait_until(
            lambda: (
                scrape(gw.url).get(("gateway_config_reloads_total", frozenset({("result", "failure")})), 0.0) > before
            ),
            what="the reload to be refused",
        )
        assert "bud" in gw.log_text() and "runtime key" in gw.log_text()
        # the old config stays: the config key was not added
        assert chat(gw, CFGBUD_KEY).status_code == 401
        keys = httpx.get(gw.url + "/admin/keys", headers=ADMIN, timeout=30).json()["data"]
        assert [(k["name"], k["source"]) for k in keys if k["name"] == "bud"] == [("bud", "runtime")]
        r = httpx.post(gw.url + "/admin/keys/bud/revoke", headers=ADMIN, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "revoked"
        assert chat(gw, bud).status_code == 401
        assert input_items(gw, bud, rid).status_code == 401
        assert httpx.delete(gw.url + "/admin/keys/bud", headers=ADMIN, timeout=30).status_code == 204


def test_a_runtime_key_whose_name_a_config_key_took_while_stopped_is_refused_and_can_be_deleted(
    engine: EmulatorThread, tmp_path: Path
):
    data = tmp_path / "data"
    with GatewayProcess(config(data, engine.url), tmp_path, name="before") as gw:
        bud = mk(gw, {"name": "bud", "models": ["alpha*"]})
        rid = respond(gw, bud, "bud's private note")
    # the file is edited while the gateway is down: a restart has no old config to keep
    with GatewayProcess(config(data, engine.url, extra_keys=BUD_IN_CONFIG), tmp_path, name="after") as gw:
        assert chat(gw, CFGBUD_KEY).status_code == 200  # the config key works
        # ... and is a key of its own: it cannot read the runtime key's stored responses
        assert input_items(gw, CFGBUD_KEY, rid).status_code == 404
        wait_until(lambda: "bud" in gw.log_text() and "refused" in gw.log_text(), what="the refusal in the log")
        assert chat(gw, bud).status_code == 401  # the runtime key is refused, not silently shared
        keys = httpx.get(gw.url + "/admin/keys", headers=ADMIN, timeout=30).json()["data"]
        buds = {k["source"]: k for k in keys if k["name"] == "bud"}
        assert set(buds) == {"config", "runtime"} and buds["runtime"]["status"] == "conflict"
        assert buds["config"]["id"] != buds["runtime"]["id"]
        r = httpx.delete(gw.url + "/admin/keys/bud", headers=ADMIN, timeout=30)
        assert r.status_code == 204, r.text  # the runtime key goes; the config key stays
        assert chat(gw, CFGBUD_KEY).status_code == 200
        keys = httpx.get(gw.url + "/admin/keys", headers=ADMIN, timeout=30).json()["data"]
        assert [k["source"] for k in keys if k["name"] == "bud"] == ["config"]


def test_a_runtime_key_cannot_take_a_config_keys_name(gateway: GatewayProcess):
    r = httpx.post(gateway.url + "/admin/keys", json={"name": "team-a", "models": ["*"]}, headers=ADMIN, timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "name_taken"


# -- M1: aliases grant nothing of their own ----------------------------------------------------------------


def test_an_alias_that_matches_a_keys_glob_does_not_grant_the_model_it_points_to(gateway: GatewayProcess):
    assert chat(gateway, A_KEY, "beta-70b").status_code == 403
    r = chat(gateway, A_KEY, "alpha-big")
    assert r.status_code == 403, r.text
    assert r.json()["error"]["code"] == "model_not_allowed"
    listed = httpx.get(gateway.url + "/v1/models", headers=bearer(A_KEY), timeout=30).json()["data"]
    assert sorted(m["id"] for m in listed) == ["alpha-8b", "alpha-small"]
    assert httpx.get(gateway.url + "/v1/models/alpha-big", headers=bearer(A_KEY), timeout=30).status_code == 404
    # a key whose allowlist names the alias itself is given the model it points to
    named = mk(gateway, {"name": "named-alias", "models": ["alpha-big"]})
    assert chat(gateway, named, "alpha-big").status_code == 200
    assert chat(gateway, named, "beta-70b").status_code == 200
    assert chat(gateway, named, "alpha-8b").status_code == 403


def test_model_limits_written_against_an_alias_limit_the_model_it_points_to(gateway: GatewayProcess):
    # team-a: model_limits {"alpha-small": {rpm: 1}}, and alpha-small is an alias of alpha-8b
    assert chat(gateway, A_KEY, "alpha-8b").status_code == 200
    refused = chat(gateway, A_KEY, "alpha-small")
    assert refused.status_code == 429, refused.text
    assert chat(gateway, A_KEY, "alpha-8b").status_code == 429
    # a runtime key's model limits follow the same rule
    rt = mk(gateway, {"name": "alias-limited", "models": ["*"], "model_limits": {"alpha-big": {"rpm": 1}}})
    assert chat(gateway, rt, "beta-70b").status_code == 200
    assert chat(gateway, rt, "alpha-big").status_code == 429
    assert chat(gateway, rt, "alpha-8b").status_code == 200  # another model: not limited


# -- an existing database: rows that named a key by its name ---------------------------------------------------

T0 = 1_700_000_000


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgres"])
def old_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database at the schema before key ids (revision 0003_usage)."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path / 'old.db'}"
    return str(request.getfixturevalue("postgres").new_database())


async def _at_revision(url: str, revision: str, statements: list[tuple[str, dict[str, Any]]]) -> None:
    def upgrade(conn: Any) -> None:
        cfg = database._alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)

    engine = create_async_engine(url)
    try:
        async with engine.begin() as conn:
            await conn.run_sync(upgrade)
            for sql, params in statements:
                await conn.execute(sa.text(sql), params)
    finally:
        await engine.dispose()


def _old_rows() -> list[tuple[str, dict[str, Any]]]:
    key = (
        "INSERT INTO api_keys (name, sha256, models, limits, model_limits, created_at, updated_at) "
        "VALUES (:name, :sha, '[\"*\"]', '{}', '{}', :at, :at)"
    )
    audit = "INSERT INTO audit_log (at, actor, action, target, changes) VALUES (:at, 'root', :action, :target, '{}')"
    response = (
        "INSERT INTO responses (id, owner, model, created_at, response, input_items, conversation) "
        "VALUES (:id, :owner, 'm', :at, '{}', '[]', '[]')"
    )
    ledger = (
        "INSERT INTO usage_ledger (at_ms, day, request_id, key, model, backend, endpoint, status, outcome, "
        "prompt_tokens, completion_tokens, usage_estimated, ttft_ms, duration_ms) "
        "VALUES (:at_ms, '2023-11-14', :rid, :key, 'm', 'b', 'chat', 200, 'success', 1, 1, false, 1.0, 1.0)"
    )
    out: list[tuple[str, dict[str, Any]]] = []
    # "ci": created, deleted, created again by someone else (the live key)
    out += [(audit, {"at": T0, "action": "key.create", "target": "ci"})]
    out += [(audit, {"at": T0 + 200, "action": "key.delete", "target": "ci"})]
    out += [(audit, {"at": T0 + 300, "action": "key.create", "target": "ci"})]
    out += [(key, {"name": "ci", "sha": "1" * 64, "at": T0 + 300})]
    out += [(response, {"id": "resp_old_ci", "owner": "ci", "at": T0 + 100})]
    out += [(response, {"id": "resp_new_ci", "owner": "ci", "at": T0 + 350})]
    out += [(ledger, {"at_ms": (T0 + 100) * 1000 + 5, "rid": "old-ci", "key": "ci"})]
    out += [(ledger, {"at_ms": (T0 + 350) * 1000 + 5, "rid": "new-ci", "key": "ci"})]
    # "flip": deleted and created again in the same second; a row of that second could be either's
    out += [(audit, {"at": T0, "action": "key.create", "target": "flip"})]
    out += [(audit, {"at": T0 + 10, "action": "key.delete", "target": "flip"})]
    out += [(audit, {"at": T0 + 10, "action": "key.create", "target": "flip"})]
    out += [(key, {"name": "flip", "sha": "2" * 64, "at": T0 + 10})]
    out += [(response, {"id": "resp_flip_either", "owner": "flip", "at": T0 + 10})]
    out += [(response, {"id": "resp_flip_new", "owner": "flip", "at": T0 + 11})]
    # "bud": a runtime key whose name a config key has too: either may have made its rows
    out += [(audit, {"at": T0, "action": "key.create", "target": "bud"})]
    out += [(key, {"name": "bud", "sha": "3" * 64, "at": T0})]
    out += [(response, {"id": "resp_bud", "owner": "bud", "at": T0 + 5})]
    out += [(ledger, {"at_ms": (T0 + 5) * 1000, "rid": "bud", "key": "bud"})]
    # config keys, a key nobody knows, and `auth: none`
    out += [(response, {"id": "resp_team_a", "owner": "team-a", "at": T0 + 50})]
    out += [(ledger, {"at_ms": (T0 + 50) * 1000, "rid": "team-a", "key": "team-a"})]
    out += [(response, {"id": "resp_ghost", "owner": "ghost", "at": T0 + 50})]
    out += [(ledger, {"at_ms": (T0 + 50) * 1000, "rid": "ghost", "key": "ghost"})]
    out += [(response, {"id": "resp_anon", "owner": "anonymous", "at": T0 + 50})]
    return out


async def test_an_existing_database_gives_each_row_the_id_of_the_key_that_made_it(old_db_url: str):
    await _at_revision(old_db_url, "0003_usage", _old_rows())
    config_ids = {"team-a": "kc_" + "a" * 24, "bud": "kc_" + "b" * 24}
    db = await Database.open(old_db_url, config_key_ids=config_ids)
    try:
        async with db.begin() as conn:
            ids = {r.name: r.id for r in await conn.execute(sa.select(api_keys.c.name, api_keys.c.id))}
            owners = {r.id: r.owner for r in await conn.execute(sa.select(responses.c.id, responses.c.owner))}
            query = sa.select(usage_ledger.c.request_id, usage_ledger.c.key_id)
            ledger = {r.request_id: r.key_id for r in await conn.execute(query)}
            audit = (
                await conn.execute(
                    sa.select(audit_log.c.target, audit_log.c.action, audit_log.c.target_id).order_by(audit_log.c.id)
                )
            ).all()
        assert sorted(ids) == ["bud", "ci", "flip"]
        assert all(re.fullmatch(r"kr_[0-9a-f]{24}", i) for i in ids.values()) and len(set(ids.values())) == 3
        assert owners["resp_new_ci"] == ids["ci"]
        assert owners["resp_old_ci"] not in (ids["ci"], "ci") and owners["resp_old_ci"].startswith("kr_")
        assert owners["resp_flip_new"] == ids["flip"] and owners["resp_flip_either"] == "legacy:flip"
        assert owners["resp_bud"] == "legacy:bud"
        assert owners["resp_team_a"] == config_ids["team-a"]
        assert owners["resp_ghost"] == "legacy:ghost" and owners["resp_anon"] == "anonymous"
        assert ledger == {
            "new-ci": ids["ci"],
            "old-ci": owners["resp_old_ci"],  # the deleted key's life: one id, held by nobody
            "bud": None,
            "team-a": config_ids["team-a"],
            "ghost": None,
        }
        ci_audit = [(action, target_id) for target, action, target_id in audit if target == "ci"]
        old_id = owners["resp_old_ci"]
        assert ci_audit == [("key.create", old_id), ("key.delete", old_id), ("key.create", ids["ci"])]
        store = ResponseStore(db)
        assert (await store.load("resp_new_ci", ids["ci"])) is not None
        assert (await store.load("resp_old_ci", ids["ci"])) is None  # the new holder of "ci" gets nothing old
        assert (await store.load("resp_team_a", config_ids["team-a"])) is not None
    finally:
        await db.aclose()


# -- fair sharing counts a key by its id -------------------------------------------------------------------


def test_two_keys_of_one_name_have_fair_share_counters_of_their_own():
    first = principal_of(KeyConfig(name="ci", sha256="1" * 64), "kr_" + "1" * 24)
    second = principal_of(KeyConfig(name="ci", sha256="2" * 64), "kr_" + "2" * 24)
    a, b = ticket_for(first, 1, 10), ticket_for(second, 1, 10)
    assert a.key != b.key and (a.label, b.label) == ("ci", "ci")
    config = principal_of(KeyConfig(name="ci", sha256="1" * 64))
    assert config.id == config_key_id("1" * 64) and config.id.startswith("kc_") and "1" * 64 not in config.id
