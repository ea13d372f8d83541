"""Any other OpenAI-compatible server (`engine: openai`): OpenVINO Model Server, llama-swap, a hosted API.
(Aphrodite, TGI, TensorRT-LLM, MLX-LM, MLC LLM, Dynamo and LM Studio have kinds of their own.)

It is the shared OpenAI-compatible behaviour with no engine assumptions: readiness is a `GET
/v1/models` (the one route they all have), load is the gateway's own in-flight count, the weight
format is whatever the config says, and error bodies of every known shape are normalised. It has no
field table (adapters/field_table.py): what an unknown server honours is not known here, so every
request field is sent as it is and the server answers for it.
"""

from __future__ import annotations

from typing import ClassVar

from llm_gateway.adapters.openai_compat import OpenAICompatAdapter


class GenericOpenAIAdapter(OpenAICompatAdapter):
    kind: ClassVar[str] = "openai"
    formats: ClassVar[frozenset[str] | None] = None
    health_path: ClassVar[str | None] = None
    resident_when_ready: ClassVar[bool] = False  # any server (llama-swap, LM Studio) may load on demand
