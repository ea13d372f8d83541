"""The CLI (a subprocess: listening line, one request, SIGTERM) and EmulatorThread (sync use)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread

ROOT = Path(__file__).resolve().parents[2]


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llm_gateway_emulators", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("listening on http://127.0.0.1:"), (line, proc.stderr.read() if proc.stderr else "")
    return proc, line.rsplit(" ", 1)[1]


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=10)


@pytest.mark.parametrize("engine", ["sglang", "ollama"])
def test_cli_serves_and_exits_cleanly_on_sigterm(engine: str) -> None:
    proc, url = start(engine, "--port", "0", "--model", "tiny", "--api-key", "k", "--tpot-ms", "1")
    try:
        path = "/api/chat" if engine == "ollama" else "/v1/chat/completions"
        body = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": False,
            "max_tokens": 2,
            "options": {"num_predict": 2},
        }
        r = httpx.post(url + path, json=body, headers={"Authorization": "Bearer k"}, timeout=10)
        assert r.status_code == 200
        stats = httpx.get(url + "/_emulator/stats", timeout=10).json()  # control API never needs the key
        assert stats["completed"] == 1
    finally:
        assert stop(proc) == 0


def test_cli_vllm_prints_listening_only_once_loaded() -> None:
    t0 = time.monotonic()
    proc, url = start("vllm", "--port", "0", "--load-delay-s", "0.5")
    try:
        assert time.monotonic() - t0 >= 0.45
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        assert stop(proc) == 0


def test_cli_set_any_knob() -> None:
    proc, url = start("ollama", "--port", "0", "--set", "ollama_legacy=true", "--set", 'version="9.9"')
    try:
        assert httpx.get(url + "/api/version", timeout=5).json() == {"version": "9.9"}
        assert httpx.get(url + "/_emulator/config", timeout=5).json()["ollama_legacy"] is True
    finally:
        assert stop(proc) == 0


def test_cli_rejects_unknown_fault() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "llm_gateway_emulators", "vllm", "--fault", "boom"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert proc.returncode == 2 and "unknown fault" in proc.stderr


def test_emulator_thread_for_sync_tests() -> None:
    cfg = EmulatorConfig(engine="llama-server", model="m", slots=1)
    with EmulatorThread(cfg) as emu:
        r = httpx.post(
            emu.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
            timeout=10,
        )
        assert r.json()["usage"]["completion_tokens"] == 3 and emu.stats.completed == 1
        emu.config.fault = "error_status:503"
        assert httpx.post(emu.url + "/v1/chat/completions", json={"messages": []}, timeout=10).status_code == 503
        emu.stop_listening()
        with pytest.raises(httpx.ConnectError):
            httpx.get(emu.url + "/health", timeout=2)
        emu.start_listening()
        assert httpx.get(emu.url + "/health", timeout=5).status_code == 200


def test_openai_sdk_talks_to_every_engine() -> None:
    for engine in ("llama-server", "vllm", "sglang", "ollama", "tabbyapi", "lmdeploy"):
        with EmulatorThread(EmulatorConfig(engine=engine, model="tiny")) as emu:
            client = openai.OpenAI(base_url=emu.url + "/v1", api_key="unused", max_retries=0)
            out = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
            )
            assert out.choices[0].message.content == "Hello, this is a", engine
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True
            )
            text = "".join((c.choices[0].delta.content or "") for c in stream if c.choices)
            assert text == "Hello, this is a", engine
