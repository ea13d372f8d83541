"""One module per engine; ``make_engine`` picks the class for an engine name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llm_gateway_emulators.engine import Engine
from llm_gateway_emulators.jobs import EngineHost


def make_engine(name: str, rt: EngineHost) -> Engine:
    if name == "llama-server":
        from llm_gateway_emulators.engines.llama_server import LlamaServer

        return LlamaServer(rt)
    if name == "vllm":
        from llm_gateway_emulators.engines.vllm import Vllm

        return Vllm(rt)
    if name == "sglang":
        from llm_gateway_emulators.engines.sglang import Sglang

        return Sglang(rt)
    if name == "ollama":
        from llm_gateway_emulators.engines.ollama import Ollama

        return Ollama(rt)
    if name == "tabbyapi":
        from llm_gateway_emulators.engines.tabbyapi import TabbyApi

        return TabbyApi(rt)
    if name == "lmdeploy":
        from llm_gateway_emulators.engines.lmdeploy import LmDeploy

        return LmDeploy(rt)
    if name in FAMILY:
        import importlib

        module, cls = FAMILY[name]
        engine: Engine = getattr(importlib.import_module(f"llm_gateway_emulators.engines.{module}"), cls)(rt)
        return engine
    raise ValueError(f"unknown engine {name!r}")


#: the engines of issue 39, emulated from their sources: engine name -> (module, class)
FAMILY = {
    "aphrodite": ("aphrodite", "Aphrodite"),
    "trtllm": ("trtllm", "TrtllmServe"),
    "tgi": ("tgi", "Tgi"),
    "mlc": ("mlc", "Mlc"),
    "lmstudio": ("lmstudio", "LmStudio"),
    "dynamo": ("dynamo", "Dynamo"),
}
