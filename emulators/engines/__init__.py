"""One module per engine; ``make_engine`` picks the class for an engine name."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..engine import Engine
from ..jobs import Runtime


def make_engine(name: str, rt: Runtime) -> Engine:
    if name == "llama-server":
        from .llama_server import LlamaServer

        return LlamaServer(rt)
    if name == "vllm":
        from .vllm import Vllm

        return Vllm(rt)
    if name == "sglang":
        from .sglang import Sglang

        return Sglang(rt)
    if name == "ollama":
        from .ollama import Ollama

        return Ollama(rt)
    if name == "tabbyapi":
        from .tabbyapi import TabbyApi

        return TabbyApi(rt)
    if name == "lmdeploy":
        from .lmdeploy import LmDeploy

        return LmDeploy(rt)
    raise ValueError(f"unknown engine {name!r}")
