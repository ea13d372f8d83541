"""The real engines' keep-alive against the gateway's connection pool: every connection the pool may
reuse is one the engine still keeps open.

A pooled connection that outlives the engine's own idle timeout is reused just as the engine closes it:
the request goes out on a dying socket and comes back as "closed without answering". That once took the
only llama-server backend of a contract run down (the prober reuses its connection every 4.5-5.5 s;
llama-server closes an idle one after 5 s). So `POOL_IDLE_S` (upstream/base.py) must stay under every
engine's idle timeout: here each real engine answers a second request on a connection left idle for the
pool's longest idle time, and on the same socket. (The H1 client also sends a request once more on a new
connection when a reused one closes before any byte of an answer: tests/unit/test_aiohttp_upstream.py.)

After a *streamed* answer an engine may close the connection although its headers said keep-alive: llama-server
does (its stream's content provider returns false at the end, and cpp-httplib then closes the socket). A
request that took that connection from the pool failed with `upstream_unreachable`, and one that had waited
in the queue already had its 200 and a `: queued` comment, so its client got an error event mid-stream
(15 of ~7,300 streams under load, fairness-2026-12-04.md D3). Here each real engine is asked directly
what it does after a stream, which the adapter must say (`Adapter.closes_after_stream`); and hundreds of
short streams go through the gateway with more of them than slots, so that every freed slot is handed to a
queued stream at once, with not one failed.
"""

from __future__ import annotations

import asyncio
import http.client
import time
from collections.abc import Iterator

import httpx
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.adapters.registry import ADAPTERS
from llm_gateway.types import BackendInfo, CallContext
from llm_gateway.upstream.base import POOL_IDLE_S
from tests.contract.targets import Target, open_target
from tests.support.gateway_process import GatewayProcess
from tests.support.real_engines import RealEngine

pytestmark = pytest.mark.timeout(120)

#: a cheap GET each engine answers without a key
HEALTH = {"llama-server": "/health", "vllm": "/health", "ollama": "/api/version"}


def test_every_real_engine_keeps_an_idle_connection_longer_than_the_gateways_pool(
    llama_server: RealEngine, vllm_server: RealEngine, ollama_server: RealEngine
) -> None:
    engines = {"llama-server": llama_server, "vllm": vllm_server, "ollama": ollama_server}
    conns = {name: http.client.HTTPConnection("127.0.0.1", eng.port, timeout=60) for name, eng in engines.items()}
    try:
        sockets = {}
        for name, conn in conns.items():
            conn.request("GET", HEALTH[name])
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200, (name, resp.status)
            assert not resp.will_close, f"{name} closed the connection after one answer"
            sockets[name] = conn.sock
        time.sleep(POOL_IDLE_S + 0.3)  # idle a little past the pool's longest: the pool never reuses older
        for name, conn in conns.items():
            try:
                conn.request("GET", HEALTH[name])
                resp = conn.getresponse()
            except (ConnectionError, http.client.HTTPException) as e:
                pytest.fail(f"{name} closed a connection idle for {POOL_IDLE_S + 0.3:.1f} s: {e!r}")
            resp.read()
            assert resp.status == 200, (name, resp.status)
            assert conn.sock is sockets[name], f"{name}: the second answer came on another connection"
    finally:
        for conn in conns.values():
            conn.close()


# -- after a streamed answer --------------------------------------------------------------------------------

REAL = ["llama-server/real", "vllm/real", "ollama/real"]
PAIRS = 5  # streamed answers, each followed by a second request on its connection


@pytest.fixture(scope="module", params=REAL)
def target(request: pytest.FixtureRequest) -> Iterator[Target]:
    yield from open_target(request)


