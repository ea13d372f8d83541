"""No admin input breaks the gateway (red-team report 2026-12-04, M3 and L9's permissive default).

Reproductions against a real gateway process in front of a vLLM emulator: every number an admin sends is
range-checked (finite, within bounds the limit stores count exactly) and refused with a 422 in the admin
API's envelope, never stored to break the key listing or the key's requests, never a plain-text 500. A
row that an older version stored malformed is listed, not a 500. A new runtime key must say which models
it may use. The config file's limits take the same bounds. And a failure no check foresaw is a 500 in the
admin envelope, its detail in the log only.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.admin.store import KeyStore
from llm_gateway.app import create_app
from llm_gateway.settings.loader import ConfigError, parse_config
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.fake_upstream import FakeUpstream
from tests.support.gateway_process import GatewayProcess

ADMIN_KEY = "sk-admin-input-0123456789abcdef"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"}
HUGE = "1" + "0" * 30  # an integer past 2**64, as JSON digits

CONFIG = """
server: {{access_log: false, data_dir: "{data_dir}", reload_poll_s: 0}}
admin:
  keys: [{{name: root, sha256: "{admin}"}}]
auth: {{mode: keys}}
backends:
  - {{name: emu-vllm, engine: vllm, url: "{engine}", probe: {{interval_s: 0.5}}}}
models:
  - name: beta-70b
    price: {{input_per_million: 1.0, output_per_million: 2.0}}
    deployments: [{{backend: emu-vllm, model: tiny, format: safetensors}}]
