"""Config hot reload and graceful shutdown, on a real gateway process in front of emulated engines."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from llm_gateway_emulators import EmulatorConfig, EmulatorThread
from tests.support.gateway_process import GatewayProcess, http_status
from tests.support.waiting import metric, wait_until

BASE = """
server: {{access_log: false, reload_poll_s: {poll}, graceful_shutdown_s: {grace}}}
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


GRACE_S = 60  # far beyond the few seconds a drain takes here, so "exits when drained" is not "at the deadline"


def base(url: str, poll: float = 0.2) -> str:
    return BASE.format(url=url, poll=poll, grace=GRACE_S)


@pytest.fixture(scope="module")
def engine() -> Iterator[EmulatorThread]:
    # 50 ms a token: a stream of 40 tokens stays open for about 2 s
    with EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8, tpot_ms=50)) as emu:
        yield emu


def _models(gw: GatewayProcess) -> list[str]:
    return [m["id"] for m in httpx.get(gw.url + "/v1/models", timeout=10).json()["data"]]


def _chat(gw: GatewayProcess, model: str) -> httpx.Response:
    return httpx.post(
        gw.url + "/v1/chat/completions",
        timeout=30,
        json={"model": model, "messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
    )


def _reloads(gw: GatewayProcess, result: str) -> float:
    return metric(gw.url, "gateway_config_reloads_total", result=result) or 0.0


class SlowStream(threading.Thread):
    """A client streaming `tokens` tokens; records what it saw."""

    def __init__(self, url: str, model: str = "model-a", tokens: int = 40) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.tokens = url, model, tokens
        self.first_chunk = threading.Event()
        self.done = threading.Event()
        self.events: list[str] = []
        self.status: int | None = None
        self.backend: str | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": "x"}],
            "max_tokens": self.tokens,
            "stream": True,
        }
        try:
            with httpx.Client(timeout=60) as c, c.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
                self.status, self.backend = r.status_code, r.headers.get("x-gateway-backend")
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.first_chunk.set()
        except BaseException as e:
            self.error = e
        finally:
            self.first_chunk.set()
            self.done.set()

    def started(self) -> None:
        assert self.first_chunk.wait(30), "the stream never started"
        assert not self.done.is_set(), (self.status, self.error, self.events[-3:])

    def contents(self) -> list[str]:
        return [e for e in self.events if '"content":"' in e and '"content":""' not in e]

    def complete(self) -> bool:
        return (
            self.status == 200
            and self.error is None
            and self.events[-1:] == ["[DONE]"]
            and not any(e.startswith('{"error"') for e in self.events)
            and len(self.contents()) == self.tokens
        )

    def ids(self) -> set[str]:
        """The completion ids of its chunks: one upstream generation has one."""
        return {orjson.loads(e)["id"] for e in self.events if e.startswith("{")}


def test_hot_reload_adds_a_model_without_restart_or_failing_a_request_in_flight(engine, tmp_path) -> None:
    with GatewayProcess(base(engine.url), tmp_path) as gw:
        pid = gw.pid
        assert _models(gw) == ["model-a"]
        stream = SlowStream(gw.url)
        stream.start()
        stream.started()
        gw.write_config(base(engine.url) + EXTRA.format())  # the file watcher picks it up
        wait_until(lambda: "model-b" in _models(gw), what="model-b to be listed after the reload")
        assert _models(gw) == ["model-a", "model-b"]
        r = _chat(gw, "model-b")
        assert r.status_code == 200 and r.json()["model"] == "model-b"
        stream.join(60)
        assert stream.complete(), (stream.status, stream.error, stream.events[-3:])
        assert gw.pid == pid and gw.proc is not None and gw.proc.poll() is None
        assert _reloads(gw, "success") == 1


# Before: "moved" and "dropped" are served by backend "old" (a vLLM). After: "dropped" and backend "old" are gone,
# "moved" is served by backend "new" (an SGLang). No file watching: the reload happens at the SIGHUP, when the
# test sends it.
BEFORE = """
server: {{access_log: false, reload_poll_s: 0}}
auth: {{mode: none}}
backends:
  - {{name: old, engine: vllm, url: "{old}", capacity: 8, probe: {{interval_s: 0.5}}}}
  - {{name: new, engine: sglang, url: "{new}", capacity: 8, probe: {{interval_s: 0.5}}}}
models:
  - {{name: moved, deployments: [{{backend: old, model: tiny, format: safetensors}}]}}
  - {{name: dropped, deployments: [{{backend: old, model: tiny, format: safetensors}}]}}
  - {{name: stays, deployments: [{{backend: new, model: tiny, format: safetensors}}]}}
"""
AFTER = """
server: {{access_log: false, reload_poll_s: 0}}
auth: {{mode: none}}
backends:
  - {{name: new, engine: sglang, url: "{new}", capacity: 8, probe: {{interval_s: 0.5}}}}
models:
  - {{name: moved, deployments: [{{backend: new, model: tiny, format: safetensors}}]}}
  - {{name: stays, deployments: [{{backend: new, model: tiny, format: safetensors}}]}}
"""


