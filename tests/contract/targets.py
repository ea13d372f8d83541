"""Contract-suite targets: one engine each, real process or emulator, behind the same small interface.

A target knows how to make *its* engine do what a contract case needs: refuse a request with its
own error body, stay busy for a while (so a request waits in the engine's queue), tell whether it is
still generating (to prove the gateway closed an abandoned stream), and the names and keys it uses.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.real_engines import RealEngine

FORMATS = {
    "llama-server": "gguf",
    "vllm": "safetensors",
    "sglang": "safetensors",
    "ollama": "gguf",
    "tabbyapi": "exl3",
    "lmdeploy": "safetensors",
}
HAS_AUTH = {"llama-server", "vllm", "sglang", "tabbyapi", "lmdeploy"}
REPORTS_LOAD = {"llama-server", "vllm", "sglang", "lmdeploy"}
EMULATOR_KEY = "emulator-engine-key"


@dataclass
class EngineError:
    """How to make the engine refuse a request, and what the client must then see."""

    model: str  # public model name to call ("m" or "m-missing")
    body: dict[str, Any]
    status: int
    code: str | None = None
    text: str | None = None  # a piece of the engine's own message that must reach the client


@dataclass
class Target:
    id: str
    engine: str
    url: str
    model: str
    api_key: str | None
    emulator: EmulatorThread | None = None
    real: RealEngine | None = None
    _threads: list[threading.Thread] = field(default_factory=list)

    @property
    def format(self) -> str:
        return FORMATS[self.engine]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    # -- what the engine is doing -------------------------------------------------------------------
    def generating(self) -> bool:
        """Is the engine still producing tokens for someone?"""
        if self.emulator is not None:
            return self.emulator.stats.active > 0
        if self.engine == "llama-server":
            slots = httpx.get(self.url + "/slots", headers=self.headers, timeout=5).json()
            return any(s["is_processing"] for s in slots)
        if self.engine == "vllm":
            for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
                if line.startswith("vllm:num_requests_running"):
                    return float(line.split()[-1]) > 0
            raise AssertionError("vllm:num_requests_running missing")
        # Ollama reports nothing; with OLLAMA_NUM_PARALLEL=1 a running generation delays any other
        t = time.monotonic()
        httpx.post(
            self.url + "/api/generate",
            json={"model": self.model, "prompt": "x", "stream": False, "options": {"num_predict": 1}},
            timeout=60,
        )
        return time.monotonic() - t > 1.0

    def cancelled_count(self) -> int | None:
        return self.emulator.stats.cancelled if self.emulator is not None else None

    @contextlib.contextmanager
    def busy(self, seconds: float = 3.0) -> Iterator[None]:
        """Keep every slot of the engine generating for about `seconds`, so new requests queue."""
        emu = self.emulator
        old_ttft = 0.0
        if emu is not None:
            old_ttft, emu.config.ttft_ms = emu.config.ttft_ms, seconds * 1000
            n = emu.config.slots + 1  # every slot running, one more waiting
        else:
            # vLLM (max_num_seqs=2) is fast on the tiny model and its context is short: keep a queue behind
            # the two running sequences so it stays busy for seconds
            n = {"llama-server": 1, "vllm": 8, "ollama": 1}[self.engine]
        stop = threading.Event()
        threads = [threading.Thread(target=self._long_stream, args=(stop,), daemon=True) for _ in range(n)]
        for th in threads:
            th.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not self._running_now(n):
            time.sleep(0.02)
        try:
            yield
        finally:
            stop.set()
            if emu is not None:
                emu.config.ttft_ms = old_ttft
            for th in threads:
                th.join(30)

    def _running_now(self, n: int) -> bool:
        if self.emulator is not None:
            return self.emulator.stats.active + self.emulator.stats.waiting >= n
        if self.engine == "ollama":
            time.sleep(0.3)
            return True
        if self.engine == "llama-server":
            return self.generating()
        for line in httpx.get(self.url + "/metrics", timeout=5).text.splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.split()[-1]) >= min(n, 2)
        return False

    def _long_stream(self, stop: threading.Event) -> None:
        if self.engine == "ollama":
            url, body = (
                self.url + "/api/chat",
                {
                    "model": self.model,
                    "stream": True,
                    "options": {"num_predict": 3000},
                    "messages": [{"role": "user", "content": "go"}],
                },
            )
        else:
            limit = 3500 if self.engine == "llama-server" else 450 if self.engine == "vllm" else 8
            url, body = (
                self.url + "/v1/chat/completions",
                {
                    "model": self.model,
                    "stream": True,
                    "max_tokens": limit,
                    "messages": [{"role": "user", "content": "go"}],
                },
            )
        with httpx.Client(timeout=120) as c, c.stream("POST", url, json=body, headers=self.headers) as r:
            for _ in r.iter_bytes():
                if stop.is_set():
                    return

    # -- how the engine refuses ---------------------------------------------------------------------
    def engine_error(self) -> EngineError:
        if self.emulator is not None:
            status = 422 if self.engine == "tabbyapi" else 400
            self.emulator.config.fault_count = 1
            self.emulator.config.fault = f"error_status:{status}"
            return EngineError("m", {}, 400)
        if self.engine == "ollama":  # Ollama answers 500 for a bad option type: a client error
            return EngineError("m", {"options": {"num_ctx": "not-a-number"}}, 400, None, "num_ctx")
        huge = "word " * 6000
        body = {"messages": [{"role": "user", "content": huge}]}
        if self.engine == "llama-server":
            return EngineError("m", body, 400, "context_length_exceeded", "context")
        return EngineError("m", body, 400, None, "context length")


def emulated(engine: str) -> Target:
    key = None if engine == "ollama" else EMULATOR_KEY
    emu = EmulatorThread(EmulatorConfig(engine=engine, model="tiny", api_key=key, slots=4))
    emu.__enter__()
    return Target(f"{engine}/emulator", engine, emu.url, "tiny", key, emulator=emu)


def real(engine: str, eng: RealEngine) -> Target:
    return Target(f"{engine}/real", engine, eng.url, eng.model, eng.api_key or None, real=eng)
