"""The config schema's shared words: the engine kinds, weight formats, capabilities, priority classes and
routing strategies a config may name, the pattern of a name, and the strict base every section builds on.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

EngineKind = Literal[
    "llama-server",
    "vllm",
    "sglang",
    "ollama",
    "tabbyapi",
    "lmdeploy",
    "aphrodite",
    "trtllm",
    "mlx",
    "mlc",
    "tgi",
    "dynamo",
    "lmstudio",
    "openai",
]
#: `mlx`: MLX-converted weights (MLX-LM, LM Studio on Apple silicon); `mlc`: MLC LLM's compiled weights
WeightFormat = Literal["gguf", "exl2", "exl3", "awq", "gptq", "fp8", "safetensors", "mlx", "mlc"]
Capability = Literal[
    "chat", "completions", "embeddings", "tools", "vision", "json_schema", "tokenize", "rerank", "score", "audio"
]
PriorityClass = Literal["interactive", "default", "batch"]
#: the queue rank of each class: higher goes first
PRIORITY_RANKS: dict[str, int] = {"interactive": 2, "default": 1, "batch": 0}
#: each rank's class name (metric labels, span attributes)
CLASS_NAMES: dict[int, str] = {rank: name for name, rank in PRIORITY_RANKS.items()}
Strategy = Literal["least_load", "round_robin", "weighted", "priority", "prefix_affinity", "cache_aware"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/+-]{0,127}$"  # no "@": it separates a format suffix
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


def dupes(what: str, values: list[str], *, show: bool = True) -> None:
    """Refuse the first value seen twice (`show=False`: without echoing it, for digests)."""
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ValueError(f"duplicate {what}" + (f": {v!r}" if show else ""))
        seen.add(v)


class Strict(BaseModel):
    """Every section: unknown fields are errors, and a loaded config never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
