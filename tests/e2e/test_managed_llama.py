"""Managed backends with REAL processes (issue 38): the gateway as a real process starts, swaps, stops and
restarts real `llama-server` engines itself (routing/managed.py). Three models (the tiny GGUF under three
names), a memory budget for one: alternating requests from three clients all succeed and the swaps are
counted and bounded; an idle engine is stopped after its TTL; `kill -9` of an engine mid-stream gives the
client an error event, and the next request gets a restarted engine."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import EngineNotInstalled, free_port, llama_server_binary, tiny_gguf
from tests.support.waiting import sample, scrape, wait_until

pytestmark = pytest.mark.real_engine

BACKEND = """
  - name: m{i}
    engine: llama-server
    url: http://127.0.0.1:{port}
    capacity: 1
    queue_timeout_s: 120
    probe: {{interval_s: 0.5}}
    managed:
      command: [{binary}, -m, {gguf}, --alias, "{{model}}", --host, "{{host}}", --port, "{{port}}",
                -c, "4096", -np, "1", -t, "1", --no-ui]
      memory_mb: 100
      idle_ttl_s: {ttl}
      start_timeout_s: 60
      restart_backoff_s: 0.2
"""
MODEL = """
  - name: m{i}
    deployments: [{{backend: m{i}, model: tiny-{i}, format: gguf}}]
