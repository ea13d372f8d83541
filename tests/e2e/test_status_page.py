"""The status page in a real browser: Debian's Chromium, headless, driven over the DevTools protocol, loads
`/status` from a gateway process, is given an admin key the way a person gives it (typed into the page's
field, kept in the tab's sessionStorage, never in the URL), and renders the backends, models, errors and
tokens per key from `/admin/status.json`, refreshing by itself. Any script error, console error or
Content-Security-Policy violation on the page fails the test; so does a wrong key that is not refused.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

from llm_gateway.access.keys import digest_of
from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import free_port
from tests.support.waiting import wait_until

ADMIN_KEY = "sk-admin-status-0123456789"
CLIENT_KEY = "sk-client-alice-0123456789"
CONFIG = """
server: {{access_log: false, data_dir: "{data_dir}"}}
admin:
  keys:
    - {{name: root, sha256: "{admin}"}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "{alice}"}}
backends:
  - {{name: emu-vllm, engine: vllm, url: "{engine}", probe: {{interval_s: 0.5}}}}
  - {{name: ghost-llama, engine: llama-server, url: "http://127.0.0.1:{closed}", probe: {{interval_s: 0.5}},
     max_concurrency: 2}}
models:
  - name: tiny
    aliases: [tiny-alias]
    deployments:
      - {{backend: emu-vllm, model: tiny, format: safetensors}}
  - name: ghost-model
    deployments:
      - {{backend: ghost-llama, model: ghost, format: gguf}}
"""


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        reason = "Chromium is not installed (apt-get install chromium)"
        if os.environ.get("LLM_GATEWAY_REQUIRE_TOOLS") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


class Browser:
    """One headless Chromium with one page, over the DevTools protocol; every event is kept in `events`."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary = binary
        self.profile = profile
        self.proc: subprocess.Popen[bytes] | None = None
        self.ws: ClientConnection | None = None
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)

    def __enter__(self) -> Self:
        self.profile.mkdir(parents=True, exist_ok=True)
        log = (self.profile.parent / "chromium.log").open("ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--headless=new",
                "--no-sandbox",  # the tests run as root
                "--disable-gpu",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                f"--user-data-dir={self.profile}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        port_file = self.profile / "DevToolsActivePort"
        wait_until(lambda: port_file.exists() and port_file.read_text().strip(), what="Chromium's DevTools port")
        port = int(port_file.read_text().split()[0])
        pages = wait_until(
            lambda: [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"],
            what="Chromium's page",
        )
        self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None, open_timeout=30)
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        assert self.ws is not None
        n = next(self._ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        deadline = time.monotonic() + 30
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == n:
                assert "error" not in msg, (method, msg["error"])
                return msg.get("result", {})  # type: ignore[no-any-return]
            self.events.append(msg)

    def js(self, expression: str) -> Any:
        out = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in out, out["exceptionDetails"]
        return out["result"].get("value")

    def problems(self) -> list[str]:
        """Script errors, console errors and browser log errors (CSP violations among them) seen so far."""
        self.call("Runtime.evaluate", expression="1")  # take in the events that arrived meanwhile
        out = []
        for ev in self.events:
            method, p = ev.get("method"), ev.get("params", {})
            if method == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p["exceptionDetails"])[:500])
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console: " + json.dumps(p.get("args"))[:500])
            elif method == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log ({p['entry'].get('source')}): {p['entry']['text'][:500]}")
        return out

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8)) as emu:
        yield emu


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, engine: EmulatorThread) -> Iterator[GatewayProcess]:
    tmp = tmp_path_factory.mktemp("status")
    text = CONFIG.format(
        data_dir=tmp / "data", admin=digest_of(ADMIN_KEY), alice=digest_of(CLIENT_KEY), engine=engine.url,
        closed=free_port(),
    )  # fmt: skip
    with GatewayProcess(text, tmp, name="gw-status") as gw:
        yield gw


