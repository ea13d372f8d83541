"""Engine kind -> adapter class, and what config validation asks of adapters."""

from __future__ import annotations

from llm_gateway.adapters.aphrodite import AphroditeAdapter
from llm_gateway.adapters.audio import AUDIO_KINDS
from llm_gateway.adapters.base import Adapter
from llm_gateway.adapters.dynamo import DynamoAdapter
from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.lmstudio import LMStudioAdapter
from llm_gateway.adapters.mlc import MLCAdapter
from llm_gateway.adapters.mlx import MLXAdapter
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.openai_generic import GenericOpenAIAdapter
from llm_gateway.adapters.scoring import RERANK_PATHS, SCORE_PATHS
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.tgi import TGIAdapter
from llm_gateway.adapters.tokenize import TOKENIZING_KINDS
from llm_gateway.adapters.trtllm import TRTLLMAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.types import BackendInfo

ADAPTERS: dict[str, type[Adapter]] = {
    cls.kind: cls
    for cls in (
        LlamaServerAdapter,
        VLLMAdapter,
        SGLangAdapter,
        OllamaAdapter,
        TabbyAPIAdapter,
        LMDeployAdapter,
        AphroditeAdapter,
        TRTLLMAdapter,
        MLXAdapter,
        MLCAdapter,
        TGIAdapter,
        DynamoAdapter,
        LMStudioAdapter,
        GenericOpenAIAdapter,
    )
}


def adapter_for(kind: str, backend: BackendInfo) -> Adapter:
    return ADAPTERS[kind](backend)


def formats_for(kind: str) -> frozenset[str] | None:
    """Weight formats the engine can load (None: unknown, any is accepted)."""
    return ADAPTERS[kind].formats


def unsupported_capabilities(kind: str) -> frozenset[str]:
    # the capabilities of routes outside a generation, which only the engines that serve them may have
    # (adapters/tokenize.py, adapters/scoring.py, adapters/audio.py)
    served = {"tokenize": TOKENIZING_KINDS, "rerank": RERANK_PATHS, "score": SCORE_PATHS, "audio": AUDIO_KINDS}
    return ADAPTERS[kind].unsupported_capabilities | {cap for cap, kinds in served.items() if kind not in kinds}


def serves_lora(kind: str) -> bool:
    """Can the engine serve LoRA adapters of its model (adapters/lora.py)?"""
    return ADAPTERS[kind].lora is not None


def schedules_by_priority(kind: str) -> bool:
    return ADAPTERS[kind].schedules_by_priority
