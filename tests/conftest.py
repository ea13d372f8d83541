"""Shared test helpers: configs from YAML text, an in-process gateway over ASGI, keys."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from gateway.app import create_app
from gateway.config_loader import parse_config
from gateway.core.auth import digest_of
from gateway.http.asgi import GatewayApp
from gateway.settings import GatewayConfig
from gateway.upstream.httpx_client import HttpxUpstream

TEST_KEY = "sk-test-alice-0123456789"
OTHER_KEY = "sk-test-bob-9876543210"


def make_config(text: str, env: dict[str, str] | None = None) -> GatewayConfig:
    base = {"ALICE_SHA": digest_of(TEST_KEY), "BOB_SHA": digest_of(OTHER_KEY)}
    return parse_config(textwrap.dedent(text), "test.yaml", {**base, **(env or {})})


ONE_BACKEND = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
backends:
  - name: engine-a
    engine: vllm
    url: http://engine-a.test
    api_key: engine-secret-a
    timeouts: {connect_s: 1, first_byte_s: 2, idle_s: 2, total_s: 10}
models:
  - name: public-model
    aliases: [pm]
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors, capabilities: [chat, completions, embeddings]}
"""


@asynccontextmanager
async def gateway_client(
    config: GatewayConfig, *, upstream: Any = None, key: str | None = TEST_KEY
) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayApp]]:
    """The gateway in-process (no probes, backends start 'unknown' = routable), driven over ASGI."""
    app = create_app(config, upstream=upstream or HttpxUpstream(), probes=False)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test", headers=headers) as client:
        try:
            yield client, app
        finally:
            await app.gw.aclose()


@pytest.fixture
def config_factory() -> Callable[..., GatewayConfig]:
    return make_config
