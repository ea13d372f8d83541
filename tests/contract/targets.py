"""Contract-suite targets: one engine each, real process or emulator, behind the same small interface.

A target knows how to make *its* engine do what a contract case needs: refuse a request with its
own error body, stay busy until released (so a request waits in the engine's queue), show what it is
doing (`work()`), and prove that it stopped a generation whose client went away (`assert_stopped`),
with evidence only cancellation explains, never a guess from timings:

- emulators: their `cancelled` counter (a client left before the end) and no request in a slot;
- llama-server: no slot `is_processing`, and `llamacpp:tokens_predicted_total` (counted when a task
  ends, an aborted one included) grew by fewer tokens than were asked for: the tiny model never ends
  a reply on its own, so the engine was stopped. This build does not stop a *non-streamed*
  generation when its client leaves (checked with a plain client too): there the evidence is the
  connection the gateway closed while the engine still held it (`CLOSE_WAIT` on the engine's port,
  which only a client closing first explains);
- vLLM: `vllm:num_requests_running` back to 0, and `vllm:generation_tokens_total` grew by fewer
  tokens than were asked for;
- Ollama, which reports nothing about running work: its runner process burns CPU while it generates,
  and its server logs each exchange when it ends (`[GIN] ... | POST "/api/chat"`). The generation
  asked for a million tokens (many minutes here, and the tiny model at temperature 0 never stops
  early, not even by Ollama's repeat check: no token follows itself), it was generating when the
  client left (checked), its runner went idle, and the server logged the exchange as over. (A runner
  going idle alone would not do: one whose client stops reading stalls once the socket buffers fill.)
- MLX-LM, which reports nothing either: its server process burns CPU while it generates (about one core)
  and none idle. A stream whose client left stops on its next write (a reset connection); a client that
  only stopped reading would stall it just as well, but not within the deadline: its events are ~200
  bytes, so filling the socket buffers takes minutes. Like llama-server, it generates a whole
  (non-streamed) answer to its end after its client left (checked with curl): there the evidence is the
  gateway's half-closed connection.

Every wait is a condition polled up to a generous deadline: a slow machine makes a case slower,
never changes its verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.mlx_engine import MlxServer
from tests.support.real_engines import OllamaServer, RealEngine, server_sockets

FORMATS = {
    "llama-server": "gguf",
    "vllm": "safetensors",
    "sglang": "safetensors",
    "ollama": "gguf",
    "tabbyapi": "exl3",
    "lmdeploy": "safetensors",
    "aphrodite": "safetensors",
    "trtllm": "safetensors",
    "tgi": "safetensors",
    "mlc": "mlc",
    "lmstudio": "gguf",
    "dynamo": "safetensors",
    "mlx": "mlx",
}
#: engines with an API key of their own (trtllm-serve, MLC LLM, Dynamo's frontend and MLX-LM have none)
HAS_AUTH = {"llama-server", "vllm", "sglang", "tabbyapi", "lmdeploy", "aphrodite", "tgi", "lmstudio"}
REPORTS_LOAD = {"llama-server", "vllm", "sglang", "lmdeploy", "aphrodite", "tgi", "dynamo"}
EMULATOR_KEY = "emulator-engine-key"
#: the session fixture (tests/conftest.py) that starts each real engine
REAL_FIXTURES = {"llama-server": "llama_server", "vllm": "vllm_server", "ollama": "ollama_server", "mlx": "mlx_server"}
#: engines that report nothing about running work: their process's CPU time tells (see the module)
BY_CPU = {"ollama", "mlx"}

#: an abandoned generation stops within about a second; this much is for a machine that is very busy
STOP_DEADLINE_S = 30.0
#: engines' own endpoints may answer late while they saturate both cores (vLLM's API server stalled
#: for 20 s behind its engine here)
ENGINE_HTTP_TIMEOUT_S = 60.0
#: a generation that outlasts every deadline here: its natural end is a minute or more away on this
#: machine (measured alone: llama-server 16,000 tokens of its 16,384-token context in 90 s, vLLM
#: 32,568 of max_model_len 32,768 in 89 s; Ollama: a million tokens, hours; emulators: 2,000 tokens
#: at 20 ms each, 40 s)
LONG_TOKENS = {"llama-server": 16000, "vllm": 32000, "ollama": 1_000_000, "mlx": 100_000}
EMULATOR_LONG_TOKENS = 2000
EMULATOR_TPOT_MS = 20.0
#: Ollama's runner is generating when it burns more than this many CPU seconds in OLLAMA_SAMPLE_S
#: (idle it burns none; generating, about one core)
OLLAMA_SAMPLE_S = 0.4
OLLAMA_BUSY_CPU_S = 0.04


def poll(cond: Callable[[], bool], deadline_s: float, interval_s: float = 0.05) -> bool:
    """Check `cond` until it holds (True) or `deadline_s` has passed (False)."""
    end = time.monotonic() + deadline_s
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(interval_s)


def prom_sum(text: str, name: str) -> float | None:
    """The sum of a metric's samples (every label set) in Prometheus text, or None if it is absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            total += float(line.rsplit(None, 1)[-1])
            seen = True
    return total if seen else None