"""


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("admin-input")
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as emu:
        text = CONFIG.format(data_dir=work / "data", admin=digest_of(ADMIN_KEY), engine=emu.url)
        with GatewayProcess(text, work) as gw:
            yield gw


def post_raw(gw: GatewayProcess, path: str, body: str, method: str = "POST") -> httpx.Response:
    return httpx.request(method, gw.url + path, content=body.encode(), headers=ADMIN, timeout=30)


def list_keys(gw: GatewayProcess) -> httpx.Response:
    return httpx.get(gw.url + "/admin/keys", headers=ADMIN, timeout=30)


def chat(gw: GatewayProcess, key: str) -> httpx.Response:
    body = {"model": "beta-70b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})


def assert_refused(r: httpx.Response, param: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    err = r.json()["error"]
    assert err["code"] == "validation_error" and err["type"] == "invalid_request_error", err
    assert err["param"] == param, err


def test_an_infinite_cost_budget_is_refused_and_the_key_list_keeps_working(gateway: GatewayProcess):
    r = post_raw(gateway, "/admin/keys", '{"name":"inf","models":["*"],"limits":{"budget":{"cost":1e999}}}')
    assert_refused(r, "limits.budget.cost")
    assert list_keys(gateway).status_code == 200
    assert httpx.get(gateway.url + "/admin/keys/inf", headers=ADMIN).status_code == 404


def test_a_cost_budget_too_large_to_count_is_refused(gateway: GatewayProcess):
    r = post_raw(gateway, "/admin/keys", '{"name":"bigcost","models":["*"],"limits":{"budget":{"cost":1e308}}}')
    assert_refused(r, "limits.budget.cost")
    # the largest accepted cost is counted: the key works
    ok = post_raw(gateway, "/admin/keys", '{"name":"maxcost","models":["*"],"limits":{"budget":{"cost":9000000}}}')
    assert ok.status_code == 201, ok.text
    answer = chat(gateway, ok.json()["key"])
    assert answer.status_code == 200, answer.text


def test_an_integer_past_64_bits_is_a_422_in_the_envelope_not_a_plain_text_500(gateway: GatewayProcess):
    r = post_raw(gateway, "/admin/keys", f'{{"name":"huge","models":["*"],"limits":{{"rpm":{HUGE}}}}}')
    assert_refused(r, "limits.rpm")
    assert list_keys(gateway).status_code == 200


BAD_LIMITS = [
    ("rpm", HUGE),
    ("rpm", "-1"),
    ("rpm", "1.5"),
    ("tpm", HUGE),
    ("concurrency", HUGE),
    ("budget", f'{{"tokens":{HUGE}}}'),
    ("budget", '{"tokens":-5}'),
    ("budget", '{"cost":-1}'),
    ("budget", '{"cost":NaN}'),
    ("budget", '{"cost":Infinity}'),
    ("budget", '{"cost":-1e999}'),
    ("budget", '{"cost":1e20}'),
]


@pytest.mark.parametrize(("field", "value"), BAD_LIMITS)
def test_every_limit_field_is_range_checked_on_create_and_update_and_in_model_limits(
    gateway: GatewayProcess, field: str, value: str
):
    param = f"limits.{field}" + (".tokens" if "tokens" in value else ".cost" if "cost" in value else "")
    created = post_raw(gateway, "/admin/keys", f'{{"name":"rc","models":["*"],"limits":{{"{field}":{value}}}}}')
    assert_refused(created, param)
    in_model = post_raw(
        gateway, "/admin/keys", f'{{"name":"rc","models":["*"],"model_limits":{{"b*":{{"{field}":{value}}}}}}}'
    )
    assert_refused(in_model, "model_limits.b*." + param.removeprefix("limits."))
    if httpx.get(gateway.url + "/admin/keys/rc-ok", headers=ADMIN).status_code == 404:
        assert post_raw(gateway, "/admin/keys", '{"name":"rc-ok","models":["*"]}').status_code == 201
    patched = post_raw(gateway, "/admin/keys/rc-ok", f'{{"limits":{{"{field}":{value}}}}}', method="PATCH")
    assert_refused(patched, param)
    assert list_keys(gateway).status_code == 200


@pytest.mark.parametrize(
    ("query", "param"),
    [({"before": HUGE}, "before"), ({"limit": HUGE}, "limit"), ({"actor": "x" * 300}, "actor")],
)
def test_the_audit_logs_query_is_range_checked(gateway: GatewayProcess, query: dict[str, str], param: str):
    r = httpx.get(gateway.url + "/admin/audit", params=query, headers=ADMIN, timeout=30)
    assert_refused(r, param)


def test_an_expiry_past_the_last_representable_time_is_refused(gateway: GatewayProcess):
    # 9999-12-31T23:59:59-14:00 is in the year 10000 in UTC: no datetime can answer it
    r = post_raw(gateway, "/admin/keys", '{"name":"far","models":["*"],"expires_at":"9999-12-31T23:59:59-14:00"}')
    assert_refused(r, "expires_at")
    assert list_keys(gateway).status_code == 200
    near = post_raw(gateway, "/admin/keys", '{"name":"far","models":["*"],"expires_at":"9000-01-01T00:00:00Z"}')
    assert near.status_code == 201, near.text
    assert near.json()["expires_at"].startswith("9000-01-01")


def test_a_row_an_older_version_stored_malformed_is_listed_not_a_500(gateway: GatewayProcess):
    r = post_raw(gateway, "/admin/keys", '{"name":"legacy","models":["*"]}')
    assert r.status_code == 201, r.text
    db = sqlite3.connect(Path(gateway.workdir) / "data" / "llm-gateway.db")
    with db:  # what the old version stored for `cost: 1e999`
        db.execute("UPDATE api_keys SET limits = ? WHERE name = 'legacy'", ('{"budget":{"cost":null}}',))
        db.execute("UPDATE api_keys_revision SET revision = revision + 1")
    db.close()
    listed = list_keys(gateway)
    assert listed.status_code == 200, listed.text
    [legacy] = [k for k in listed.json()["data"] if k["name"] == "legacy"]
    assert legacy["status"] == "malformed"
    one = httpx.get(gateway.url + "/admin/keys/legacy", headers=ADMIN)
    assert one.status_code == 200 and one.json()["status"] == "malformed"
    # the admin repairs it with a PATCH, and it is a working key again
    fixed = post_raw(gateway, "/admin/keys/legacy", '{"limits":{"rpm":5}}', method="PATCH")
    assert fixed.status_code == 200, fixed.text
    assert fixed.json()["status"] == "active"


# -- L9: no permissive default -------------------------------------------------------------------------------


def test_a_new_runtime_key_must_name_its_models(gateway: GatewayProcess):
    r = post_raw(gateway, "/admin/keys", '{"name":"lazy"}')
    assert_refused(r, "models")
    assert "models" in r.json()["error"]["message"]
    assert httpx.get(gateway.url + "/admin/keys/lazy", headers=ADMIN).status_code == 404
    everything = post_raw(gateway, "/admin/keys", '{"name":"lazy","models":["*"]}')
    assert everything.status_code == 201 and everything.json()["models"] == ["*"]


# -- the config file takes the same bounds --------------------------------------------------------------------


FILE = """
usage: {{ledger: true}}
auth:
  keys:
    - {{name: k, sha256: "{digest}", models: ["*"], limits: {limits}}}
