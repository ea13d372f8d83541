"""Aphrodite Engine (a vLLM fork), from aphrodite-engine/aphrodite-engine's source (its wheel is CUDA-only).

Read at @3bce4a6fa6243159abf925d94c56662ca0a4663a: `aphrodite/entrypoints/openai/engine/protocol.py`
(`ModelCard`, `owned_by: "aphrodite"`), `aphrodite/entrypoints/openai/server_utils.py` (Bearer on
`/v1*`, 401 `{"error":"Unauthorized"}`), `aphrodite/entrypoints/openai/cli_args.py` (port 2242) and
`aphrodite/v1/metrics/loggers.py` (the `aphrodite:` metric prefix). Everything else is vLLM's surface,
so this is the vLLM emulator (captured vLLM 0.32.0) with those differences; Aphrodite's own sampler
fields (DRY, XTC, mirostat, ...) are accepted like any extra (`extra="allow"`).
"""

from __future__ import annotations

from llm_gateway_emulators.engines.vllm import Vllm


class Aphrodite(Vllm):
    name = "aphrodite"
    owned_by = "aphrodite"
    metric_prefix = b"aphrodite:"

    def on_start(self) -> None:
        super().on_start()
        if self.cfg.version is None:
            self.fingerprint = self.fingerprint.replace("vllm-", "aphrodite-", 1)
