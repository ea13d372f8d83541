"""Smoke tests of the bench harness (bench/): the fake engine speaks what the gateway and the load
generators expect, the generated gateway config is valid with every feature on, and the reports render.
Fast (a few seconds): no gateway process, no load."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import profile_report  # noqa: E402
import report  # noqa: E402
import targets  # noqa: E402

from llm_gateway.config_loader import load_config  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read()


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.read()


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    port = _free_port()
    p = subprocess.Popen(
        [sys.executable, str(BENCH / "fake_engine.py"), "--port", str(port), "--tokens", "5", "--tpot-ms", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                _get(base + "/health")
                break
            except OSError:
                time.sleep(0.05)
        yield base
    finally:
        p.terminate()
        p.wait(10)


def test_fake_engine_answers_a_chat_completion_with_usage(engine: str) -> None:
    status, raw = _post(engine + "/v1/chat/completions", {"model": "fake-model", "max_tokens": 7, "messages": []})
    body = json.loads(raw)
    assert status == 200
    assert body["usage"]["completion_tokens"] == 7
    assert len(body["choices"][0]["message"]["content"].split()) == 7


def test_fake_engine_streams_role_tokens_finish_usage_done(engine: str) -> None:
    status, raw = _post(
        engine + "/v1/chat/completions",
        {"model": "fake-model", "stream": True, "max_tokens": 4, "stream_options": {"include_usage": True}},
    )
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    assert status == 200
    assert raw.rstrip().endswith(b"data: [DONE]")
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(1 for e in events if e["choices"] and e["choices"][0]["delta"].get("content")) == 4
    assert events[-1]["usage"]["completion_tokens"] == 4 and events[-1]["choices"] == []


def test_fake_engine_sends_usage_only_when_asked(engine: str) -> None:
    _, raw = _post(engine + "/v1/chat/completions", {"model": "fake-model", "stream": True, "max_tokens": 2})
    assert b'"usage"' not in raw and raw.rstrip().endswith(b"data: [DONE]")


def test_held_stream_lasts_until_released(engine: str) -> None:
    body = {"model": "fake-model", "stream": True, "fake_hold": "t1", "fake_tpot_ms": 20}
    release = subprocess.Popen(
        [sys.executable, "-c", f"import time,urllib.request;time.sleep(0.3);"
         f"urllib.request.urlopen(urllib.request.Request('{engine}/fake/release?hold=t1', b''))"]
    )  # fmt: skip
    t0 = time.monotonic()
    _, raw = _post(engine + "/v1/chat/completions", body)
    release.wait(10)
    assert time.monotonic() - t0 >= 0.25
    assert raw.count(b'"content":" quick"') >= 5  # a token every 20 ms while held
    assert raw.rstrip().endswith(b"data: [DONE]")


def test_fake_engine_reports_vllm_load_metrics_models_and_health(engine: str) -> None:
    _, metrics = _get(engine + "/metrics")
    for name in (b"vllm:num_requests_running", b"vllm:num_requests_waiting", b"vllm:kv_cache_usage_perc"):
        assert name in metrics
    _, models = _get(engine + "/v1/models")
    assert json.loads(models)["data"][0]["id"] == "fake-model"
    assert _get(engine + "/health")[0] == 200


def test_generated_gateway_config_turns_every_feature_on(tmp_path: Path) -> None:
    path = targets.write_gateway_config(tmp_path / "gw.yaml", ["http://127.0.0.1:1", "http://127.0.0.1:2"], "k")
    cfg = load_config(path)
    assert cfg.auth.mode == "keys" and cfg.auth.keys[0].limits.rpm == 10_000_000
    assert cfg.limits.store == "memory" and cfg.server.access_log is False
    assert {b.engine for b in cfg.backends} == {"vllm"} and cfg.models[0].strategy == "least_load"


def test_report_marks_targets_met_and_not_met() -> None:
    scn = {"ns_c1": {"p50": 1.0, "p99": 2.0, "errors": 0}, "rss_idle": {"rss_mb": 50.0}}
    data = {
        "config": {"targets": ["gateway", "direct"], "scenarios": ["ns_c1", "rss_idle"], "duration": 1},
        "results": {"gateway": {"scenarios": scn}, "direct": {"scenarios": {"ns_c1": {"p50": 0.1, "p99": 0.2}}}},
    }
    text = report.render(data)
    assert "| ns_c1 added latency p50, ms | ≤ 0.5 | 0.90 | **not met** |" in text
    assert "| rss_idle RSS, MB | ≤ 80 | 50.0 | met |" in text


def test_profile_report_splits_own_code_from_libraries() -> None:
    text = profile_report.from_collapsed(
        "run (uvloop/__init__.py:1);Runner.run (asyncio/runners.py:118) 5\n"
        "run (uvloop/__init__.py:1);handle (llm_gateway/service.py:10) 3\n"
        "run (uvloop/__init__.py:1);send (aiohttp/client.py:5) 2\n"
    )
    assert " 30.0%  gateway + adapters (own code)" in text
    assert " 50.0%  uvloop C event loop" in text
    assert " 20.0%  aiohttp" in text