def _chat(gw: GatewayProcess, model: str) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 5}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {CLIENT_KEY}"})


def test_the_status_data_needs_the_admin_key_and_the_page_carries_a_strict_policy(gateway: GatewayProcess) -> None:
    assert httpx.get(gateway.url + "/admin/status.json").status_code == 401
    client = httpx.get(gateway.url + "/admin/status.json", headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert client.status_code == 401
    ok = httpx.get(gateway.url + "/admin/status.json", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    assert ok.status_code == 200 and {b["name"] for b in ok.json()["backends"]} == {"emu-vllm", "ghost-llama"}
    page = httpx.get(gateway.url + "/status")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    csp = page.headers["content-security-policy"]
    assert "default-src 'none'" in csp and "connect-src 'self'" in csp and "unsafe-inline" not in csp
    assert not re.search(r'(src|href)="(?!data:)', page.text)  # nothing loaded from elsewhere: works offline
    assert ADMIN_KEY not in page.text


def test_the_page_asks_for_the_key_then_shows_backends_models_errors_and_tokens(
    gateway: GatewayProcess, tmp_path: Path
) -> None:
    binary = _chromium()
    wait_until(lambda: _chat(gateway, "tiny").status_code == 200, what="the engine to answer")
    failed = _chat(gateway, "ghost-model")  # its backend is down: an error to show
    assert failed.status_code in (502, 503), failed.text
    code = failed.json()["error"]["code"]
    with Browser(binary, tmp_path / "profile") as b:
        b.call("Page.navigate", url=gateway.url + "/status")
        wait_until(lambda: b.js("document.body && document.body.dataset.state") == "login", what="the key prompt")
        assert b.js("document.getElementById('app').hidden") is True

        # a wrong key is refused and asked for again
        b.js("document.getElementById('key').focus()")
        b.call("Input.insertText", text="sk-not-an-admin-key")
        b.js("document.getElementById('show').click()")
        wait_until(
            lambda: b.js("document.getElementById('login-message').textContent") == "That admin key was refused.",
            what="the wrong key to be refused",
        )
        assert b.js("sessionStorage.length") == 0
        refused = [p for p in b.problems() if "401" not in p]  # the browser logs the refused fetch itself
        assert refused == [], refused
        b.events.clear()

        # the right key, typed into the page
        b.js("document.getElementById('key').focus()")
        b.call("Input.insertText", text=ADMIN_KEY)
        b.js("document.getElementById('show').click()")
        wait_until(lambda: b.js("document.body.dataset.state") == "ok", what="the status to render")
        backends = b.js("document.getElementById('backends').textContent")
        assert "emu-vllm" in backends and "ghost-llama" in backends
        wait_until(
            lambda: "down" in b.js("document.getElementById('backends').textContent"),
            what="the dead backend shown as down",
        )
        models = b.js("document.getElementById('models').textContent")
        assert "tiny (tiny-alias)" in models and "ghost-model" in models and "safetensors" in models
        assert "ghost-llama" in b.js("document.getElementById('queues').textContent")  # max_concurrency: a queue
        errors = b.js("document.getElementById('errors').textContent")
        assert "ghost-model" in errors and code in errors and str(failed.status_code) in errors, errors
        tokens = b.js("document.getElementById('tokens').textContent")
        assert "alice" in tokens, tokens
        # the key stays in the tab, out of the URL
        assert b.js("sessionStorage.getItem('llm-gateway-admin-key')") == ADMIN_KEY
        assert ADMIN_KEY not in b.js("location.href")

        # it refreshes by itself: new traffic shows up without a reload
        before = b.js("document.getElementById('tokens').textContent")
        for _ in range(3):
            assert _chat(gateway, "tiny").status_code == 200
        wait_until(
            lambda: b.js("document.getElementById('tokens').textContent") != before, what="the page to refresh itself"
        )
        b.screenshot(tmp_path / "status.png")
        assert b.problems() == []
