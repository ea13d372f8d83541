"""Misbehaving engines, through the emulators' fault knobs: each ends for the client within its
configured timeout with a clear error (an SSE error event once the stream has started), the upstream
connection is released, and the backend's breaker and health show what happened.

Durations are read by the gateway's own clock (its request-duration histogram), so "within the
configured timeout" is judged by the process that enforces it, with bounds derived from the timeouts.

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
from tests.support.waiting import metric, sample, scrape, wait_until

MATRIX: list[tuple[str, str, str, float]] = []
TIMEOUT_S = 1.0  # the engine's first_byte and idle timeouts
TOTAL_S = 30.0  # far beyond TIMEOUT_S + SLACK_S: a fault cut by the total timeout instead would show
SLACK_S = 5.0  # past a deadline, the gateway ends the request within this (its watchdog ticks every 0.25 s)
#: before a deadline: timeouts run on the event loop's clock and durations on perf_counter, so one may end
#: a hair "early" on the other clock (0.4999 s for a 0.5 s timeout was seen)
CLOCKS_S = 0.01
COOLDOWN_S = 0.3
TIMEOUT_FAULTS = {"stall_stream", "stall_body", "no_answer", "slow_first_byte"}


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
routing: {{retries: 0, breaker_failures: 1, breaker_cooldown_s: {COOLDOWN_S}}}
backends:
  - name: emu
    engine: vllm
    url: "{emu.url}"
    probe: {{interval_s: 0.5}}
    timeouts: {{connect_s: 1, first_byte_s: {TIMEOUT_S}, idle_s: {TIMEOUT_S}, total_s: {TOTAL_S}}}
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


BREAKER = {"backend": "emu", "model": "m", "upstream_model": "tiny"}


def _durations(gw: GatewayProcess, model: str, backend: str) -> tuple[float, float]:
    """(count, sum) of the gateway's request-duration histogram for one model on one backend."""
    m = scrape(gw.url)
    labels = {"model": model, "backend": backend}
    return (
        sample(m, "gateway_request_duration_seconds_count", **labels) or 0.0,
        sample(m, "gateway_request_duration_seconds_sum", **labels) or 0.0,
    )


def gateway_seconds(gw: GatewayProcess, before: tuple[float, float], model: str, backend: str) -> float:
    """How long the one request made since `before` took, by the gateway's clock (it records a request
    just after its last byte: wait for that)."""
    after = before

    def recorded() -> bool:
        nonlocal after
        after = _durations(gw, model, backend)
        return after[0] > before[0]

    wait_until(recorded, what=f"the gateway to record the request to {model}")
    assert after[0] == before[0] + 1, "more than one request recorded"
    return after[1] - before[1]


def _run(
    env: Env, fault: str | None, stream: bool, model: str = "m", backend: str = "emu", times: int = 1
) -> tuple[int, dict | list[str], float]:
    """One request with `fault` armed for `times` answers; (status, body or SSE events, seconds by the
    gateway's clock)."""
    env.emu.config.fault, env.emu.config.fault_count, env.emu.config.fault_after_chunks = fault, times, 3
    # the previous case's failure opened the breaker before that case read it as open: this is past its cool-down
    time.sleep(COOLDOWN_S + 0.05)
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 20, "stream": stream}
    before = _durations(env.gw, model, backend)
    with httpx.Client(timeout=60) as c:
        if not stream:
            r = c.post(env.gw.url + "/v1/chat/completions", json=body)
            status, out = r.status_code, r.json()
        else:
            with c.stream("POST", env.gw.url + "/v1/chat/completions", json=body) as r:
                status = r.status_code
                if status != 200:
                    r.read()
                    out = r.json()
                else:
                    out = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    return status, out, gateway_seconds(env.gw, before, model, backend)


def _in_time(fault: str, took: float) -> None:
    """A timeout fault ends at the gateway's deadline, not before it. Any other fault ends on its own,
    before the total timeout could cut it (a fault that hung instead would be ended by the 1 s idle
    timeout, with upstream_timeout, which the error-code assertions tell apart; a huge chunk takes the
    relay seconds on a loaded machine, so no tighter bound holds)."""
    if fault in TIMEOUT_FAULTS:
        assert TIMEOUT_S - CLOCKS_S <= took < TIMEOUT_S + SLACK_S, took
    else:
        assert took < TOTAL_S - SLACK_S, took