@dataclass(frozen=True)
class Work:
    """What an engine has done so far, by its own account."""

    generating: bool  # producing tokens (or holding a request in a slot) right now
    tokens: float  # its count of generated tokens; Ollama: the CPU seconds its runner used
    ended: int = 0  # emulators: requests whose client left before the end; Ollama: exchanges it logged as over


@dataclass(frozen=True)
class EngineError:
    """How to make the engine refuse a request, and what the client must then see."""

    model: str  # public model name to call ("m" or "m-missing")
    body: dict[str, Any]
    status: int
    code: str | None = None
    text: str | None = None  # a piece of the engine's own message that must reach the client
    path: str = "/v1/chat/completions"  # completions bodies carry a `prompt`


@dataclass
class Target:
    id: str
    engine: str
    url: str
    model: str
    api_key: str | None
    emulator: EmulatorThread | None = None
    real: RealEngine | None = None

    @property
    def format(self) -> str:
        return FORMATS[self.engine]

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @property
    def config_fields(self) -> dict[str, str]:
        """The fields of a suite's gateway CONFIG template that name this target's backend."""
        return {
            "engine": self.engine,
            "url": self.url,
            "key": self.api_key or "",
            "model": self.model,
            "fmt": self.format,
        }

    @property
    def slots(self) -> int:
        """How many generations the engine runs at once."""
        if self.emulator is not None:
            return self.emulator.config.slots
        attr = {"llama-server": "parallel", "vllm": "max_num_seqs", "ollama": "num_parallel", "mlx": "parallel"}[
            self.engine
        ]
        return int(getattr(self.real, attr) or 1)

    # -- what the engine is doing -------------------------------------------------------------------
    def work(self) -> Work:
        """The engine's own account of its work now (Ollama: sampled over OLLAMA_SAMPLE_S)."""
        if self.emulator is not None:
            s = self.emulator.stats
            return Work(s.active + s.waiting > 0, s.tokens_generated_total, s.cancelled)
        if self.engine == "llama-server":
            slots = httpx.get(self.url + "/slots", headers=self.headers, timeout=ENGINE_HTTP_TIMEOUT_S).json()
            text = httpx.get(self.url + "/metrics", headers=self.headers, timeout=ENGINE_HTTP_TIMEOUT_S).text
            return Work(any(s["is_processing"] for s in slots), self._metric(text, "llamacpp:tokens_predicted_total"))
        if self.engine == "vllm":
            text = httpx.get(self.url + "/metrics", timeout=ENGINE_HTTP_TIMEOUT_S).text
            running = self._metric(text, "vllm:num_requests_running")
            waiting = self._metric(text, "vllm:num_requests_waiting")
            return Work(running + waiting > 0, self._metric(text, "vllm:generation_tokens_total"))
        if isinstance(self.real, MlxServer):
            cpu0 = self.real.cpu_seconds()
            time.sleep(OLLAMA_SAMPLE_S)
            cpu1 = self.real.cpu_seconds()
            return Work(cpu1 - cpu0 > OLLAMA_BUSY_CPU_S, cpu1)
        assert isinstance(self.real, OllamaServer)
        cpu0 = self.real.runner_cpu_seconds()
        time.sleep(OLLAMA_SAMPLE_S)
        cpu1 = self.real.runner_cpu_seconds()
        return Work(cpu1 - cpu0 > OLLAMA_BUSY_CPU_S, cpu1, self.real.exchanges_logged("/api/chat"))

    @staticmethod
    def _metric(text: str, name: str) -> float:
        v = prom_sum(text, name)
        if v is None:
            raise AssertionError(f"the engine's /metrics has no {name}")
        return v

    def long_tokens(self) -> int:
        """max_tokens for a generation that runs far longer than any deadline here (see LONG_TOKENS)."""
        return EMULATOR_LONG_TOKENS if self.emulator is not None else LONG_TOKENS[self.engine]

    @contextlib.contextmanager
    def paced(self) -> Iterator[None]:
        """Emulators generate at EMULATOR_TPOT_MS per token inside the block (real engines: as they do)."""
        emu = self.emulator
        if emu is None:
            yield
            return
        old, emu.config.tpot_ms = emu.config.tpot_ms, EMULATOR_TPOT_MS
        try:
            yield
        finally:
            emu.config.tpot_ms = old

    def read_while_generating(self, lines: Iterator[str], min_chunks: int) -> tuple[int, str]:
        """Read a streamed answer until the client has `min_chunks` token chunks and the engine is seen
        generating (so that leaving then abandons a running generation); (chunks, their text). A token
        chunk carries content: text, or an empty string for a token that decodes to no text yet (not
        the role chunk's empty content)."""
        chunks, text, checked = 0, "", 0.0
        deadline = time.monotonic() + 60
        for line in lines:
            if not line.startswith("data: {"):
                continue
            choices = orjson.loads(line[6:]).get("choices") or [{}]
            delta = choices[0].get("delta") or {}
            piece = delta.get("content")
            if isinstance(piece, str) and (piece or "role" not in delta):
                chunks += 1
                text += piece
            now = time.monotonic()
            if chunks >= min_chunks and now - checked >= 0.2:
                checked = now
                if self.work().generating:
                    return chunks, text
            assert now < deadline, f"{self.id}: the engine was never seen generating: the case would prove nothing"
        raise AssertionError(f"{self.id}: the stream ended before the client left: the case would prove nothing")

    def wait_generating(self, deadline_s: float = STOP_DEADLINE_S) -> Work:
        """The engine's work once it is generating; fails if it does not start within the deadline."""
        seen: list[Work] = []

        def started() -> bool:
            seen.append(self.work())
            return seen[-1].generating

        assert poll(started, deadline_s), f"{self.id}: the engine did not start generating within {deadline_s:.0f} s"
        return seen[-1]

    def assert_stopped(self, before: Work, max_tokens: int) -> Work:
        """Prove the engine stopped the generation (asked for `max_tokens`) whose client left after
        `before` was taken; see the module docstring for the evidence per engine."""
        seen: list[Work] = []

        def stopped() -> bool:
            w = self.work()
            seen.append(w)
            if w.generating:
                return False
            if self.emulator is not None or self.engine == "ollama":
                return w.ended > before.ended
            if self.engine == "llama-server":  # the counter moves when the task ends
                return w.tokens > before.tokens
            return True

        ok = poll(stopped, STOP_DEADLINE_S, 0.1)
        after = seen[-1]
        if not ok:
            self._after_failure()
            raise AssertionError(
                f"{self.id}: the engine was still generating {STOP_DEADLINE_S:.0f} s after the client left "
                f"(it stops within about a second once the gateway closes the upstream): {after}"
            )
        if self.real is not None and self.engine not in BY_CPU:
            generated = after.tokens - before.tokens
            assert generated < max_tokens, (
                f"{self.id}: the engine generated all {max_tokens} tokens: the gateway never closed the upstream"
            )
        return after

    @property
    def stops_whole_answers(self) -> bool:
        """Does the engine stop a non-streamed generation when its client leaves? (see the docstring)"""
        return not (self.real is not None and self.engine in ("llama-server", "mlx"))

    def whole_tokens(self) -> int:
        """max_tokens for an abandoned whole answer: long, or, where the engine will not stop it, just
        long enough (about 15 s here) to see the gateway's side of the connection closed."""
        return self.long_tokens() if self.stops_whole_answers else 6000

    def assert_upstream_closed(self, before: Work) -> None:
        """For an engine that does not stop a whole answer: the gateway closed its connection to the
        engine while the engine still held it; then the engine's own generation runs to its end."""
        assert self.real is not None
        port = self.real.port

        def half_closed() -> set[int]:
            return {remote for remote, state in server_sockets(port) if state == "CLOSE_WAIT"}

        def held_half_closed() -> bool:  # for half a second: not an idle keep-alive being closed
            first = half_closed()
            if not first:
                return False
            time.sleep(0.5)
            return bool(first & half_closed())

        closed = poll(held_half_closed, STOP_DEADLINE_S)
        still = self.work().generating
        poll(lambda: not self.work().generating and self.work().tokens > before.tokens, 120.0, 0.2)
        live = [sock for sock in server_sockets(port) if sock[1] != "TIME_WAIT"]
        assert closed, f"{self.id}: no connection to the engine was closed by the gateway; its connections: {live}"
        assert still, f"{self.id}: the engine finished before the check: the case proves nothing"

    def _after_failure(self) -> None:
        """After a failed stop: do not leave the abandoned generation running into the next cases."""
        if isinstance(self.real, OllamaServer):  # a million tokens: stop its runner; Ollama starts a new one
            for pid in self.real.runner_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        elif self.real is not None:
            poll(lambda: not self.work().generating, 120.0, 0.5)

    # -- a busy engine ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        """Every slot of the engine generating and one more request waiting, until the block ends; then
        the load is cut and the engine is idle again before the next case."""
        emu = self.emulator
        old_ttft = 0.0
        if emu is not None:
            old_ttft, emu.config.ttft_ms = emu.config.ttft_ms, 3_600_000.0  # a first token that never comes
        n = self.slots + 1
        release = threading.Event()
        failures: list[BaseException] = []
        th = threading.Thread(target=lambda: asyncio.run(self._hold(n, release, failures)), daemon=True)
        th.start()
        try:
            assert poll(self._loaded, 60.0, 0.1), f"{self.id}: the engine did not get busy within 60 s ({failures})"
            yield
        finally:
            release.set()
            th.join(60)
            if emu is not None:
                emu.config.ttft_ms = old_ttft
            idle = poll(lambda: not self.work().generating, 120.0, 0.1)
        assert idle, f"{self.id}: the engine was still busy 120 s after the load was cut"

    def _loaded(self) -> bool:
        """Is the load of `busy()` running: every slot taken (emulators: one more waiting)?"""
        if self.emulator is not None:
            s = self.emulator.stats
            return s.active + s.waiting >= self.slots + 1
        if self.engine == "llama-server":
            return self.work().generating
        if self.engine == "vllm":
            text = httpx.get(self.url + "/metrics", timeout=ENGINE_HTTP_TIMEOUT_S).text
            return self._metric(text, "vllm:num_requests_running") >= self.slots
        return self.work().generating  # Ollama: its runner is generating

    async def _hold(self, n: int, release: threading.Event, failures: list[BaseException]) -> None:
        async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30)) as client:
            tasks = [asyncio.create_task(self._keep_streaming(client, failures)) for _ in range(n)]
            while not release.is_set():
                await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()  # drops the connections: the engine stops each generation
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep_streaming(self, client: httpx.AsyncClient, failures: list[BaseException]) -> None:
        """One long generation after another, straight to the engine, until cancelled."""
        body: dict[str, Any] = {"model": self.model, "stream": True, "messages": [{"role": "user", "content": "go"}]}
        if self.engine == "ollama":  # native API; temperature 0: the tiny model never repeats a token
            url = self.url + "/api/chat"
            body["options"] = {"num_predict": self.long_tokens(), "temperature": 0}
        else:
            url = self.url + "/v1/chat/completions"
            body.update(max_tokens=self.long_tokens(), temperature=0)
        while True:
            try:
                async with client.stream("POST", url, json=body, headers=self.headers) as r:
                    async for _ in r.aiter_raw():
                        pass
            except httpx.HTTPError as e:
                failures.append(e)
                await asyncio.sleep(0.2)

    # -- how the engine refuses ---------------------------------------------------------------------
    def engine_error(self) -> EngineError:
        if self.emulator is not None:
            status = 422 if self.engine in ("tabbyapi", "tgi") else 400
            self.emulator.config.fault_count = 1
            self.emulator.config.fault = f"error_status:{status}"
            return EngineError("m", {}, 400)
        if self.engine == "mlx":  # it has no context limit of its own; its own value checks answer 400
            return EngineError("m", {"top_k": -1}, 400, None, "top_k must be at least 0")
        if self.engine == "ollama":  # Ollama answers 500 for a bad option type: a client error
            return EngineError("m", {"options": {"num_ctx": "not-a-number"}}, 400, None, "num_ctx")
        # past the context of both engines (16,384 and 32,768 tokens: the tiny models take about one token per
        # byte here), but not past the gateway's own fit check, a lower bound (non-blank bytes / 8): the
        # engine's own refusal is what is under test. A completions prompt: a chat prompt this near a window
        # is counted by the engine's tokenizer first (prompt_count), and then the gateway refuses it itself
        body = {"prompt": "a " * 40000}
        if self.engine == "llama-server":
            return EngineError("m", body, 400, "context_length_exceeded", "context", "/v1/completions")
        return EngineError("m", body, 400, None, "context length", "/v1/completions")


def emulated(engine: str, **knobs: Any) -> Target:
    key = EMULATOR_KEY if engine in HAS_AUTH else None
    emu = EmulatorThread(EmulatorConfig(engine=engine, model="tiny", api_key=key, slots=4, **knobs))
    emu.__enter__()
    return Target(f"{engine}/emulator", engine, emu.url, "tiny", key, emulator=emu)


def real(engine: str, eng: RealEngine) -> Target:
    return Target(f"{engine}/real", engine, eng.url, eng.model, eng.api_key or None, real=eng)


def open_target(request: pytest.FixtureRequest, **knobs: Any) -> Iterator[Target]:
    """The body of each suite's module-scoped `target` fixture, whose param is "engine/real" or
    "engine/emulator": a real engine from its session fixture (tests/conftest.py), or an emulator
    (with `knobs`) started here and stopped when the module is done with it."""
    engine, kind = request.param.split("/")
    if kind == "real":
        yield real(engine, request.getfixturevalue(REAL_FIXTURES[engine]))
        return
    t = emulated(engine, **knobs)
    try:
        yield t
    finally:
        assert t.emulator is not None
        t.emulator.__exit__(None, None, None)