"""


ADMIN_KEY = "sk-admin-managed-0123456789"


def config(ttl: float = 300, batch: float = 2) -> str:
    try:
        binary = llama_server_binary()
    except EngineNotInstalled as e:
        pytest.skip(str(e))
    gguf = tiny_gguf()
    backends = "".join(BACKEND.format(i=i, port=free_port(), binary=binary, gguf=gguf, ttl=ttl) for i in range(3))
    models = "".join(MODEL.format(i=i) for i in range(3))
    return (
        "auth: {mode: none}\n"
        f"admin: {{keys: [{{name: ops, sha256: {hashlib.sha256(ADMIN_KEY.encode()).hexdigest()}}}]}}\n"
        f"managed: {{memory_budget_mb: {{local: 150}}, swap_batch: {batch}, swap_hold_s: 10}}\n"
        f"backends:{backends}models:{models}"
    )


def _gateway(tmp_path: Path, **kw: float) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(config(**kw), tmp_path, env={"GATEWAY_SERVER__DATA_DIR": str(tmp_path / "data")})
    with gw:
        yield gw
    # on shutdown the gateway stopped every engine it started
    for pid in engine_pids(gw, live_only=False):
        assert not _alive(pid), f"engine {pid} outlived the gateway"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    yield from _gateway(tmp_path)


@pytest.fixture
def short_ttl_gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    yield from _gateway(tmp_path, ttl=1)


_seen: dict[str, set[int]] = {}


def engine_pids(gw: GatewayProcess, live_only: bool = True) -> list[int]:
    """The PIDs of the engines the gateway runs now (from /readyz), remembered for the shutdown check."""
    seen = _seen.setdefault(gw.url, set())
    if live_only:
        body = httpx.get(gw.url + "/readyz", timeout=10).json()
        now = [b["managed"]["pid"] for b in body["backends"].values() if b["managed"]["pid"]]
        seen.update(now)
        return now
    return sorted(seen)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


BODY = {"model": "slow", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def chat(gw: GatewayProcess, model: str, **extra: object) -> httpx.Response:
    body = {**BODY, "model": model, **extra}
    return httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=150)


def test_three_models_one_slot_alternating_clients_all_succeed_with_bounded_swaps(gateway: GatewayProcess) -> None:
    per_client = 3
    results: dict[int, list[int]] = {i: [] for i in range(3)}
    resident_max = [0.0]

    def client(i: int) -> None:
        for _ in range(per_client):
            results[i].append(chat(gateway, f"m{i}").status_code)

    def watch() -> None:  # the budget holds one engine: never two resident at once
        while any(len(r) < per_client for r in results.values()):
            used = sample(scrape(gateway.url), "gateway_managed_memory_used_mb", host="local") or 0.0
            resident_max[0] = max(resident_max[0], used)
            engine_pids(gateway)
            time.sleep(0.1)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)] + [threading.Thread(target=watch)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    took = time.monotonic() - t0
    assert results == {i: [200] * per_client for i in range(3)}, results
    m = scrape(gateway.url)
    loads = sample(m, "gateway_managed_loads_total") or 0
    swaps = sample(m, "gateway_managed_swaps_total", host="local") or 0
    assert 3 <= loads <= 3 * per_client, loads  # each model loaded at least once, never more than once a request
    assert swaps == loads - 1, (swaps, loads)  # every load after the first made room by unloading one
    assert resident_max[0] <= 150
    assert sample(m, "gateway_managed_memory_budget_mb", host="local") == 150
    assert (sample(m, "gateway_managed_load_seconds_count") or 0) == loads
    print(f"\n9 requests, 3 models, room for one: {loads:.0f} loads, {swaps:.0f} swaps, {took:.1f}s")


def test_an_idle_engine_is_stopped_after_its_ttl(short_ttl_gateway: GatewayProcess) -> None:
    gateway = short_ttl_gateway
    assert engine_pids(gateway) == []  # nothing runs before it is needed
    assert chat(gateway, "m1").status_code == 200
    [pid] = engine_pids(gateway)
    assert _alive(pid)
    wait_until(lambda: not _alive(pid), timeout=20, what="the idle engine to be stopped")
    m = scrape(gateway.url)
    assert sample(m, "gateway_managed_unloads_total", backend="m1", reason="idle") == 1
    assert sample(m, "gateway_backend_state", backend="m1", state="stopped") == 1
    assert sample(m, "gateway_managed_resident", backend="m1") == 0
    status = httpx.get(gateway.url + "/admin/status.json", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    [m1] = [b for b in status["backends"] if b["name"] == "m1"]
    assert m1["state"] == "stopped" and m1["managed"]["phase"] == "stopped" and m1["managed"]["loads"] == 1
    assert chat(gateway, "m1").status_code == 200  # started again on demand
    assert engine_pids(gateway) != [pid]


def test_kill_9_mid_stream_gives_an_error_event_and_the_next_request_a_restarted_engine(
    gateway: GatewayProcess,
) -> None:
    # the engine is started (and its PID known) before the stream, and the stream asks for far more tokens
    # than the tiny model writes before the kill: the kill lands right after the first content event, not
    # after a /readyz round trip during which the tiny model (well under a millisecond a token) could finish
    # a short answer (it did: 400 tokens, a whole answer, one run in three on a loaded machine)
    assert chat(gateway, "m2").status_code == 200
    [killed] = engine_pids(gateway)
    body = {**BODY, "model": "m2", "max_tokens": 3500, "stream": True, "temperature": 0}  # greedy: no early end
    events: list[str] = []
    sent = False
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=body, timeout=150) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if not sent and '"content":"' in line[6:] and '"content":""' not in line[6:]:
                os.kill(killed, signal.SIGKILL)  # the engine the gateway started, by its PID
                sent = True
    assert sent, events
    finished = [e for e in events if '"finish_reason":"' in e]
    assert not finished, finished  # cut mid-answer: the engine never finished it
    assert events[-1] == "[DONE]"
    errors = [orjson.loads(e)["error"] for e in events if e.startswith('{"error"')]
    assert len(errors) == 1, (len(events), events[-3:])
    r2 = chat(gateway, "m2")
    assert r2.status_code == 200, r2.text
    [pid] = engine_pids(gateway)
    assert pid != killed
    m = scrape(gateway.url)
    assert sample(m, "gateway_managed_deaths_total", backend="m2") == 1
    assert sample(m, "gateway_managed_restarts_total", backend="m2") == 1


NEVER_READY = """
auth: {{mode: none}}
routing: {{queue_progress_s: 0.5}}
backends:
  - name: slow
    engine: llama-server
    url: http://127.0.0.1:{port}
    queue_timeout_s: 2
    managed: {{command: [sleep, "300"], start_timeout_s: 60}}
models:
  - name: slow
    deployments: [{{backend: slow, model: slow, format: gguf}}]
"""


def test_the_load_time_counts_against_the_queue_wait_and_a_stream_hears_queue_comments(tmp_path: Path) -> None:
    """An engine that never becomes ready (a real process that never listens): the request waits in the queue
    for the load, is refused once the queue-wait budget is spent, and a stream hears `: queued` meanwhile."""
    with GatewayProcess(NEVER_READY.format(port=free_port()), tmp_path) as gw:
        t0 = time.monotonic()
        r = chat(gw, "slow")
        took = time.monotonic() - t0
        assert r.status_code == 429 and r.headers["x-gateway-reject-reason"] == "queue_timeout", r.text
        assert 1.9 <= took < 10, took
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json={**BODY, "stream": True}, timeout=30) as s:
            lines = list(s.iter_lines())
        assert s.status_code == 200
        assert sum(1 for ln in lines if ln.startswith(": queued")) >= 2, lines
        errors = [orjson.loads(ln[6:])["error"] for ln in lines if ln.startswith('data: {"error"')]
        assert len(errors) == 1 and "not ready within 2s" in errors[0]["message"], lines
        [pid] = engine_pids(gw)  # the process it started (never ready) ...
    assert not _alive(pid)  # ... is stopped with the gateway