@pytest.mark.timeout(600)  # an engine's first start (vLLM: a minute or two) counts
def test_the_adapter_says_whether_its_engine_closes_the_connection_after_a_streamed_answer(target: Target) -> None:
    adapter = ADAPTERS[target.engine](BackendInfo("b", target.url, target.api_key))
    ctx = CallContext("chat", "m", target.model, True, False, "ka-check")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    req = adapter.build("chat", body, ctx)
    req.headers.pop("Connection", None)  # what the engine does on its own, not what it is asked
    closed, kept = 0, 0
    for _ in range(PAIRS):
        conn = http.client.HTTPConnection("127.0.0.1", int(target.url.rsplit(":", 1)[1]), timeout=60)
        try:
            conn.request(req.method, req.path, req.body, req.headers)
            resp = conn.getresponse()
            assert resp.status == 200, (resp.status, resp.read()[:300])
            resp.read()  # the whole stream
            assert not resp.will_close, "the engine said it would close: the pool would never keep it"
            try:
                conn.request(req.method, req.path, req.body, req.headers)
                again = conn.getresponse()
                again.read()
                kept += 1
            except (ConnectionError, http.client.HTTPException):
                closed += 1
        finally:
            conn.close()
    assert (closed, kept) in ((PAIRS, 0), (0, PAIRS)), f"{target.id}: {closed} closed, {kept} kept"
    assert adapter.closes_after_stream == (closed == PAIRS), (target.id, closed, kept)


STREAMS = 300  # short streams through the gateway, per engine
CLIENTS = 6  # streams in flight at once, over SLOTS slots: the rest wait in the gateway's queue
SLOTS = 2
KEY = "sk-contract-keepalive-0123456789"
CONFIG = """
server: {{access_log: false}}
auth:
  mode: keys
  keys: [{{name: k, sha256: "{sha}"}}]
routing: {{retries: 0, queue_progress_s: 0.05}}
backends:
  - {{name: e, engine: {engine}, url: "{url}", api_key: "{key}", max_queue: 64, queue_timeout_s: 120}}
models:
  - {{name: m, deployments: [{{backend: e, model: "{model}", format: {fmt}, max_concurrency: {slots}}}]}}
"""


@pytest.fixture(scope="module")
def gateway(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    cfg = CONFIG.format(sha=digest_of(KEY), slots=SLOTS, **target.config_fields)
    with GatewayProcess(cfg, tmp_path_factory.mktemp("gw-keepalive"), startup_timeout=60) as gw:
        yield gw


async def _streams(url: str, n: int, clients: int) -> tuple[list[str], int]:
    """`n` short streams, `clients` at a time: what went wrong with each that failed, and how many waited."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
    failures: list[str] = []
    queued = 0
    left = n

    async def one(c: httpx.AsyncClient) -> None:
        nonlocal queued
        async with c.stream("POST", url, json=body, headers={"authorization": f"Bearer {KEY}"}) as r:
            if r.status_code != 200:
                failures.append(f"{r.status_code}: {(await r.aread())[:200]!r}")
                return
            lines = [line async for line in r.aiter_lines() if line]
        queued += any(line.startswith(": queued") for line in lines)
        errors = [line for line in lines if line.startswith("data: {") and '"error"' in line]
        if errors or lines[-1:] != ["data: [DONE]"]:
            failures.append((errors or lines[-1:] or ["(empty)"])[0][:300])

    async def client() -> None:
        nonlocal left
        async with httpx.AsyncClient(timeout=120) as c:
            while left > 0:
                left -= 1
                await one(c)

    await asyncio.gather(*(client() for _ in range(clients)))
    return failures, queued


@pytest.mark.timeout(600)
def test_hundreds_of_queued_streams_through_the_gateway_all_succeed(gateway: GatewayProcess, target: Target) -> None:
    t0 = time.monotonic()
    failures, queued = asyncio.run(_streams(gateway.url + "/v1/chat/completions", STREAMS, CLIENTS))
    took = time.monotonic() - t0
    assert not failures, f"{target.id}: {len(failures)} of {STREAMS} streams failed in {took:.1f} s: {failures[:3]}"
    assert queued > STREAMS // 4, f"only {queued} of {STREAMS} streams waited in the queue: the test lost its point"
