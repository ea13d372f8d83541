"""Faithful fake LLM engine servers for tests, fault injection and load tests.

Development only: the distribution ``llm-gateway-emulators`` (``pip install -e emulators/``),
not part of the product wheel. Six engines (llama.cpp ``llama-server``, vLLM, SGLang, Ollama,
TabbyAPI, LMDeploy), each reproducing the routes, heads, bodies, stream framing, errors, auth,
loading states and load metrics of the real server: byte for byte against the raw captures in
``tests/emulators/captures/`` (llama-server, vLLM 0.32.0, Ollama 0.5.4), and otherwise as the
engine's source at the commit each ``engines/*`` module names (for example SGLang's
``python/sglang/srt/entrypoints/openai/protocol.py`` @9b116df).

In-process::

    async with Emulator(EmulatorConfig(engine="vllm"), port=0) as emu:
        emu.url, emu.config, emu.stats

In a thread: ``with EmulatorThread(cfg) as emu: ...``. CLI: ``python -m llm_gateway_emulators ENGINE``.
Module map: ``config`` (knobs), ``httpserver`` (raw HTTP/1.1), ``server`` (lifecycle and
control endpoints), ``engine`` (routing and the shared generation driver), ``scheduler``
(slots and queue), ``faults`` (fault selection and semantics), ``textgen`` (tokens, stop
strings, embeddings), ``stats``, ``prom_text``, ``wire``, ``engines/*`` (one per engine).
"""

from llm_gateway_emulators.config import ENGINES, FAULTS, EmulatorConfig
from llm_gateway_emulators.server import Emulator, EmulatorThread
from llm_gateway_emulators.stats import Stats
from llm_gateway_emulators.textgen import VOCAB, expected_text

__all__ = [
    "ENGINES",
    "FAULTS",
    "VOCAB",
    "Emulator",
    "EmulatorConfig",
    "EmulatorThread",
    "Stats",
    "expected_text",
]
