"""Misbehaving engines, through the emulators' fault knobs: each ends for the client within its
configured timeout with a clear error (an SSE error event once the stream has started), the upstream
connection is released, and the backend's breaker and health show what happened.

Prints the fault matrix (run with -s to see it)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess

MATRIX: list[tuple[str, str, str, float]] = []


@dataclass
class Env:
    gw: GatewayProcess
    emu: EmulatorThread
    gone: EmulatorThread


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    with (
        EmulatorThread(
            EmulatorConfig(engine="vllm", model="tiny", tpot_ms=5, huge_chunk_bytes=20 * 1024 * 1024)
        ) as emu,
        EmulatorThread(EmulatorConfig(engine="vllm", model="tiny")) as gone,
    ):
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
routing: {{retries: 0, breaker_failures: 1, breaker_cooldown_s: 0.3}}
backends:
  - name: emu
    engine: vllm
    url: "{emu.url}"
    probe: {{interval_s: 0.5}}
    timeouts: {{connect_s: 1, first_byte_s: 1, idle_s: 1, total_s: 8}}
  - {{name: gone, engine: vllm, url: "{gone.url}", probe: {{interval_s: 60}}}}
models:
  - {{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}
  - {{name: gone, deployments: [{{backend: gone, model: tiny, format: safetensors}}]}}
"""
        with GatewayProcess(cfg, tmp_path_factory.mktemp("faults")) as gw:
            yield Env(gw, emu, gone)
    print("\nfault matrix (fault, mode, what the client saw, seconds):")
    for row in MATRIX:
        print(f"  {row[0]:<18} {row[1]:<10} {row[2]:<60} {row[3]:.2f}")


def _metric(gw: GatewayProcess, prefix: str) -> float | None:
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        if line.startswith(prefix):
            return float(line.split()[-1])
    return None


