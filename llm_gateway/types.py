"""The vocabulary every layer shares: endpoint kinds, token usage, one call's context, engine load.

These are plain data types with no behaviour and no imports from the project, so the bottom of the
house (next to errors.py) can hold them: adapters produce them, selection and the prober read them,
the service passes them along. Nothing here knows an engine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Endpoint = Literal["chat", "completions", "embeddings"]
ProbeState = Literal["ready", "loading", "down"]


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class CallContext:
    """What an adapter needs to know about one call."""

    endpoint: Endpoint
    public_model: str
    upstream_model: str
    stream: bool
    client_wants_usage: bool
    request_id: str
    reasoning_field: str = "reasoning_content"
    embedding_b64: bool = False
    #: the API whose own body this call passes through to the engine ("messages": Anthropic's), or
    #: None when the call is translated to `endpoint`; chosen per attempt (a failover may change it)
    native_api: str | None = None
    #: the request's class rank, for an engine that schedules by priority (the deployment's
    #: `engine_priority`); None: not passed on
    priority_rank: int | None = None


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """Engine-reported load, normalised. None = the engine does not say (unknown, never idle)."""

    running: float | None
    waiting: float | None
    kv: float | None
    at: float
    #: the engine's own prompt-cache counters, cumulative tokens as it counts them (None: it does not say):
    #: prompt tokens it computed (those served from its cache not counted: llama-server), and its prefix
    #: cache's looked-up and hit tokens (vLLM); re-exported by routing/gauges.py
    computed: float | None = None
    cache_queries: float | None = None
    cache_hits: float | None = None


@dataclass(frozen=True, slots=True)
class ProbeResult:
    state: ProbeState
    load: LoadSnapshot | None = None
    models: frozenset[str] | None = None
    detail: str = ""
    #: the context window (prompt plus output tokens, per sequence) of each served model, as the
    #: engine reports it; None: the probe did not learn it (the last known stays)
    context_lengths: dict[str, int] | None = None
    #: whether each served model is loaded and can answer without a cold load (True) or not (False: a
    #: model Ollama has not loaded, a sleeping vLLM); None: the engine cannot tell (unknown, as before)
    resident: dict[str, bool] | None = None


@dataclass(slots=True)
class BackendInfo:
    name: str
    base_url: str
    api_key: str | None = field(default=None, repr=False)


#: the values of one usage-ledger row, in order: the ledger (observability/ledger.py) builds them as tuples
#: and the database (state/usage.py) inserts them as they are, adding the row's UTC day
USAGE_COLUMNS = (
    "at_ms",
    "request_id",
    "key",
    "key_id",
    "model",
    "backend",
    "endpoint",
    "status",
    "outcome",
    "prompt_tokens",
    "completion_tokens",
    "usage_estimated",
    "ttft_ms",
    "duration_ms",
)