backends: [{{name: e, engine: vllm, url: "http://e.test"}}]
models:
  - name: m
    price: {price}
    deployments: [{{backend: e, model: u, format: safetensors}}]
"""
PRICE = "{input_per_million: 1, output_per_million: 1}"


def test_the_config_file_used_here_is_valid():
    parse_config(FILE.format(digest="0" * 64, limits="{rpm: 5, budget: {cost: 9000000}}", price=PRICE), "t.yaml", {})


@pytest.mark.parametrize(
    ("limits", "field"),
    [
        ("{budget: {cost: 1e308}}", "limits.budget.cost"),
        ("{budget: {cost: .inf}}", "limits.budget.cost"),
        (f"{{rpm: {HUGE}}}", "limits.rpm"),
        (f"{{budget: {{tokens: {HUGE}}}}}", "limits.budget.tokens"),
    ],
)
def test_the_config_file_refuses_limits_the_stores_cannot_count(limits: str, field: str):
    with pytest.raises(ConfigError, match=re.escape(f"auth.keys[0].{field}")):
        parse_config(FILE.format(digest="0" * 64, limits=limits, price=PRICE), "t.yaml", {})


@pytest.mark.parametrize(
    "price", ["{input_per_million: .inf, output_per_million: 1}", "{input_per_million: 1, output_per_million: .nan}"]
)
def test_prices_are_finite_in_the_config_file(price: str):
    with pytest.raises(ConfigError, match=r"models\[0\]\.price"):
        parse_config(FILE.format(digest="0" * 64, limits="{}", price=price), "t.yaml", {})


# -- whatever a route raises is answered in the envelope --------------------------------------------------------


async def test_an_unexpected_failure_is_a_500_in_the_admin_envelope_not_plain_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    text = CONFIG.format(data_dir=tmp_path / "data", admin=digest_of(ADMIN_KEY), engine="http://engine.test")
    app = create_app(parse_config(text, "t.yaml", {}), upstream=FakeUpstream({}), probes=False)

    async def broken(self: KeyStore) -> list[Any]:
        raise RuntimeError("a bug with a detail the client must not see")

    monkeypatch.setattr(KeyStore, "all", broken)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
            r = await client.get("/admin/keys", headers=ADMIN)
    finally:
        assert app.admin is not None
        await (await app.admin.state.admin.database()).aclose()  # type: ignore[attr-defined]
        await app.gw.aclose()
    assert r.status_code == 500
    assert r.headers["content-type"].startswith("application/json"), r.text
    assert r.json()["error"]["code"] == "internal_error" and r.json()["error"]["type"] == "server_error"
    assert "detail the client must not see" not in r.text