def _run(env: Env, fault: str | None, stream: bool, model: str = "m") -> tuple[int, dict | list[str], float]:
    env.emu.config.fault, env.emu.config.fault_count, env.emu.config.fault_after_chunks = fault, 1, 3
    time.sleep(0.35)  # past the previous case's breaker cool-down
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": stream}
    with httpx.Client(timeout=30) as c:
        c.get(env.gw.url + "/healthz")  # the clock below times the gateway, not the TCP handshake
        t = time.monotonic()
        if not stream:
            r = c.post(env.gw.url + "/v1/chat/completions", json=body)
            return r.status_code, r.json(), time.monotonic() - t
        with c.stream("POST", env.gw.url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                r.read()
                return r.status_code, r.json(), time.monotonic() - t
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return 200, events, time.monotonic() - t


def _released(env: Env) -> None:
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and (
        env.emu.stats.active or _metric(env.gw, 'gateway_in_flight_requests{backend="emu"}')
    ):
        time.sleep(0.05)
    assert env.emu.stats.active == 0, "the engine is still generating for a request the gateway gave up"
    assert _metric(env.gw, 'gateway_in_flight_requests{backend="emu"}') == 0.0


STREAM_FAULTS = {
    "reset_mid_stream": "stream_interrupted",
    "garbage_sse": "upstream_bad_response",
    "truncated_sse": "stream_interrupted",
    "huge_chunk": "upstream_bad_response",
    "stall_stream": "upstream_timeout",
}


@pytest.mark.parametrize("fault", list(STREAM_FAULTS))
def test_stream_faults_end_with_one_error_event(env: Env, fault: str) -> None:
    status, events, took = _run(env, fault, stream=True)
    assert status == 200
    assert isinstance(events, list) and events[-1] == "[DONE]"
    errors = [orjson.loads(e)["error"] for e in events if e.startswith('{"error"')]
    assert len(errors) == 1 and errors[0]["code"] == STREAM_FAULTS[fault], errors
    assert took < 4
    _released(env)
    assert _metric(env.gw, 'gateway_breaker_state{backend="emu",model="m",upstream_model="tiny"}') == 2.0
    MATRIX.append((fault, "stream", f"{len(events) - 2} chunks, then error event {errors[0]['code']}", took))


NONSTREAM_FAULTS = {
    "stall_body": (504, "upstream_timeout"),
    "html_200": (502, "upstream_bad_response"),
    "no_answer": (504, "upstream_timeout"),
    "reset_mid_stream": (502, ("stream_interrupted", "upstream_unreachable")),  # reset before or after the headers
    "slow_first_byte": (504, "upstream_timeout"),
    "error_status:500": (500, None),
}


@pytest.mark.parametrize("fault", list(NONSTREAM_FAULTS))
def test_whole_answer_faults_end_with_a_clear_error_in_time(env: Env, fault: str) -> None:
    if fault == "slow_first_byte":
        env.emu.config.ttft_ms = 3000
    try:
        status, body, took = _run(env, fault, stream=False)
    finally:
        env.emu.config.ttft_ms = 0
    want_status, want_code = NONSTREAM_FAULTS[fault]
    assert isinstance(body, dict)
    err = body["error"]
    assert status == want_status and set(err) == {"message", "type", "param", "code"}, body
    if want_code:
        assert err["code"] in ((want_code,) if isinstance(want_code, str) else want_code)
    assert "emu" in err["message"] or "engine" in err["message"]
    assert took < 4
    _released(env)
    assert _metric(env.gw, 'gateway_breaker_state{backend="emu",model="m",upstream_model="tiny"}') == 2.0
    MATRIX.append((fault, "whole", f"{status} {err['code']}", took))


def test_html_answer_to_a_stream_request_is_refused_before_the_first_byte(env: Env) -> None:
    status, body, took = _run(env, "html_200", stream=True)
    assert status == 502 and isinstance(body, dict) and body["error"]["code"] == "upstream_bad_response"
    MATRIX.append(("html_200", "stream", f"{status} {body['error']['code']} (before any byte)", took))


def test_connection_refused_is_502_and_the_backend_shows_down(env: Env) -> None:
    # "gone" was up at the last probe (60 s interval); its engine dies before the next one
    assert httpx.get(env.gw.url + "/readyz").json()["backends"]["gone"]["state"] == "ready"
    env.gone.stop_listening()
    status, body, took = _run(env, None, stream=False, model="gone")
    assert isinstance(body, dict)
    assert status == 502 and body["error"]["code"] == "upstream_unreachable"
    states = httpx.get(env.gw.url + "/readyz").json()["backends"]
    assert states["gone"]["state"] == "down"
    assert _metric(env.gw, 'gateway_backend_up{backend="gone",engine="vllm"}') == 0.0
    again = httpx.post(
        env.gw.url + "/v1/chat/completions", json={"model": "gone", "messages": [{"role": "user", "content": "x"}]}
    )
    assert again.status_code == 503 and "down" in again.json()["error"]["message"]
    MATRIX.append(("refused", "whole", f"{status} {body['error']['code']}; then backend down, 503", took))


def test_the_engine_serves_normally_after_all_that(env: Env) -> None:
    status, body, _ = _run(env, None, stream=False)  # the half-open trial
    assert status == 200
    status, body, _ = _run(env, None, stream=True)
    assert status == 200 and isinstance(body, list) and body[-1] == "[DONE]"
    assert _metric(env.gw, 'gateway_breaker_state{backend="emu",model="m",upstream_model="tiny"}') == 0.0


def test_a_stream_that_outlives_the_total_timeout_is_ended_with_an_error_event(tmp_path) -> None:
    # the engine keeps sending (never idle), but the whole exchange may take 2 s at most
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", tpot_ms=100)) as emu:
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: emu, engine: vllm, url: "{emu.url}", timeouts: {{first_byte_s: 5, idle_s: 1, total_s: 2}}}}
models: [{{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}]
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100, "stream": True}
            with httpx.Client(timeout=30) as c:
                c.get(gw.url + "/healthz")  # connected before the clock starts
                t = time.monotonic()
                with c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
                    events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
                took = time.monotonic() - t
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and emu.stats.active:
                time.sleep(0.05)
            active = emu.stats.active
    errors = [orjson.loads(e)["error"] for e in events if e.startswith('{"error"')]
    assert len(errors) == 1 and errors[0]["code"] == "upstream_timeout" and events[-1] == "[DONE]"
    assert 10 < len(events) < 40  # about 2 s of 100 ms tokens, not all 100
    assert 1.9 < took < 3.5
    assert active == 0
    MATRIX.append(("total_timeout", "stream", f"{len(events) - 2} chunks, then error event upstream_timeout", took))
