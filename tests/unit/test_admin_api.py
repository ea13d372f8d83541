"""The admin API in-process (httpx over ASGI, a real SQLite file in tmp_path, engines faked at the upstream
seam): keys created, listed, changed, revoked, rotated and deleted at runtime, and what that does on the
data plane at once; the admin role; the audit log (no secret in it); config-file keys read-only; errors as
JSON; a second replica picking changes up by polling; config reloads keeping the runtime keys; the admin
API alone on its own port."""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from llm_gateway.access.keys import Authenticator, RuntimeKey, digest_of, principal_of
from llm_gateway.admin.context import AdminContext
from llm_gateway.admin.server import AdminServer
from llm_gateway.app import create_app
from llm_gateway.errors import AuthenticationFailed
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.service.reload import ConfigWatcher
from llm_gateway.settings import AuthConfig, KeyConfig
from llm_gateway.settings.loader import ConfigError, parse_config
from llm_gateway.state.tables import api_keys
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

ADMIN_KEY = "sk-admin-root-0123456789"
OPS_KEY = "sk-admin-ops-0123456789"
CLIENT_KEY = "sk-client-alice-0123456789"
ENGINE_CHAT = "http://engine-a.test/v1/chat/completions"
CHAT = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}]}

CONFIG = """
server: {{access_log: false, data_dir: "{data_dir}"{server_extra}}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{alice}", models: ["public-*"], limits: {{rpm: 100}}}}
{admin}
backends:
  - {{name: engine-a, engine: vllm, url: "http://engine-a.test"}}
models:
  - name: public-model
    deployments:
      - {{backend: engine-a, model: upstream-model, format: safetensors}}
  - name: other-model
    deployments:
      - {{backend: engine-a, model: upstream-model, format: safetensors}}
"""


ADMIN = f"""
admin:
  keys:
    - {{name: root, sha256: "{digest_of(ADMIN_KEY)}"}}
    - {{name: ops, sha256: "{digest_of(OPS_KEY)}"}}
"""


def config_text(data_dir: Path, *, admin: bool = True, server_extra: str = "") -> str:
    return CONFIG.format(
        data_dir=data_dir, server_extra=server_extra, alice=digest_of(CLIENT_KEY), admin=ADMIN if admin else ""
    )


def engine_chat_json() -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def upstream() -> FakeUpstream:
    return FakeUpstream({("POST", ENGINE_CHAT): lambda *_: FakeAnswer.json(engine_chat_json())})


def admin_ctx(app: GatewayApp) -> AdminContext:
    assert app.admin is not None
    ctx: AdminContext = app.admin.state.admin  # type: ignore[attr-defined]
    return ctx


@asynccontextmanager
async def gateway(data_dir: Path, text: str | None = None) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayApp]]:
    cfg = parse_config(text if text is not None else config_text(data_dir), "test.yaml", {})
    app = create_app(cfg, upstream=upstream(), probes=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        try:
            yield client, app
        finally:
            if app.admin is not None:
                await (await admin_ctx(app).database()).aclose()
            await app.gw.aclose()


def as_admin(key: str = ADMIN_KEY) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return tmp_path / "data"


@pytest.fixture
async def gw(data_dir: Path) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayApp]]:
    async with gateway(data_dir) as pair:
        yield pair


async def create(client: httpx.AsyncClient, name: str = "ci", **fields: Any) -> dict[str, Any]:
    fields.setdefault("models", ["*"])  # required: a new key names the models it may use
    r = await client.post("/admin/keys", json={"name": name, **fields}, headers=as_admin())
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]


async def chat(client: httpx.AsyncClient, key: str, model: str = "public-model") -> httpx.Response:
    return await client.post("/v1/chat/completions", json={**CHAT, "model": model}, headers=bearer(key))


