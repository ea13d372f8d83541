"""Config hot reload and graceful shutdown, on a real gateway process in front of an emulated engine."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess, http_status

BASE = """
server: {{access_log: false, reload_poll_s: 0.2, graceful_shutdown_s: 20}}
auth: {{mode: none}}
backends:
  - {{name: emu, engine: vllm, url: "{url}", capacity: 8, probe: {{interval_s: 0.5}}}}
models:
  - name: model-a
    deployments:
      - {{backend: emu, model: tiny, format: safetensors}}
"""
EXTRA = """
  - name: model-b
    deployments:
      - {{backend: emu, model: tiny, format: safetensors}}
"""


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    # 40 tokens at 50 ms each: a stream stays open for about 2 s
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8, tpot_ms=50)) as emu:
        yield emu


def _models(gw: GatewayProcess) -> list[str]:
    return [m["id"] for m in httpx.get(gw.url + "/v1/models", timeout=5).json()["data"]]


class SlowStream(threading.Thread):
    """A client streaming 40 tokens; records what it saw."""

    def __init__(self, url: str, model: str = "model-a") -> None:
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.first_chunk = threading.Event()
        self.events: list[str] = []
        self.status: int | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {"model": self.model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 40, "stream": True}
        try:
            with httpx.Client(timeout=60) as c, c.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first_chunk.set()
        except BaseException as e:
            self.error = e
            self.first_chunk.set()

    def complete(self) -> bool:
        contents = [e for e in self.events if '"content":"' in e and '"content":""' not in e]
        return (
            self.status == 200
            and self.error is None
            and self.events[-1:] == ["[DONE]"]
            and not any(e.startswith('{"error"') for e in self.events)
            and len(contents) == 40
        )


def _metric(gw: GatewayProcess, prefix: str) -> float:
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return 0.0


def test_hot_reload_adds_a_model_without_restart_or_failing_a_request_in_flight(engine, tmp_path) -> None:
    with GatewayProcess(BASE.format(url=engine.url), tmp_path) as gw:
        pid = gw.pid
        assert _models(gw) == ["model-a"]
        stream = SlowStream(gw.url)
        stream.start()
        assert stream.first_chunk.wait(10)
        gw.write_config(BASE.format(url=engine.url) + EXTRA.format())
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and "model-b" not in _models(gw):
            time.sleep(0.1)
        assert _models(gw) == ["model-a", "model-b"]
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            timeout=30,
            json={"model": "model-b", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
        )
        assert r.status_code == 200 and r.json()["model"] == "model-b"
        stream.join(30)
        assert stream.complete(), (stream.status, stream.error, stream.events[-3:])
        assert gw.pid == pid and gw.proc is not None and gw.proc.poll() is None
        assert _metric(gw, 'gateway_config_reloads_total{result="success"}') == 1


def test_a_broken_config_file_leaves_everything_working(engine, tmp_path) -> None:
    with GatewayProcess(BASE.format(url=engine.url), tmp_path) as gw:
        broken = BASE.format(url=engine.url).replace("engine: vllm", "engine: not-an-engine")
        gw.write_config(broken)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _metric(gw, 'gateway_config_reloads_total{result="failure"}') < 1:
            time.sleep(0.1)
        assert _metric(gw, 'gateway_config_reloads_total{result="failure"}') == 1
        assert "backends[0].engine" in gw.log_text() and "gateway.yaml:5" in gw.log_text()
        gw.write_config("models: [this is: not: valid yaml")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _metric(gw, 'gateway_config_reloads_total{result="failure"}') < 2:
            time.sleep(0.1)
        assert _metric(gw, 'gateway_config_reloads_total{result="failure"}') == 2
        assert _models(gw) == ["model-a"]
        r = httpx.post(
            gw.url + "/v1/chat/completions",
            timeout=30,
            json={"model": "model-a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
        )
        assert r.status_code == 200
        # SIGHUP reloads on demand: a fixed file is taken at once
        gw.write_config(BASE.format(url=engine.url) + EXTRA.format())
        gw.signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and "model-b" not in _models(gw):
            time.sleep(0.05)
        assert "model-b" in _models(gw)


def test_sigterm_during_a_stream_lets_it_finish_within_the_grace_period(engine, tmp_path) -> None:
    gw = GatewayProcess(BASE.format(url=engine.url), tmp_path).start()
    try:
        stream = SlowStream(gw.url)
        stream.start()
        assert stream.first_chunk.wait(10)
        t = time.monotonic()
        gw.signal(signal.SIGTERM)
        time.sleep(0.3)
        assert http_status(gw.url + "/healthz", 1.0) is None  # no longer accepting new connections
        stream.join(30)
        assert stream.complete(), (stream.status, stream.error, stream.events[-3:])
        assert gw.proc is not None
        code = gw.proc.wait(20)
        assert code == 0
        assert time.monotonic() - t < 20
    finally:
        gw.stop()
