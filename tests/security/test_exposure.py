"""What the gateway shows to whom (red-team L3, L4, L5 and L9's CORS line), each test from its reproduction.

- L3: `/metrics` on the main port showed key names and per-key usage to anyone. Now, without
  `server.metrics_auth`, it leaves out every series labelled by key (the metrics port keeps them); with it,
  it needs the metrics token and then shows everything.
- L4: admin requests and refused admin keys left no trace. Now each admin request has an access-log line
  (the admin's name, never a key) and refused keys count in `gateway_admin_auth_failures_total`.
- L5: `/admin/docs` was Swagger UI from a CDN. Now it is off unless `admin.docs`, and then an offline page
  with no script and a CSP that allows nothing.
- L9: browsers could not read the budget headers nor `x-gateway-stored`: every header of the gateway's
  own that an answer carries is in `Access-Control-Expose-Headers`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import orjson
import pytest

from llm_gateway.http.cors import EXPOSED
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.conftest import ONE_BACKEND, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import free_port
from tests.unit.test_request_path import ENGINE_CHAT, engine_chat_json

ADMIN_KEY = "sk-admin-exposure-0123456789abcdef"
WRONG_ADMIN_KEY = "sk-admin-wrong-secret-value-42"
METRICS_TOKEN = "metrics-token-0123456789"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(engine: EmulatorThread, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    work = tmp_path_factory.mktemp("exposure")
    text = f"""
    server: {{access_log: true, metrics_port: {free_port()}, reload_poll_s: 0, data_dir: "{work / "data"}"}}
    admin: {{keys: [{{name: root, sha256: "{sha(ADMIN_KEY)}"}}]}}
    auth: {{mode: keys, keys: [{{name: team-secretive, sha256: "{sha(TEST_KEY)}", models: ["*"]}}]}}
    backends: [{{name: emu, engine: vllm, url: "{engine.url}"}}]
    models: [{{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}]
    """
    with GatewayProcess(text, work) as gw:
        yield gw


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


def chat(gw: GatewayProcess) -> None:
    import urllib.request

    req = urllib.request.Request(
        gw.url + "/v1/chat/completions",
        data=orjson.dumps(CHAT),
        headers={"authorization": f"Bearer {TEST_KEY}", "content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def metrics_port_of(gw: GatewayProcess) -> int:
    import re

    return int(re.search(r"metrics_port: (\d+)", gw.config_path.read_text()).group(1))  # type: ignore[union-attr]


# -- L3 -----------------------------------------------------------------------------------------------------------
def test_metrics_on_the_main_port_show_no_key_names_or_per_key_usage_to_anyone(gateway: GatewayProcess) -> None:
    chat(gateway)  # team-secretive's tokens are counted now
    status, _, body = get(gateway.url + "/metrics")
    assert status == 200
    assert b'key="' not in body and b"team-secretive" not in body
    assert b"gateway_requests_total{" in body  # the rest is there
    # the metrics port, for the operator's network, has the per-key series
    status, _, full = get(f"http://127.0.0.1:{metrics_port_of(gateway)}/metrics")
    assert status == 200 and b'key="team-secretive"' in full


async def test_with_metrics_auth_the_main_port_needs_the_token_and_then_shows_every_series() -> None:
    text = ONE_BACKEND.replace(
        "server: {access_log: false}",
        f'server: {{access_log: false, metrics_auth: {{sha256: "{sha(METRICS_TOKEN)}"}}}}',
    )
    up = FakeUpstream({("POST", ENGINE_CHAT): lambda *_: FakeAnswer.json(engine_chat_json())})
    async with gateway_client(make_config(text), upstream=up) as (client, _):
        chat_reply = await client.post("/v1/chat/completions", json={**CHAT, "model": "public-model"})
        assert chat_reply.status_code == 200
        anyone = await client.get("/metrics", headers={"authorization": ""})
        wrong = await client.get("/metrics", headers={"authorization": "Bearer not-the-token"})
        a_client_key = await client.get("/metrics")  # the client's own key is no metrics token
        token = await client.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"})
    for refused in (anyone, wrong, a_client_key):
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        assert b"gateway_" not in refused.content
    assert token.status_code == 200 and 'key="alice"' in token.text


def test_a_metrics_token_must_be_a_digest() -> None:
    with pytest.raises(Exception, match="64 hex characters"):
        make_config(ONE_BACKEND.replace("server: {access_log: false}", 'server: {metrics_auth: {sha256: "plain"}}'))


# -- L4 -----------------------------------------------------------------------------------------------------------
def access_lines(gw: GatewayProcess) -> list[dict[str, object]]:
    out = []
    for line in gw.log_text().splitlines():
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if rec.get("logger") == "gateway.access" and str(rec.get("path", "")).startswith("/admin"):
            out.append(rec)
    return out


def test_admin_requests_and_refused_admin_keys_leave_an_access_line_and_a_count(gateway: GatewayProcess) -> None:
    from tests.support.waiting import wait_until

    status, _, _ = get(gateway.url + "/admin/keys", {"authorization": f"Bearer {WRONG_ADMIN_KEY}"})
    assert status == 401
    status, _, _ = get(gateway.url + "/admin/audit")
    assert status == 401
    status, _, _ = get(gateway.url + "/admin/keys", {"authorization": f"Bearer {ADMIN_KEY}"})
    assert status == 200
    lines = wait_until(lambda: (lambda got: got if len(got) >= 3 else None)(access_lines(gateway)), what="admin lines")
    wrong, missing, ok = lines[-3:]
    assert (wrong["path"], wrong["status"], wrong["auth_failure"], wrong["admin"]) == (
        "/admin/keys",
        401,
        "invalid_api_key",
        None,
    )
    assert wrong["client"] == "127.0.0.1" and wrong["method"] == "GET"
    assert (missing["path"], missing["auth_failure"]) == ("/admin/audit", "missing_api_key")
    assert (ok["status"], ok["admin"]) == (200, "root") and "auth_failure" not in ok
    log = gateway.log_text()
    assert WRONG_ADMIN_KEY not in log and ADMIN_KEY not in log and sha(WRONG_ADMIN_KEY) not in log
    _, _, body = get(gateway.url + "/metrics")
    assert b'gateway_admin_auth_failures_total{reason="invalid_api_key"} 1.0' in body
    assert b'gateway_admin_auth_failures_total{reason="missing_api_key"} 1.0' in body
    assert b'gateway_admin_requests_total{status_class="2xx"}' in body


# -- L5 -----------------------------------------------------------------------------------------------------------
def test_the_admin_docs_are_off_by_default_and_load_nothing_from_a_cdn(gateway: GatewayProcess) -> None:
    for headers in ({}, {"authorization": f"Bearer {ADMIN_KEY}"}):
        status, _, body = get(gateway.url + "/admin/docs", headers)
        assert status in (401, 404), status
        assert b"cdn.jsdelivr" not in body and b"<script" not in body


async def test_admin_docs_when_on_are_an_offline_page_with_no_script(tmp_path) -> None:  # type: ignore[no-untyped-def]
    text = f"""
    server: {{access_log: false, data_dir: "{tmp_path / "data"}"}}
    admin: {{docs: true, keys: [{{name: root, sha256: "{sha(ADMIN_KEY)}"}}]}}
    auth: {{mode: keys, keys: [{{name: alice, sha256: "{sha(TEST_KEY)}"}}]}}
    backends: [{{name: engine-a, engine: vllm, url: "http://engine-a.test"}}]
    models: [{{name: m, deployments: [{{backend: engine-a, model: u, format: safetensors}}]}}]
    """
    async with gateway_client(make_config(text), key=None) as (client, _):
        page = await client.get("/admin/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/admin/keys" in page.text and "POST" in page.text
    assert "<script" not in page.text and "http://" not in page.text and "https://" not in page.text
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "frame-ancestors 'none'" in csp


# -- L9: CORS -----------------------------------------------------------------------------------------------------
async def test_a_browser_may_read_every_gateway_header_an_answer_carries_the_budget_ones_included() -> None:
    app_origin = "https://app.example.com"
    text = f"""
    server: {{access_log: false, cors: {{allow_origins: ["{app_origin}"]}}}}
    usage: {{ledger: true}}
    auth:
      mode: keys
      keys:
        - {{name: alice, sha256: "{sha(TEST_KEY)}", limits: {{rpm: 100, tpm: 100000}},
           budget: {{tokens: 6000, period: day}}}}
    backends: [{{name: engine-a, engine: vllm, url: "http://engine-a.test"}}]
    models: [{{name: public-model, deployments: [{{backend: engine-a, model: upstream-model, format: safetensors}}]}}]
    """
    up = FakeUpstream({("POST", ENGINE_CHAT): lambda *_: FakeAnswer.json(engine_chat_json())})
    async with gateway_client(make_config(text), upstream=up) as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={**CHAT, "model": "public-model"}, headers={"origin": app_origin}
        )
    assert r.status_code == 200
    own = {k for k in r.headers if k.startswith("x-") or k == "retry-after"}
    assert {"x-ratelimit-remaining-budget-tokens", "x-ratelimit-reset-budget"} <= own  # the reproduction's headers
    exposed = set(r.headers["access-control-expose-headers"].split(", "))
    assert own <= exposed, sorted(own - exposed)
    # ... and the ones other answers carry: a stored Responses answer's, a queue's refusal
    assert {"x-gateway-stored", "x-gateway-reject-reason"} <= set(EXPOSED.decode().split(", "))
