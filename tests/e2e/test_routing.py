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
from tests.support.waiting import metric, sample, scrape, wait_until

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def post(gw: GatewayProcess, model: str, headers: dict[str, str] | None = None, **extra: object) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions", json={"model": model, **BODY, **extra}, headers=headers or {}, timeout=30
    )


def states(gw: GatewayProcess) -> dict[str, str]:
    return {k: v["state"] for k, v in httpx.get(gw.url + "/readyz", timeout=5).json()["backends"].items()}


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


def _shift_to(gw: GatewayProcess, a: EmulatorThread, b: EmulatorThread, a_waiting: int, b_waiting: int) -> Counter[str]:
    """Make the engines report these queues, wait until the gateway's probes have read both, then route 30."""
    a.config.report_waiting, b.config.report_waiting = a_waiting, b_waiting

    def seen() -> bool:
        s = scrape(gw.url)
        return (
            sample(s, "gateway_backend_requests_waiting", backend="a") == a_waiting
            and sample(s, "gateway_backend_requests_waiting", backend="b") == b_waiting
        )

    wait_until(seen, what=f"the probes to see queues a={a_waiting}, b={b_waiting}")
    return Counter(post(gw, "m").headers["x-gateway-backend"] for _ in range(30))


def test_traffic_shifts_to_the_engine_that_reports_the_shorter_queue(tmp_path: Path) -> None:
    with (
        EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8)) as a,
        EmulatorThread(EmulatorConfig(engine="sglang", model="tiny", slots=8)) as b,
    ):
        # stale_after_probes: a probe delayed on a loaded machine must not turn a seen queue into "unknown";
        # least_load, named: a queue of 6 on 8 slots is the signal it follows (the default for two deployments,
        # cache_aware, keeps these identical requests where they were until the imbalance exceeds max_imbalance)
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{stale_after_probes: 100}}
backends:
  - {{name: a, engine: vllm, url: "{a.url}", capacity: 8, probe: {{interval_s: 0.2}}}}
  - {{name: b, engine: sglang, url: "{b.url}", capacity: 8, probe: {{interval_s: 0.2}}}}
models:
  - name: m
    strategy: least_load
    deployments:
      - {{backend: a, model: tiny, format: safetensors}}
      - {{backend: b, model: tiny, format: safetensors}}
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            first = _shift_to(gw, a, b, 6, 0)
            second = _shift_to(gw, a, b, 0, 6)
    # one request at a time: the engine with the queue scores >= 1.5 slots per slot, the other < 0.2
    assert first == {"b": 30}, first
    assert second == {"a": 30}, second


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
    breaker = {"backend": "a", "model": "m", "upstream_model": "tiny"}
    restarted: EngineProcess | None = None
    with GatewayProcess(cfg, tmp_path) as gw:
        try:
            assert post(gw, "m").headers["x-gateway-backend"] == "a"
            # a long stream on a (500 tokens at 20 ms: 10 s), cut by the engine's death
            events: list[str] = []
            stream_done = threading.Event()

            def stream() -> None:
                body = {"model": "m", **BODY, "max_tokens": 500, "stream": True}
                try:
                    with (
                        httpx.Client(timeout=60) as c,
                        c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r,
                    ):
                        for line in r.iter_lines():
                            if line.startswith("data: "):
                                events.append(line[6:])
                finally:
                    stream_done.set()

            th = threading.Thread(target=stream, daemon=True)
            th.start()
            wait_until(lambda: len(events) >= 5 or stream_done.is_set(), what="5 chunks of the long stream")
            assert not stream_done.is_set(), events
            # steady traffic while a dies
            stop = threading.Event()
            results: list[tuple[int, str | None]] = []

            def traffic() -> None:
                while not stop.is_set():
                    r = post(gw, "m")
                    results.append((r.status_code, r.headers.get("x-gateway-backend")))

            with ThreadPoolExecutor(4) as pool:
                workers = [pool.submit(traffic) for _ in range(4)]
                try:
                    wait_until(lambda: len(results) >= 8, what="traffic flowing before the kill")
                    t_kill = time.monotonic()  # before the kill: the breaker cannot open earlier than this
                    a.kill()
                    assert stream_done.wait(30), "the cut stream hung"
                    # the cut stream is a's failure: its breaker opens, and stays open while a is down
                    wait_until(
                        lambda: metric(gw.url, "gateway_breaker_state", **breaker) == 2.0, what="a's breaker open"
                    )
                    after_kill = len(results)
                    wait_until(lambda: len(results) >= after_kill + 8, what="traffic served after the kill")
                finally:
                    stop.set()
                for w in workers:
                    w.result()  # a traffic thread that raised would otherwise hide its requests
            statuses = Counter(s for s, _ in results)
            assert statuses == {200: len(results)}, statuses  # no new request lost: they failed over to b
            assert any(be == "b" for _, be in results)
            errors = [e for e in events if e.startswith('{"error"')]
            assert len(errors) == 1 and events[-1] == "[DONE]", events[-3:]
            wait_until(lambda: states(gw) == {"a": "down", "b": "ready"}, what="a down and b ready")
            assert metric(gw.url, "gateway_breaker_state", **breaker) == 2.0
            # a restarts on the same port: the probe sees it, the breaker half-opens after its cool-down, one
            # trial request succeeds, and priority routing sends traffic back to it
            restarted = EngineProcess("vllm", a.port, "--tpot-ms", "20").start()
            wait_until(
                lambda: post(gw, "m").headers.get("x-gateway-backend") == "a",
                interval=0.1,
                what="the restarted engine to be taken back",
            )
            back = time.monotonic()
            assert back - t_kill >= 2.0  # not before the breaker's cool-down
            assert metric(gw.url, "gateway_breaker_state", **breaker) == 0.0
        finally:
            if restarted is not None:
                restarted.stop()  # by its own PID


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
            wait_until(lambda: states(gw)["vllm"] == "down", what="the probe to see the vllm engine down")
            constrained_down = post(gw, "m@safetensors")
    assert by_header == {"llama": 10}
    assert by_suffix == {"vllm": 10}
    assert free == {"llama": 5, "vllm": 5}
    assert missing.status_code == 400 and missing.json()["error"]["code"] == "format_unavailable"
    assert constrained_down.status_code == 503, constrained_down.text
    assert constrained_down.json()["error"]["code"] == "no_healthy_backend"


