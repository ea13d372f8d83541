"""Fixtures for end-to-end tests against real engine processes.

A missing engine is a skip on a developer machine, but a failure where the suite is meant to be
complete (CI sets LLM_GATEWAY_REQUIRE_ENGINES=1 after installing them), so nothing is silently
left out there.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.support.real_engines import EngineNotInstalled, LlamaServer, OllamaServer, RealEngine, VllmServer


def _start(engine: RealEngine) -> RealEngine:
    try:
        return engine.start()
    except EngineNotInstalled as e:
        if os.environ.get("LLM_GATEWAY_REQUIRE_ENGINES") == "1":
            pytest.fail(f"engine required but not installed: {e}")
        pytest.skip(f"engine not installed: {e}")


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    eng = _start(LlamaServer(parallel=1, ctx_size=4096, metrics=True, workdir=tmp_path_factory.mktemp("llama")))
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    eng = _start(VllmServer(max_num_seqs=2, workdir=tmp_path_factory.mktemp("vllm")))
    yield eng
    eng.stop()


@pytest.fixture(scope="session")
def ollama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealEngine]:
    eng = _start(OllamaServer(workdir=tmp_path_factory.mktemp("ollama")))
    yield eng
    eng.stop()
