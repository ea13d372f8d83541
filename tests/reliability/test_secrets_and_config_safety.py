"""Secrets never leak, and engine URLs cannot be used to move credentials elsewhere.

A gateway process at debug log level, with client keys and engine keys, is driven through every path
that could echo a secret (good and wrong keys, both auth headers, a refused model, an engine that
rejects the gateway's key, engine errors, streams, a rejected config reload); then its logs, /metrics,
every response (headers and bodies) and `check-config`'s output are scanned for any key or digest.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.settings.loader import ConfigError, parse_config
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import REPO_ROOT
from tests.support.waiting import metric, wait_until

CLIENT_KEYS = ["sk-gw-client-alpha-7f3a9c0d1e2b", "sk-gw-client-beta-4c8e2a6f0b1d"]
WRONG_KEY = "sk-gw-attacker-guess-99e1c2d3"
ENGINE_KEY = "engine-secret-5b7d9f1a3c"
WRONG_ENGINE_KEY = "engine-wrong-secret-2e4f6a8c"


def _config(emu_url: str) -> str:
    return f"""
server: {{access_log: true, log_level: debug, reload_poll_s: 0.2}}
auth:
  mode: keys
  keys:
    - {{name: alpha, sha256: "{digest_of(CLIENT_KEYS[0])}", limits: {{rpm: 1000}}}}
    - {{name: beta, sha256: "{digest_of(CLIENT_KEYS[1])}", models: ["other"]}}
backends:
  - {{name: good, engine: sglang, url: "{emu_url}", api_key: "${{ENGINE_KEY}}", probe: {{interval_s: 0.3}}}}
  - {{name: misconfigured, engine: sglang, url: "{emu_url}", api_key: "{WRONG_ENGINE_KEY}", probe: {{interval_s: 0.3}}}}
models:
  - {{name: m, deployments: [{{backend: good, model: tiny, format: safetensors}}]}}
  - {{name: m-bad, deployments: [{{backend: misconfigured, model: tiny, format: safetensors}}]}}