def _released(env: Env) -> None:
    wait_until(
        lambda: env.emu.stats.active == 0 and metric(env.gw.url, "gateway_in_flight_requests", backend="emu") == 0,
        what="the engine to stop generating for a request the gateway gave up",
    )


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
    _in_time(fault, took)
    _released(env)
    assert metric(env.gw.url, "gateway_breaker_state", **BREAKER) == 2.0
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
    # a whole answer reset before its first byte on a kept connection is sent once more on a fresh one (no
    # engine byte came: upstream/h1_client.py): the fault must hold for that second answer too to be seen
    times = 2 if fault == "reset_mid_stream" else 1
    try:
        status, body, took = _run(env, fault, stream=False, times=times)
    finally:
        env.emu.config.ttft_ms = 0
    want_status, want_code = NONSTREAM_FAULTS[fault]
    assert isinstance(body, dict)
    err = body["error"]
    assert status == want_status and set(err) == {"message", "type", "param", "code"}, body
    if want_code:
        assert err["code"] in ((want_code,) if isinstance(want_code, str) else want_code)
    assert "emu" in err["message"] or "engine" in err["message"]
    _in_time(fault, took)
    _released(env)
    assert metric(env.gw.url, "gateway_breaker_state", **BREAKER) == 2.0
    MATRIX.append((fault, "whole", f"{status} {err['code']}", took))


def test_html_answer_to_a_stream_request_is_refused_before_the_first_byte(env: Env) -> None:
    status, body, took = _run(env, "html_200", stream=True)
    assert status == 502 and isinstance(body, dict) and body["error"]["code"] == "upstream_bad_response"
    _in_time("html_200", took)
    MATRIX.append(("html_200", "stream", f"{status} {body['error']['code']} (before any byte)", took))


def test_connection_refused_is_502_and_the_backend_shows_down(env: Env) -> None:
    # "gone" was up at the last probe (60 s interval); its engine dies before the next one
    assert httpx.get(env.gw.url + "/readyz", timeout=10).json()["backends"]["gone"]["state"] == "ready"
    env.gone.stop_listening()
    status, body, took = _run(env, None, stream=False, model="gone", backend="gone")
    assert isinstance(body, dict)
    assert status == 502 and body["error"]["code"] == "upstream_unreachable"
    _in_time("refused", took)
    states = httpx.get(env.gw.url + "/readyz", timeout=10).json()["backends"]
    assert states["gone"]["state"] == "down"  # marked at the refused connection, not at the next probe
    assert metric(env.gw.url, "gateway_backend_up", backend="gone", engine="vllm") == 0.0
    again = httpx.post(
        env.gw.url + "/v1/chat/completions",
        json={"model": "gone", "messages": [{"role": "user", "content": "x"}]},
        timeout=30,
    )
    assert again.status_code == 503 and "down" in again.json()["error"]["message"]
    MATRIX.append(("refused", "whole", f"{status} {body['error']['code']}; then backend down, 503", took))


def test_the_engine_serves_normally_after_all_that(env: Env) -> None:
    status, body, _ = _run(env, None, stream=False)  # the half-open trial
    assert status == 200
    status, body, _ = _run(env, None, stream=True)
    assert status == 200 and isinstance(body, list) and body[-1] == "[DONE]"
    assert metric(env.gw.url, "gateway_breaker_state", **BREAKER) == 0.0


def test_a_stream_that_outlives_the_total_timeout_is_ended_with_an_error_event(tmp_path) -> None:
    # the engine keeps sending (100 tokens, one every 100 ms: 10 s), but the whole exchange may take 2 s at
    # most; the other timeouts are far away, so only the total one can end it
    total_s, tokens = 2.0, 100
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", tpot_ms=100)) as emu:
        cfg = f"""
server: {{access_log: false}}
auth: {{mode: none}}
backends:
  - {{name: emu, engine: vllm, url: "{emu.url}", timeouts: {{first_byte_s: 60, idle_s: 60, total_s: {total_s}}}}}
models: [{{name: m, deployments: [{{backend: emu, model: tiny, format: safetensors}}]}}]
"""
        with GatewayProcess(cfg, tmp_path) as gw:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
            before = _durations(gw, "m", "emu")
            with httpx.Client(timeout=60) as c, c.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
                events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
            took = gateway_seconds(gw, before, "m", "emu")
            wait_until(lambda: emu.stats.active == 0, what="the engine to stop generating")
    errors = [orjson.loads(e)["error"] for e in events if e.startswith('{"error"')]
    assert len(errors) == 1 and errors[0]["code"] == "upstream_timeout" and events[-1] == "[DONE]", events[-3:]
    contents = [e for e in events if '"content":"' in e and '"content":""' not in e]
    assert 1 <= len(contents) < tokens  # cut in the middle: it had started, and it did not run to its end
    assert total_s - CLOCKS_S <= took < total_s + SLACK_S, took  # at the deadline, by the gateway's clock
    MATRIX.append(("total_timeout", "stream", f"{len(events) - 2} chunks, then error event upstream_timeout", took))
