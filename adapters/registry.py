"""Engine kind -> adapter class, and what config validation asks of adapters."""

from __future__ import annotations

from adapters.base import Adapter, BackendInfo
from adapters.llama_server import LlamaServerAdapter
from adapters.lmdeploy import LMDeployAdapter
from adapters.ollama import OllamaAdapter
from adapters.openai_generic import GenericOpenAIAdapter
from adapters.sglang import SGLangAdapter
from adapters.tabbyapi import TabbyAPIAdapter
from adapters.vllm import VLLMAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    cls.kind: cls
    for cls in (
        LlamaServerAdapter,
        VLLMAdapter,
        SGLangAdapter,
        OllamaAdapter,
        TabbyAPIAdapter,
        LMDeployAdapter,
        GenericOpenAIAdapter,
    )
}


def adapter_for(kind: str, backend: BackendInfo) -> Adapter:
    return ADAPTERS[kind](backend)


def formats_for(kind: str) -> frozenset[str] | None:
    """Weight formats the engine can load (None: unknown, any is accepted)."""
    return ADAPTERS[kind].formats


def unsupported_capabilities(kind: str) -> frozenset[str]:
    return ADAPTERS[kind].unsupported_capabilities