"""


def _reloads(gw: GatewayProcess, result: str) -> float:
    return metric(gw.url, "gateway_config_reloads_total", result=result) or 0.0


SECRETS = [
    *CLIENT_KEYS,
    *(digest_of(k) for k in CLIENT_KEYS),
    WRONG_KEY,
    digest_of(WRONG_KEY),
    ENGINE_KEY,
    WRONG_ENGINE_KEY,
]


def test_no_key_or_digest_appears_in_logs_metrics_errors_or_check_config(tmp_path: Path) -> None:
    seen: list[str] = []
    with EmulatorThread(EmulatorConfig(engine="sglang", model="tiny", api_key=ENGINE_KEY)) as emu:
        gw = GatewayProcess(_config(emu.url), tmp_path, env={"ENGINE_KEY": ENGINE_KEY})
        with gw, httpx.Client(base_url=gw.url, timeout=30) as c:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            calls = [
                ({"authorization": f"Bearer {CLIENT_KEYS[0]}"}, body),
                ({"x-api-key": CLIENT_KEYS[0]}, {**body, "stream": True}),
                ({"authorization": f"Bearer {WRONG_KEY}"}, body),
                ({"x-api-key": WRONG_KEY}, body),
                ({"authorization": f"Basic {WRONG_KEY}"}, body),
                ({"authorization": f"Bearer {CLIENT_KEYS[1]}"}, body),  # model not allowed
                ({"authorization": f"Bearer {CLIENT_KEYS[0]}"}, {**body, "model": "m-bad"}),  # engine refuses our key
                ({"authorization": f"Bearer {CLIENT_KEYS[0]}"}, {**body, "model": WRONG_KEY}),
                ({"authorization": f"Bearer {CLIENT_KEYS[0]}"}, {"model": "m", "messages": WRONG_KEY}),
            ]
            for headers, b in calls:
                r = c.post("/v1/chat/completions", json=b, headers=headers)
                seen.append(str(r.headers) + r.text)
            emu.config.fault, emu.config.fault_count = "error_status:500", 1
            r = c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {CLIENT_KEYS[0]}"})
            seen.append(str(r.headers) + r.text)
            for path in ("/v1/models", "/readyz", "/metrics", "/openapi.json"):
                r = c.get(path, headers={"authorization": f"Bearer {CLIENT_KEYS[0]}"})
                seen.append(str(r.headers) + r.text)
            # a reload with a plaintext key pasted where its digest belongs: rejected, and not echoed. Wait
            # until the gateway has really tried it and said no (the counter moves before the log line is
            # written, in the same step), so the scan below reads the rejection, not a log from before it
            assert _reloads(gw, "failure") == 0
            gw.write_config(_config(emu.url).replace(digest_of(CLIENT_KEYS[1]), CLIENT_KEYS[1]))
            gw.signal(signal.SIGHUP)
            wait_until(lambda: _reloads(gw, "failure") >= 1, what="the reload with a pasted key to be rejected")
            assert _reloads(gw, "success") == 0
            rejections = [ln for ln in gw.log_text().splitlines() if "config reload" in ln and "rejected" in ln]
            assert rejections and all("sha256" in ln for ln in rejections), rejections
            # the running config stayed: alpha is still served, beta still refused the model
            for key, want in ((CLIENT_KEYS[0], 200), (CLIENT_KEYS[1], 403)):
                r = c.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"})
                assert r.status_code == want, r.text
                seen.append(str(r.headers) + r.text)
        logs = gw.log_text()
    check = subprocess.run(
        [sys.executable, "-m", "llm_gateway", "check-config", str(gw.config_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={"ENGINE_KEY": ENGINE_KEY, "PATH": "/usr/bin:/bin"},
    )
    good = parse_config(_config("http://127.0.0.1:1"), "ok.yaml", {"ENGINE_KEY": ENGINE_KEY})
    assert good.backends[0].api_key is not None
    check_ok = subprocess.run(
        [sys.executable, "-m", "llm_gateway", "check-config", "/dev/stdin"],
        cwd=REPO_ROOT,
        input=_config("http://127.0.0.1:1"),
        capture_output=True,
        text=True,
        env={"ENGINE_KEY": ENGINE_KEY, "PATH": "/usr/bin:/bin"},
    )
    assert check.returncode == 1 and "sha256" in check.stderr  # the pasted key was refused
    assert check_ok.returncode == 0, check_ok.stderr
    assert "request" in logs and '"key":"alpha"' in logs  # the logs are really there, at debug level
    everything = {
        "logs": logs,
        "responses": "\n".join(seen),
        "check-config": check.stdout + check.stderr,
        "check-config-ok": check_ok.stdout + check_ok.stderr,
    }
    for where, text in everything.items():
        for secret in SECRETS:
            assert secret not in text, f"a secret ({secret[:8]}...) appears in {where}"


# -- config safety ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, why",
    [
        ("ftp://127.0.0.1:21", "http:// or https://"),
        ("http://user:pass@127.0.0.1:8000", "credentials"),
        ("http://127.0.0.1:8000/?x=1", "query"),
        ("http:///v1", "host"),
        ("http://127.0.0.1:99999", "port"),
    ],
)
def test_engine_urls_are_validated(url: str, why: str) -> None:
    text = f"""
backends: [{{name: b, engine: vllm, url: "{url}"}}]
models: [{{name: m, deployments: [{{backend: b, model: x, format: safetensors}}]}}]
"""
    with pytest.raises(ConfigError) as ei:
        parse_config(text, "bad.yaml", {})
    assert "backends[0].url" in str(ei.value) and why in str(ei.value) and "bad.yaml:2" in str(ei.value)
    assert "pass" not in str(ei.value) or why != "credentials"


class _Recorder(BaseHTTPRequestHandler):
    hits: list[dict[str, str]] = []
    target = ""

    def do_POST(self) -> None:
        if self.server.server_port == _Recorder.redirector_port:  # type: ignore[attr-defined]
            self.send_response(307)
            self.send_header("Location", _Recorder.target + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        _Recorder.hits.append(dict(self.headers))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def do_GET(self) -> None:
        body = b'{"object":"list","data":[{"id":"x"}]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_a_redirect_from_an_engine_is_never_followed_with_the_engines_key(tmp_path: Path) -> None:
    elsewhere = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    redirector = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    _Recorder.redirector_port = redirector.server_port  # type: ignore[attr-defined]
    _Recorder.target = f"http://127.0.0.1:{elsewhere.server_port}"
    for srv in (elsewhere, redirector):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends: [{{name: r, engine: openai, url: "http://127.0.0.1:{redirector.server_port}", api_key: "{ENGINE_KEY}"}}]
models: [{{name: m, deployments: [{{backend: r, model: x, format: safetensors}}]}}]
"""
        with GatewayProcess(cfg, tmp_path, wait_ready=False) as gw:
            r = httpx.post(
                gw.url + "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x"}]}
            )
    finally:
        elsewhere.shutdown()
        redirector.shutdown()
    assert r.status_code == 502 and "redirect" in r.json()["error"]["message"]
    assert _Recorder.hits == []  # the other host never saw a request, let alone the engine key