def test_a_saturated_deployment_answers_429_with_retry_after_once_its_queue_is_full(tmp_path: Path) -> None:
    # slots=0: the engine holds every request it gets until the test opens the gate, so the order of
    # events is certain, whatever the machine's load: one in flight, one queued, one refused
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=0)) as emu:
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: a, engine: vllm, url: "{emu.url}", max_concurrency: 1, max_queue: 1, queue_timeout_s: 120}}
models:
  - {{name: m, deployments: [{{backend: a, model: tiny, format: safetensors}}]}}
"""
        with GatewayProcess(cfg, tmp_path) as gw, ThreadPoolExecutor(2) as pool:
            try:
                first = pool.submit(post, gw, "m")
                wait_until(
                    lambda: emu.stats.waiting == 1 and metric(gw.url, "gateway_in_flight_requests", backend="a") == 1,
                    what="the first request in flight, held by the engine",
                )
                second = pool.submit(post, gw, "m")
                wait_until(
                    lambda: metric(gw.url, "gateway_deployment_queue_length", backend="a") == 1,
                    what="the second request in the gateway's queue",
                )
                third = post(gw, "m")  # the only slot is taken and the queue is full
                busy_state = states(gw)["a"]
            finally:
                httpx.post(emu.url + "/_emulator/config", json={"slots": 8}, timeout=10).raise_for_status()
            results = [first.result(), second.result()]
            assert metric(gw.url, "gateway_deployment_queue_length", backend="a") == 0
    assert [r.status_code for r in results] == [200, 200]
    assert third.status_code == 429, third.text
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
            seen = wait_until(
                lambda: (s := states(gw)) == {"busy": "busy", "dead": "down"} and s,
                what="the probes to see one backend busy and the other down",
            )
            served = post(gw, "m")
            assert http_status(gw.url + "/readyz") == 200
            m = scrape(gw.url)
            up = sample(m, "gateway_backend_up", backend="busy", engine="vllm")
            down = sample(m, "gateway_backend_up", backend="dead", engine="sglang")
    assert seen == {"busy": "busy", "dead": "down"}
    assert served.status_code == 200 and served.headers["x-gateway-backend"] == "busy"
    assert (up, down) == (1.0, 0.0)
