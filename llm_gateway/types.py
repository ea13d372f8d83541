"""The vocabulary every layer shares: endpoint kinds, token usage, one call's context, engine load.

These are plain data types with no behaviour and no imports from the project, so the bottom of the
house (next to errors.py) can hold them: adapters produce them, selection and the prober read them,
the service passes them along. Nothing here knows an engine. One more piece of shared vocabulary has a
little behaviour: `Capability`, how an optional capability (the methods a Protocol adds, e.g. exchange.py's
`DirectWriter`) is checked on the request path: once per type, never a method looked up by name per request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

_P = TypeVar("_P")

Endpoint = Literal["chat", "completions", "embeddings"]
ProbeState = Literal["ready", "loading", "down"]


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class LoraCall:
    """The LoRA adapter one call asks for (routing/lora.py): its name on the engine, the engine's own handle for
    it where it has one (llama-server's adapter id), and its scale."""

    name: str
    engine_id: int | None = None
    scale: float = 1.0


#: a call for the model itself where the model has adapters: an engine that would apply its start-up adapters to
#: a request that names none (llama-server) is told to apply none
NO_ADAPTER = LoraCall("", None, 0.0)


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
    #: the engine slot to ask for (routing/slots.py), for an engine whose adapter names a `slot_field`
    slot: int | None = None
    #: the LoRA adapter to apply (a model's adapter: adapters/lora.py names it in the body); None: the base model
    lora: LoraCall | None = None
    #: told back by the adapter: a whole answer's finish reasons as its parse of the answer read them (each choice's
    #: `finish_reason`, in order), for the request's span (observability/tracing.py) without a second reading of
    #: the bytes; None: not read (the span finds them in the answer's bytes)
    finish_reasons: list[str] | None = None


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


class Capability(Generic[_P]):
    """An optional capability: the methods a Protocol adds to its base (`PushResponse`'s `pipe` and `buffered` to
    `UpstreamResponse`), checked once per type.

    An object's methods are its type's, so the answer is kept per type, and a check is then a dict lookup
    (0.1 µs) where `isinstance` against a runtime-checkable Protocol costs 5-13 µs (it looks each member up on
    the object: Python 3.11), too much for every request. Only the methods the protocol itself declares are
    checked: the object's static type (the base) already promises the rest."""

    __slots__ = ("_by_type", "methods")

    def __init__(self, protocol: type) -> None:
        #: the capability's methods: those the protocol declares itself
        self.methods = tuple(n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_"))
        assert self.methods, f"{protocol.__name__} declares no method of its own"
        self._by_type: dict[type, bool] = {}

    def holds_for(self, kind: type) -> bool:
        """Has the type `kind` every method of the capability?"""
        return all(callable(getattr(kind, name, None)) for name in self.methods)

    def of(self, obj: object) -> _P | None:
        """`obj` as the protocol's, or None when its type lacks the capability (once per stream: a dozen
        bytecodes, bench/opcounts.py)."""
        has = self._by_type.get(type(obj))
        if has is None:
            has = self._by_type[type(obj)] = self.holds_for(type(obj))
        return obj if has else None  # type: ignore[return-value]  # its type has the methods: `typing.cast`, uncalled