def test_streams_in_flight_on_a_removed_or_repointed_model_finish_on_the_old_config(tmp_path) -> None:
    tokens = 60  # at 100 ms a token: 6 s, while the reload takes a fraction of a second
    with (
        EmulatorThread(EmulatorConfig(engine="vllm", model="tiny", slots=8, tpot_ms=100)) as old,
        EmulatorThread(EmulatorConfig(engine="sglang", model="tiny", slots=8)) as new,
        GatewayProcess(BEFORE.format(old=old.url, new=new.url), tmp_path) as gw,
    ):
        moving, dropping = SlowStream(gw.url, "moved", tokens), SlowStream(gw.url, "dropped", tokens)
        for s in (moving, dropping):
            s.start()
        for s in (moving, dropping):
            s.started()
        assert old.stats.active == 2 and new.stats.requests_total == 0
        gw.write_config(AFTER.format(new=new.url))
        gw.signal(signal.SIGHUP)
        wait_until(lambda: _reloads(gw, "success") == 1, what="the SIGHUP reload to be applied")
        # both streams span the reload (else this test would prove nothing)
        assert not moving.done.is_set() and not dropping.done.is_set(), "a stream ended before the reload"
        # a request after the reload sees the new config
        moved = _chat(gw, "moved")
        dropped = _chat(gw, "dropped")
        listed = _models(gw)
        in_flight_after = not moving.done.is_set() and not dropping.done.is_set()
        moving.join(60)
        dropping.join(60)
    assert moved.status_code == 200, moved.text
    assert (moved.headers["x-gateway-backend"], moved.headers["x-gateway-engine"]) == ("new", "sglang")
    assert dropped.status_code == 404 and dropped.json()["error"]["code"] == "model_not_found"
    assert listed == ["moved", "stays"]
    assert in_flight_after, "a stream ended before the new config was seen"
    # ... while the streams that began before it finished on the old one: every chunk, from the old engine
    for s in (moving, dropping):
        assert s.complete(), (s.model, s.status, s.error, len(s.contents()), s.events[-3:])
        assert s.backend == "old"
        assert len(s.ids()) == 1, s.ids()  # one generation, not one resumed or restarted elsewhere
    assert old.stats.requests_total == 2 and old.stats.completed == 2
    assert new.stats.requests_total == 1  # only the request made after the reload


def test_a_broken_config_file_leaves_everything_working(engine, tmp_path) -> None:
    with GatewayProcess(base(engine.url), tmp_path) as gw:
        broken = base(engine.url).replace("engine: vllm", "engine: not-an-engine")
        gw.write_config(broken)
        wait_until(lambda: _reloads(gw, "failure") >= 1, what="the broken file to be rejected")
        assert _reloads(gw, "failure") == 1
        assert "backends[0].engine" in gw.log_text() and "gateway.yaml:5" in gw.log_text()
        gw.write_config("models: [this is: not: valid yaml")
        wait_until(lambda: _reloads(gw, "failure") >= 2, what="the invalid YAML to be rejected")
        assert _reloads(gw, "failure") == 2 and _reloads(gw, "success") == 0
        assert _models(gw) == ["model-a"]
        assert _chat(gw, "model-a").status_code == 200
        # a fixed file is taken
        gw.write_config(base(engine.url) + EXTRA.format())
        wait_until(lambda: "model-b" in _models(gw), what="the fixed file to be taken")
        assert _reloads(gw, "success") == 1


def test_sighup_reloads_on_demand(engine, tmp_path) -> None:
    # no file watching: only the signal can make the gateway read the new file
    with GatewayProcess(base(engine.url, poll=0), tmp_path) as gw:
        gw.write_config(base(engine.url, poll=0) + EXTRA.format())
        gw.signal(signal.SIGHUP)
        wait_until(lambda: "model-b" in _models(gw), what="model-b to be listed after SIGHUP")
        assert _reloads(gw, "success") == 1
        assert _chat(gw, "model-b").status_code == 200


def test_sigterm_during_a_stream_lets_it_finish_within_the_grace_period(engine, tmp_path) -> None:
    gw = GatewayProcess(base(engine.url), tmp_path).start()
    try:
        stream = SlowStream(gw.url, tokens=80)  # 4 s
        stream.start()
        stream.started()
        t = time.monotonic()
        gw.signal(signal.SIGTERM)
        wait_until(
            lambda: http_status(gw.url + "/healthz", 1.0) is None, what="the gateway to stop accepting connections"
        )
        assert not stream.done.is_set(), "the stream ended before the shutdown began: this test would prove nothing"
        stream.join(60)
        assert stream.complete(), (stream.status, stream.error, stream.events[-3:])
        assert gw.proc is not None
        assert gw.proc.wait(2 * GRACE_S) == 0
        assert time.monotonic() - t < GRACE_S  # by itself, once the stream is done: not at the grace period's end
    finally:
        gw.stop()
