"""Shared test helpers: configs from YAML text, an in-process gateway over ASGI (engines played at the
upstream seam by a FakeUpstream), keys."""

from __future__ import annotations

import os
import textwrap
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager

import httpx
import pytest

from llm_gateway.access.keys import digest_of
from llm_gateway.app import create_app
from llm_gateway.http.asgi import GatewayApp
from llm_gateway.settings import GatewayConfig
from llm_gateway.settings.loader import parse_config
from llm_gateway.upstream.base import UpstreamClient
from tests.support.dynamo_engine import DynamoServer
from tests.support.fake_upstream import FakeUpstream
from tests.support.mlx_engine import MlxServer
from tests.support.real_engines import EngineNotInstalled, LlamaServer, OllamaServer, RealEngine, VllmServer

# no silent skips where the suite must be complete, and the `real_engine` marker (see the module)
pytest_plugins = ["tests.support.skip_guard"]

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
    config: GatewayConfig, *, upstream: UpstreamClient | None = None, key: str | None = TEST_KEY
) -> AsyncIterator[tuple[httpx.AsyncClient, GatewayApp]]:
    """The gateway in-process (no probes, backends start 'unknown' = routable), driven over ASGI.

    Engines are played at the upstream seam by `upstream` (a `FakeUpstream`, by default one with no
    routes); when the block ends normally, no upstream response may have been left open."""
    up = upstream if upstream is not None else FakeUpstream()
    app = create_app(config, upstream=up, probes=False)
    headers = {"authorization": f"Bearer {key}"} if key else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test", headers=headers) as client:
        try:
            yield client, app
        finally:
            await app.shutdown()  # the app's own shutdown: its databases close here, not in the collector's thread
    if isinstance(up, FakeUpstream):
        up.assert_all_closed()


@pytest.fixture
def config_factory() -> Callable[..., GatewayConfig]:
    return make_config


# -- real engine processes, one of each per test session ------------------------------------------------
# A missing engine is a skip on a developer machine, but a failure where the suite is meant to be
# complete (scripts/test.sh sets LLM_GATEWAY_REQUIRE_ENGINES=1 after installing them).

LLAMA_KEY = "llama-engine-key-123"
VLLM_KEY = "vllm-engine-key-456"


def require(reason: str) -> None:
    if os.environ.get("LLM_GATEWAY_REQUIRE_ENGINES") == "1" or os.environ.get("LLM_GATEWAY_REQUIRE_TOOLS") == "1":
        pytest.fail(f"required but missing: {reason}")
    pytest.skip(reason)


def _start(engine: RealEngine) -> RealEngine:
    try:
        return engine.start()
    except EngineNotInstalled as e:
        require(f"engine not installed: {e}")
        raise


@contextmanager
def engines_started(engines: Sequence[RealEngine]) -> Iterator[None]:
    """For a fixture that starts its own engines, each appended to `engines` before it is started: an
    engine (or a model build) not installed while the block runs skips by the skip policy, and every
    engine in `engines` is stopped when the block ends."""
    try:
        yield
    except EngineNotInstalled as e:
        require(f"engine not installed: {e}")
        raise
    finally:
        for eng in engines:
            eng.stop()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    eng = _start(
        LlamaServer(
            parallel=1, ctx_size=16384, metrics=True, api_key=LLAMA_KEY, workdir=tmp_path_factory.mktemp("llama")
        )
    )
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    # 32,768 tokens of context (beyond the tiny model's 2,048 positions): a generation of a minute
    # for tests/e2e/test_openai_agents.py: a tool-call parser without a structural tag (pythonic: a named
    # tool choice is forced as JSON of the tool's parameters) and structured output without free
    # whitespace (constrained JSON then ends within a few tokens, even from the tiny model)
    eng = _start(
        VllmServer(
            max_num_seqs=2,
            max_model_len=32768,
            api_key=VLLM_KEY,
            workdir=tmp_path_factory.mktemp("vllm"),
            extra_args=(
                "--enable-auto-tool-choice",
                "--tool-call-parser",
                "pythonic",
                "--structured-outputs-config",
                '{"backend": "xgrammar", "disable_any_whitespace": true}',
            ),
        )
    )
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def ollama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    # two slots: a probe or a second request never queues behind a generation someone abandoned
    eng = _start(OllamaServer(num_parallel=2, num_ctx=4096, workdir=tmp_path_factory.mktemp("ollama")))
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def mlx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    eng = _start(MlxServer(workdir=tmp_path_factory.mktemp("mlx")))
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def dynamo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    eng = _start(DynamoServer(workdir=tmp_path_factory.mktemp("dynamo")))
    yield eng
    eng.stop()
