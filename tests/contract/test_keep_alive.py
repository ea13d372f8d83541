"""The real engines' keep-alive against the gateway's connection pool: every connection the pool may
reuse is one the engine still keeps open.

A pooled connection that outlives the engine's own idle timeout is reused just as the engine closes it:
the request goes out on a dying socket and comes back as "closed without answering". That once took the
only llama-server backend of a contract run down (the prober reuses its connection every 4.5-5.5 s;
llama-server closes an idle one after 5 s). So `POOL_IDLE_S` (upstream/base.py) must stay under every
engine's idle timeout: here each real engine answers a second request on a connection left idle for the
pool's longest idle time, and on the same socket. (The H1 client also sends an idempotent request, a probe's
GET, once more on a new connection when a reused one closes before any answer: tests/unit/test_aiohttp_upstream.py.)
"""

from __future__ import annotations

import http.client
import time

import pytest

from llm_gateway.upstream.base import POOL_IDLE_S
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