async def audit(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    r = await client.get("/admin/audit", params=params, headers=as_admin())
    assert r.status_code == 200, r.text
    return r.json()["data"]  # type: ignore[no-any-return]


async def stored_digest(app: GatewayApp, name: str) -> str:
    db = await admin_ctx(app).database()
    async with db.begin() as conn:
        return str((await conn.execute(sa.select(api_keys.c.sha256).where(api_keys.c.name == name))).scalar_one())


# -- create, list, read ----------------------------------------------------------------------------------


async def test_a_created_key_is_answered_once_stored_as_its_digest_and_works_at_once(gw):
    client, app = gw
    created = await create(client, "ci", models=["public-*"], limits={"rpm": 10})
    key = created["key"]
    assert key.startswith("sk-gw-") and len(key) > 40
    assert created["status"] == "active" and created["source"] == "runtime" and created["read_only"] is False
    assert created["sha256_prefix"] == digest_of(key)[:8]
    assert await stored_digest(app, "ci") == digest_of(key)

    assert (await chat(client, key)).status_code == 200  # this replica applies its own change at once
    assert (await chat(client, key, "other-model")).status_code == 403  # outside its models

    listed = await client.get("/admin/keys", headers=as_admin())
    one = await client.get("/admin/keys/ci", headers=as_admin())
    for text in (listed.text, one.text):
        assert key not in text and digest_of(key) not in text  # never the key again, never the whole digest
    assert one.json()["sha256_prefix"] == digest_of(key)[:8] and "key" not in one.json()
    assert one.json()["limits"]["rpm"] == 10 and one.json()["models"] == ["public-*"]


async def test_the_list_holds_config_keys_read_only_and_runtime_keys(gw):
    client, _ = gw
    await create(client, "ci")
    data = (await client.get("/admin/keys", headers=as_admin())).json()["data"]
    by_name = {k["name"]: k for k in data}
    assert set(by_name) == {"alice", "ci"}
    alice = by_name["alice"]
    assert alice["source"] == "config" and alice["read_only"] is True and alice["status"] == "active"
    assert alice["sha256_prefix"] == digest_of(CLIENT_KEY)[:8] and alice["limits"]["rpm"] == 100
    assert digest_of(CLIENT_KEY) not in str(data)
    assert by_name["ci"]["source"] == "runtime"
    assert (await client.get("/admin/keys/alice", headers=as_admin())).json()["read_only"] is True


async def test_config_keys_cannot_be_changed_here(gw):
    client, _ = gw
    for method, path, body in (
        ("PATCH", "/admin/keys/alice", {"models": ["*"]}),
        ("POST", "/admin/keys/alice/revoke", None),
        ("POST", "/admin/keys/alice/rotate", None),
        ("DELETE", "/admin/keys/alice", None),
    ):
        r = await client.request(method, path, json=body, headers=as_admin())
        assert r.status_code == 409, (method, path, r.text)
        assert r.json()["error"]["code"] == "read_only_key"
    r = await client.post("/admin/keys", json={"name": "alice", "models": ["*"]}, headers=as_admin())
    assert r.status_code == 409 and r.json()["error"]["code"] == "name_taken"
    assert (await chat(client, CLIENT_KEY)).status_code == 200  # and it still works
    assert await audit(client) == []  # nothing happened


async def test_a_name_is_taken_once_and_an_unknown_key_is_404(gw):
    client, _ = gw
    await create(client, "ci")
    r = await client.post("/admin/keys", json={"name": "ci", "models": ["*"]}, headers=as_admin())
    assert r.status_code == 409 and r.json()["error"]["code"] == "name_taken"
    for method, path in (
        ("GET", "/admin/keys/nobody"),
        ("PATCH", "/admin/keys/nobody"),
        ("POST", "/admin/keys/nobody/revoke"),
        ("POST", "/admin/keys/nobody/rotate"),
        ("DELETE", "/admin/keys/nobody"),
    ):
        r = await client.request(
            method, path, json={"models": ["*"]} if method == "PATCH" else None, headers=as_admin()
        )
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["code"] == "key_not_found"


# -- change, revoke, rotate, delete ----------------------------------------------------------------------


async def test_patch_changes_models_limits_and_expiry_and_audits_from_and_to(gw):
    client, _ = gw
    key = (await create(client, "ci", models=["public-*"]))["key"]
    r = await client.patch(
        "/admin/keys/ci",
        json={"models": ["other-*"], "limits": {"rpm": 2}, "expires_at": "2999-01-01T00:00:00Z"},
        headers=as_admin(),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["models"] == ["other-*"] and body["limits"]["rpm"] == 2
    assert body["expires_at"].startswith("2999-01-01T00:00:00")
    assert (await chat(client, key)).status_code == 403  # the new models apply at once (a request of the minute)
    assert (await chat(client, key, "other-model")).status_code == 200
    assert (await chat(client, key, "other-model")).status_code == 429  # and the new limit: 2 a minute
    [entry] = await audit(client, action="key.update")
    assert entry["changes"]["models"] == {"from": ["public-*"], "to": ["other-*"]}
    assert entry["changes"]["limits"] == {"from": {}, "to": {"rpm": 2}}
    assert entry["changes"]["expires_at"]["from"] is None
    # expires_at: null removes the expiry; a patch that changes nothing is answered but not audited
    r = await client.patch("/admin/keys/ci", json={"expires_at": None}, headers=as_admin())
    assert r.json()["expires_at"] is None
    await client.patch("/admin/keys/ci", json={"models": ["other-*"]}, headers=as_admin())
    assert len(await audit(client, action="key.update")) == 2


async def test_a_revoked_key_is_refused_at_once_stays_listed_and_revoking_again_changes_nothing(gw):
    client, _ = gw
    key = (await create(client, "ci"))["key"]
    assert (await chat(client, key)).status_code == 200
    r = await client.post("/admin/keys/ci/revoke", headers=as_admin())
    assert r.status_code == 200 and r.json()["status"] == "revoked" and r.json()["revoked_at"]
    refused = await chat(client, key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert (await client.get("/admin/keys/ci", headers=as_admin())).json()["status"] == "revoked"
    assert (await client.post("/admin/keys/ci/revoke", headers=as_admin())).status_code == 200
    assert len(await audit(client, action="key.revoke")) == 1
    r = await client.post("/admin/keys/ci/rotate", headers=as_admin())
    assert r.status_code == 409 and r.json()["error"]["code"] == "key_revoked"


async def test_rotate_answers_a_new_key_once_and_the_old_one_stops_working(gw):
    client, app = gw
    old = (await create(client, "ci", limits={"rpm": 50}))["key"]
    r = await client.post("/admin/keys/ci/rotate", headers=as_admin())
    assert r.status_code == 200, r.text
    new = r.json()["key"]
    assert new != old and r.json()["sha256_prefix"] == digest_of(new)[:8] and r.json()["limits"]["rpm"] == 50
    assert await stored_digest(app, "ci") == digest_of(new)
    assert (await chat(client, old)).status_code == 401
    assert (await chat(client, new)).status_code == 200


async def test_delete_refuses_the_key_forgets_it_and_frees_its_name(gw):
    client, _ = gw
    key = (await create(client, "ci"))["key"]
    r = await client.delete("/admin/keys/ci", headers=as_admin())
    assert r.status_code == 204 and r.content == b""
    assert (await chat(client, key)).status_code == 401
    assert (await client.get("/admin/keys/ci", headers=as_admin())).status_code == 404
    again = (await create(client, "ci"))["key"]
    assert (await chat(client, again)).status_code == 200


async def test_a_runtime_keys_limits_and_model_limits_apply_like_a_config_keys(gw):
    client, _ = gw
    key = (await create(client, "ci", limits={"rpm": 3}, model_limits={"other-*": {"rpm": 1}}))["key"]
    assert (await chat(client, key, "other-model")).status_code == 200
    assert (await chat(client, key, "other-model")).status_code == 429  # the model's limit: 1
    # the key's own limit: 3 in all (the refused request took nothing)
    assert [(await chat(client, key)).status_code for _ in range(3)] == [200, 200, 429]


# -- roles ---------------------------------------------------------------------------------------------


async def test_admin_and_client_keys_are_separate_roles(gw):
    client, _ = gw
    for headers in ({}, bearer(CLIENT_KEY), bearer("sk-wrong"), {"authorization": f"Basic {ADMIN_KEY}"}):
        r = await client.get("/admin/keys", headers=headers)
        assert r.status_code == 401, (headers, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"]["code"] in ("missing_api_key", "invalid_api_key")
    assert (await client.get("/admin/keys")).json()["error"]["code"] == "missing_api_key"
    assert (await client.get("/admin/keys", headers={"x-api-key": OPS_KEY})).status_code == 200
    # an admin key is no client key, and a runtime client key is no admin key
    assert (await chat(client, ADMIN_KEY)).status_code == 401
    key = (await create(client, "ci"))["key"]
    assert (await client.get("/admin/keys", headers=bearer(key))).status_code == 401


def test_a_digest_in_both_admin_and_client_keys_is_refused_by_the_config(tmp_path: Path):
    text = config_text(tmp_path).replace(digest_of(ADMIN_KEY), digest_of(CLIENT_KEY))
    with pytest.raises(ConfigError, match="an admin key must not also be a client key") as caught:
        parse_config(text, "test.yaml", {})
    assert digest_of(CLIENT_KEY) not in str(caught.value)


# -- audit ---------------------------------------------------------------------------------------------


async def test_every_change_is_audited_with_who_what_and_when_and_no_secret(gw, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    client, _ = gw
    t0 = int(time.time())
    first = (await create(client, "ci", models=["public-*"]))["key"]
    await client.patch("/admin/keys/ci", json={"limits": {"rpm": 5}}, headers={"x-api-key": OPS_KEY})
    second = (await client.post("/admin/keys/ci/rotate", headers=as_admin())).json()["key"]
    await client.post("/admin/keys/ci/revoke", headers=as_admin())
    await client.delete("/admin/keys/ci", headers=as_admin())
    r = await client.get("/admin/audit", headers=as_admin())
    entries = r.json()["data"]
    assert [(e["action"], e["actor"], e["target"]) for e in entries] == [
        ("key.delete", "root", "ci"),
        ("key.revoke", "root", "ci"),
        ("key.rotate", "root", "ci"),
        ("key.update", "ops", "ci"),
        ("key.create", "root", "ci"),
    ]
    assert entries[-1]["changes"]["models"] == ["public-*"]
    assert entries[2]["changes"] == {"key": "rotated"}
    for e in entries:
        assert t0 - 1 <= datetime.fromisoformat(e["at"]).timestamp() <= time.time() + 1
    ours = "\n".join(rec.getMessage() for rec in caplog.records if rec.name.startswith(("gateway", "llm_gateway")))
    for secret in (first, second, ADMIN_KEY, OPS_KEY):
        assert secret not in r.text and secret not in caplog.text  # in no log at all, the libraries' included
    for digest in (digest_of(first), digest_of(second), digest_of(first)[:8]):
        assert digest not in r.text and digest not in ours


async def test_the_audit_log_filters_and_pages_newest_first(gw):
    client, _ = gw
    for name in ("a", "b", "c"):
        await create(client, name)
    await client.post("/admin/keys/b/revoke", headers=as_admin())
    assert [e["target"] for e in await audit(client, action="key.create")] == ["c", "b", "a"]
    assert [e["action"] for e in await audit(client, target="b")] == ["key.revoke", "key.create"]
    assert await audit(client, actor="ops") == []
    page = (await client.get("/admin/audit", params={"limit": 2}, headers=as_admin())).json()
    assert page["has_more"] is True and len(page["data"]) == 2
    rest = await audit(client, before=page["next_before"], limit=10)
    assert [e["id"] for e in page["data"] + rest] == sorted((e["id"] for e in page["data"] + rest), reverse=True)
    assert len(page["data"] + rest) == 4
    assert (await client.get("/admin/audit", params={"limit": 0}, headers=as_admin())).status_code == 422


# -- errors ----------------------------------------------------------------------------------------------


async def test_bad_requests_are_json_errors_that_name_the_field_and_echo_no_value(gw):
    client, _ = gw
    secretish = "sk-pasted-by-mistake-1234567890"
    cases = [
        ({"name": "has space", "models": ["*"]}, "name"),
        ({"name": "ok", "models": ["*"], "limits": {"rpm": -1}}, "limits.rpm"),
        ({"name": "ok", "models": ["*"], "unknown": secretish}, "unknown"),
        ({"name": "ok", "models": ["*"], "expires_at": "2001-01-01T00:00:00Z"}, "expires_at"),
        ({"name": "ok", "models": ["*"], "expires_at": "2999-01-01T00:00:00"}, "expires_at"),  # no time zone
        ({"name": "ok"}, "models"),  # a new key names its models: no permissive default
        ({"models": ["*"]}, "name"),
    ]
    for body, param in cases:
        r = await client.post("/admin/keys", json=body, headers=as_admin())
        assert r.status_code == 422, (body, r.text)
        err = r.json()["error"]
        assert err["code"] == "validation_error" and err["type"] == "invalid_request_error"
        assert err["param"] == param, (body, err)
        assert secretish not in r.text
        assert err["details"] and all(set(d) == {"loc", "msg", "type"} for d in err["details"])
    r = await client.post(
        "/admin/keys", content=b"{not json", headers={**as_admin(), "content-type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    await create(client, "ci")
    r = await client.patch("/admin/keys/ci", json={}, headers=as_admin())
    assert r.status_code == 400 and r.json()["error"]["code"] == "empty_update"
    r = await client.patch("/admin/keys/ci", json={"models": None}, headers=as_admin())
    assert r.status_code == 422 and "models cannot be null" in r.json()["error"]["message"]
    r = await client.post("/admin/keys", json={"name": "big", "models": ["x" * 200] * 2000}, headers=as_admin())
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    async def chunked():  # no content-length: the limit holds as the body streams in
        yield b'{"name": "big", "models": ['
        for _ in range(400):
            yield b'"' + b"x" * 1000 + b'",'
        yield b'"*"]}'

    r = await client.post("/admin/keys", content=chunked(), headers={**as_admin(), "content-type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    r = await client.get("/admin/nothing-here", headers=as_admin())
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await client.put("/admin/keys", headers=as_admin())
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"


async def test_the_openapi_document_is_under_admin_for_admin_keys_and_the_docs_page_is_off(gw):
    client, _ = gw
    doc = (await client.get("/admin/openapi.json", headers=as_admin())).json()
    assert {"/admin/keys", "/admin/keys/{name}", "/admin/keys/{name}/rotate", "/admin/audit"} <= set(doc["paths"])
    assert "HTTPBearer" in doc["components"]["securitySchemes"]
    assert (await client.get("/admin/openapi.json")).status_code == 401
    assert (await client.get("/admin/docs", headers=as_admin())).status_code == 404  # admin.docs is off
    assert (await client.get("/openapi.json")).json()["paths"].keys().isdisjoint(doc["paths"])


async def test_without_admin_keys_there_is_no_admin_api_and_no_database(tmp_path: Path):
    data_dir = tmp_path / "data"
    async with gateway(data_dir, config_text(data_dir, admin=False)) as (client, app):
        assert app.admin is None
        r = await client.get("/admin/keys", headers=as_admin())
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"  # the data plane's 404
        assert (await chat(client, CLIENT_KEY)).status_code == 200
    assert not data_dir.exists()


# -- replicas, reloads, expiry ---------------------------------------------------------------------------


async def test_another_replica_sees_changes_at_its_next_poll_and_keeps_unchanged_principals(data_dir: Path):
    async with gateway(data_dir) as (one, _), gateway(data_dir) as (two, app_two):
        refresher = admin_ctx(app_two).refresher
        assert await refresher.refresh() is True  # the first poll loads (no keys yet)
        key = (await create(one, "ci"))["key"]
        other = (await create(one, "other"))["key"]
        assert (await chat(two, key)).status_code == 401  # not polled yet: the request path reads no database
        assert await refresher.refresh() is True
        assert (await chat(two, key)).status_code == 200
        principal = app_two.gw.runtime.auth.authenticate(bearer(key)["authorization"].encode(), None)
        assert await refresher.refresh() is False  # nothing moved: no reload
        await one.post("/admin/keys/other/revoke", headers=as_admin())
        assert await refresher.refresh() is True
        assert (await chat(two, other)).status_code == 401
        # the unchanged key kept its principal object (the limiter's caches stay warm)
        assert app_two.gw.runtime.auth.authenticate(bearer(key)["authorization"].encode(), None) is principal
        await one.delete("/admin/keys/ci", headers=as_admin())
        assert await refresher.refresh() is True  # a deletion moves the revision too
        assert (await chat(two, key)).status_code == 401


async def test_a_config_reload_keeps_the_runtime_keys(data_dir: Path, tmp_path: Path):
    path = tmp_path / "gateway.yaml"
    path.write_text(config_text(data_dir))
    async with gateway(data_dir, path.read_text()) as (client, app):
        key = (await create(client, "ci"))["key"]
        path.write_text(config_text(data_dir).replace("rpm: 100", "rpm: 99"))
        before = app.gw.runtime
        assert await ConfigWatcher(app.gw, str(path), 0).reload("test") is True
        assert app.gw.runtime is not before and app.gw.runtime.config.auth.keys[0].limits.rpm == 99
        assert (await chat(client, key)).status_code == 200
        assert (await chat(client, CLIENT_KEY)).status_code == 200


def test_an_expired_runtime_key_is_refused_as_expired():
    auth = Authenticator(AuthConfig(mode="keys"))
    fresh, stale = "sk-fresh-0123456789", "sk-stale-0123456789"
    keys = {}
    for name, secret, expires in (("fresh", fresh, time.time() + 3600), ("stale", stale, time.time() - 1)):
        k = KeyConfig(name=name, sha256=digest_of(secret))
        keys[hashlib.sha256(secret.encode()).digest()] = RuntimeKey(bytes.fromhex(k.sha256), principal_of(k), expires)
    auth.set_runtime_keys(keys)
    assert auth.authenticate(f"Bearer {fresh}".encode(), None).name == "fresh"
    with pytest.raises(AuthenticationFailed) as caught:
        auth.authenticate(f"Bearer {stale}".encode(), None)
    assert caught.value.code == "expired_api_key"
    assert RuntimeKey(b"", principal_of(KeyConfig(name="x", sha256="0" * 64))).expires_at == math.inf


async def test_an_expiry_reached_after_creation_refuses_the_key_and_lists_it_expired(gw):
    client, app = gw
    key = (await create(client, "ci", expires_at="2999-01-01T00:00:00Z"))["key"]
    assert (await chat(client, key)).status_code == 200
    far = datetime(2999, 1, 1, tzinfo=UTC).timestamp() + 1  # past the expiry by the admin API's clock
    admin_ctx(app).clock = lambda: far
    assert (await client.get("/admin/keys/ci", headers=as_admin())).json()["status"] == "expired"


# -- the admin port --------------------------------------------------------------------------------------


async def test_with_an_admin_port_the_admin_api_is_served_there_alone(data_dir: Path):
    text = config_text(data_dir, server_extra=", admin_port: 0")
    async with gateway(data_dir, text) as (client, app):
        assert app.admin is None
        r = await client.get("/admin/keys", headers=as_admin())
        assert r.status_code == 404  # not on the main port
    cfg = parse_config(text, "test.yaml", {})
    app = create_app(cfg, upstream=upstream(), probes=False)
    from llm_gateway.admin.app import build_admin_app
    from llm_gateway.admin.refresh import KeyRefresher

    ctx = None
    server = None
    try:
        db_box: list[Any] = []

        async def database() -> Any:
            if not db_box:
                from llm_gateway.state.database import Database

                db_box.append(await Database.from_config(cfg))
            return db_box[0]

        ctx = AdminContext(app.gw, database, KeyRefresher(app.gw, database, 1.0))
        server = AdminServer(build_admin_app(ctx), cfg.server, "127.0.0.1", 0)
        await server.start()
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as c:
            r = await c.post("/admin/keys", json={"name": "ci", "models": ["*"]}, headers=as_admin())
            assert r.status_code == 201, r.text
            assert (await c.get("/admin/keys", headers=bearer(CLIENT_KEY))).status_code == 401
            assert (await c.get("/admin/openapi.json", headers=as_admin())).status_code == 200
    finally:
        if server is not None:
            await server.aclose()
        if db_box:
            await db_box[0].aclose()
        await app.gw.aclose()


PROBE = """
import sys
from llm_gateway.settings.loader import parse_config
from llm_gateway.app import create_app
create_app(parse_config(sys.argv[1], "t.yaml", {}), probes=False)
print("fastapi" in sys.modules, "sqlalchemy" in sys.modules)
"""


@pytest.mark.parametrize("admin", [False, True])
def test_fastapi_and_sqlalchemy_are_imported_only_with_admin_keys(tmp_path: Path, admin: bool):
    import subprocess
    import sys

    text = config_text(tmp_path / "data", admin=admin)
    out = subprocess.run([sys.executable, "-c", PROBE, text], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == [str(admin), str(admin)], out.stderr
