"""Routing with two engines behind one gateway process: load-aware selection, failover when an engine
process dies, the breaker taking a restarted engine back, format constraints, and backpressure."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess, http_status
from tests.support.real_engines import REPO_ROOT, free_port

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(gw: GatewayProcess, model: str, headers: dict[str, str] | None = None, **extra: object) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions", json={"model": model, **BODY, **extra}, headers=headers or {}, timeout=30
    )


def states(gw: GatewayProcess) -> dict[str, str]:
    return {k: v["state"] for k, v in httpx.get(gw.url + "/readyz", timeout=5).json()["backends"].items()}


def metric(gw: GatewayProcess, line_prefix: str) -> float | None:
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(line_prefix):
            return float(line.split()[-1])
    return None


class EngineProcess:
    """An emulated engine as a real OS process, so that it can be killed and restarted."""

    def __init__(self, engine: str, port: int | None = None, *args: str) -> None:
        self.engine, self.port, self.args = engine, port or free_port(), args
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EngineProcess:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "llm_gateway_emulators",
                self.engine,
                "--port",
                str(self.port),
                "--model",
                "tiny",
                *self.args,
            ],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert "listening on" in line, line
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()


def test_traffic_shifts_to_the_engine_that_reports_the_shorter_queue(tmp_path: Path) -> None:
    with (
        EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8)) as a,
        EmulatorThread(EmulatorConfig(engine="sglang", model="tiny", slots=8)) as b,
    ):
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: a, engine: vllm, url: "{a.url}", capacity: 8, probe: {{interval_s: 0.2}}}}
  - {{name: b, engine: sglang, url: "{b.url}", capacity: 8, probe: {{interval_s: 0.2}}}}
models:
  - name: m
    deployments:
      - {{backend: a, model: tiny, format: safetensors}}
      - {{backend: b, model: tiny, format: safetensors}}
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            a.config.report_waiting, b.config.report_waiting = 6, 0
            time.sleep(0.8)  # a few probes
            first = Counter(post(gw, "m").headers["x-gateway-backend"] for _ in range(30))
            a.config.report_waiting, b.config.report_waiting = 0, 6
            time.sleep(0.8)
            second = Counter(post(gw, "m").headers["x-gateway-backend"] for _ in range(30))
    assert first["b"] >= 28, first
    assert second["a"] >= 28, second


@pytest.fixture
def two_engines() -> Iterator[tuple[EngineProcess, EngineProcess]]:
    a = EngineProcess("vllm", None, "--tpot-ms", "20").start()
    b = EngineProcess("llama-server", None, "--tpot-ms", "20").start()
    try:
        yield a, b
    finally:
        a.stop()
        b.stop()


def test_killing_an_engine_loses_no_new_request_cuts_its_stream_cleanly_and_it_is_taken_back(
    two_engines: tuple[EngineProcess, EngineProcess], tmp_path: Path
) -> None:
    a, b = two_engines
    cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 2, breaker_failures: 1, breaker_cooldown_s: 2}}
backends:
  - {{name: a, engine: vllm, url: "{a.url}", capacity: 8, probe: {{interval_s: 0.3}}}}
  - {{name: b, engine: llama-server, url: "{b.url}", capacity: 8, probe: {{interval_s: 0.3}}}}
models:
  - name: m
    strategy: priority
    deployments:
      - {{backend: a, model: tiny, format: safetensors, priority: 0}}
      - {{backend: b, model: tiny, format: gguf, priority: 1}}
"""
    with GatewayProcess(cfg, tmp_path) as gw:
        assert post(gw, "m").headers["x-gateway-backend"] == "a"
        # a long stream on a, cut by the engine's death
        events: list[str] = []
        stream_done = threading.Event()

        def stream() -> None:
            body = {"model": "m", **BODY, "max_tokens": 500, "stream": True}
            with httpx.Client(timeout=30) as c, c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
                events.extend(line[6:] for line in r.iter_lines() if line.startswith("data: "))
            stream_done.set()

        th = threading.Thread(target=stream, daemon=True)
        th.start()
        while len(events) < 5:
            time.sleep(0.01)
        # steady traffic while a dies
        stop = threading.Event()
        results: list[tuple[int, str | None]] = []

        def traffic() -> None:
            while not stop.is_set():
                r = post(gw, "m")
                results.append((r.status_code, r.headers.get("x-gateway-backend")))

        with ThreadPoolExecutor(4) as pool:
            for _ in range(4):
                pool.submit(traffic)
            time.sleep(0.5)
            a.kill()
            t_kill = time.monotonic()
            assert stream_done.wait(5), "the cut stream hung"
            time.sleep(1.0)
            breaker_open = metric(gw, 'gateway_breaker_state{backend="a",model="m",upstream_model="tiny"}')
            stop.set()
        statuses = Counter(s for s, _ in results)
        assert statuses == {200: len(results)}, statuses  # no new request lost: they failed over to b
        assert any(be == "b" for _, be in results)
        errors = [e for e in events if e.startswith('{"error"')]
        assert len(errors) == 1 and events[-1] == "[DONE]"
        assert breaker_open == 2.0
        assert states(gw)["a"] == "down" and states(gw)["b"] == "ready"
        # a restarts on the same port: the probe sees it, the breaker half-opens after its cool-down, one trial
        # request succeeds, and priority routing sends traffic back to it
        EngineProcess("vllm", a.port, "--tpot-ms", "20").start()
        a.proc = None
        deadline = time.monotonic() + 15
        back = None
        while time.monotonic() < deadline:
            if post(gw, "m").headers.get("x-gateway-backend") == "a":
                back = time.monotonic()
                break
            time.sleep(0.1)
        assert back is not None, "the restarted engine was never taken back"
        assert back - t_kill >= 2.0  # not before the breaker's cool-down
        assert metric(gw, 'gateway_breaker_state{backend="a",model="m",upstream_model="tiny"}') == 0.0
    # the restarted emulator process is ours: stop it by the port's owner
    subprocess.run(["pkill", "-f", f"emulators vllm --port {a.port}"], check=False)


def test_a_format_constrained_request_never_lands_on_the_wrong_engine(tmp_path: Path) -> None:
    with (
        EmulatorThread(EmulatorConfig(engine="llama-server", model="tiny")) as gguf,
        EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as st,
    ):
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: llama, engine: llama-server, url: "{gguf.url}", probe: {{interval_s: 0.3}}}}
  - {{name: vllm, engine: vllm, url: "{st.url}", probe: {{interval_s: 0.3}}}}
models:
  - name: m
    strategy: round_robin
    deployments:
      - {{backend: llama, model: tiny, format: gguf}}
      - {{backend: vllm, model: tiny, format: safetensors}}
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            by_header = Counter(
                post(gw, "m", {"x-gateway-format": "gguf"}).headers["x-gateway-backend"] for _ in range(10)
            )
            by_suffix = Counter(post(gw, "m@safetensors").headers["x-gateway-backend"] for _ in range(10))
            free = Counter(post(gw, "m").headers["x-gateway-backend"] for _ in range(10))
            missing = post(gw, "m@exl3")
            st.stop_listening()  # the only safetensors engine is gone: gguf must not stand in for it
            time.sleep(0.5)
            constrained_down = post(gw, "m@safetensors")
    assert by_header == {"llama": 10}
    assert by_suffix == {"vllm": 10}
    assert free == {"llama": 5, "vllm": 5}
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "format_unavailable"
    assert constrained_down.status_code == 503


def test_a_saturated_deployment_answers_429_with_retry_after_once_its_queue_is_full(tmp_path: Path) -> None:
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", tpot_ms=40, slots=8)) as emu:
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: a, engine: vllm, url: "{emu.url}", max_concurrency: 1, max_queue: 1, queue_timeout_s: 10}}
models:
  - {{name: m, deployments: [{{backend: a, model: tiny, format: safetensors}}]}}
"""
        with GatewayProcess(cfg, tmp_path) as gw, ThreadPoolExecutor(3) as pool:
            first = pool.submit(post, gw, "m", None, max_tokens=25)  # ~1 s on the only slot
            time.sleep(0.2)
            second = pool.submit(post, gw, "m", None, max_tokens=2)  # waits in the queue
            time.sleep(0.2)
            third = post(gw, "m")  # the queue is full
            results = [first.result(), second.result()]
            busy_state = states(gw)["a"]
    assert [r.status_code for r in results] == [200, 200]
    assert third.status_code == 429
    err = third.json()["error"]
    assert err["code"] == "queue_full" and set(err) == {"message", "type", "param", "code"}
    assert int(third.headers["retry-after"]) >= 1
    assert busy_state in ("ready", "busy")


def test_health_tells_busy_from_dead(tmp_path: Path) -> None:
    with (
        EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", report_waiting=5)) as busy,
        EmulatorThread(EmulatorConfig(engine="sglang", model="tiny")) as dead,
    ):
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: busy, engine: vllm, url: "{busy.url}", probe: {{interval_s: 0.2}}}}
  - {{name: dead, engine: sglang, url: "{dead.url}", probe: {{interval_s: 0.2}}}}
models:
  - name: m
    deployments:
      - {{backend: busy, model: tiny, format: safetensors}}
      - {{backend: dead, model: tiny, format: safetensors}}
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            dead.stop_listening()
            time.sleep(0.8)
            seen = states(gw)
            served = post(gw, "m")
            assert http_status(gw.url + "/readyz") == 200
            up = metric(gw, 'gateway_backend_up{backend="busy",engine="vllm"}')
            down = metric(gw, 'gateway_backend_up{backend="dead",engine="sglang"}')
    assert seen == {"busy": "busy", "dead": "down"}
    assert served.status_code == 200 and served.headers["x-gateway-backend"] == "busy"
    assert (up, down) == (1.0, 0.0)
