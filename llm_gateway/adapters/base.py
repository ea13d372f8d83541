"""The engine adapter protocol: the one seam behind which every engine difference lives.

An adapter, for its engine: builds the upstream request (path, the engine's own auth header, model
rewrite, parameter translation); turns a non-streamed answer into OpenAI JSON; returns a
`StreamRelay` that turns the engine's response stream into clean OpenAI SSE; turns the engine's
error bodies into the OpenAI envelope; probes readiness, served models and load; and, where the
engine can, counts a chat prompt's tokens with its own tokenizer.
Nothing outside `adapters/` branches on the engine kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from llm_gateway.errors import EngineErrorAnswer, GatewayError
from llm_gateway.types import BackendInfo, CallContext, Endpoint, ProbeResult, Usage


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes | None


class ProbeClient(Protocol):
    """What probes may do: cheap GETs against the backend. Raises UpstreamUnreachable/UpstreamTimeout."""

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]: ...

    def now(self) -> float: ...


class TokenizeClient(Protocol):
    """What token counting may do: POST a JSON body to the backend. Returns (status, body); raises
    BackendFailure as the upstream client does."""

    async def post(self, path: str, body: bytes, headers: Mapping[str, str]) -> tuple[int, bytes]: ...


class StreamRelay(Protocol):
    """Turns the engine's response body into OpenAI SSE bytes, chunk by chunk (`relay_base.RelayBase`
    holds what the relays share). What the engine's output looks like is known only here: the service
    reads the attributes after each `feed()`."""

    usage: Usage | None
    content_events: int
    #: bytes of generated text passed on (content, text, reasoning, tool-call arguments)
    text_bytes: int
    error: GatewayError | None
    #: True once the relay has passed on generated output (non-empty text, reasoning, or a tool call):
    #: role-only and empty chunks do not count (the service's time-to-first-token)
    output_started: bool

    def feed(self, data: bytes) -> bytes:
        """Bytes for the client now (possibly empty); an in-band engine error becomes one error event."""
        ...

    def finish(self) -> bytes:
        """At the engine's end of body: `[DONE]`, or an error event if the stream did not end cleanly."""
        ...

    def completion_estimate(self) -> int:
        """Completion tokens passed on so far, for a stream whose engine never reported its usage."""
        ...


class Adapter(ABC):
    """Base of every engine adapter. Subclasses set the class attributes and override what differs."""

    kind: ClassVar[str]
    #: weight formats the engine can load; None = unknown (generic OpenAI-compatible server)
    formats: ClassVar[frozenset[str] | None]
    #: does the engine report queue/running/KV load we can probe?
    reports_load: ClassVar[bool] = False
    #: does the engine serve whatever it has loaded, whatever `model` says? (then a served-models
    #: list that lacks the configured name is reported, but does not take the deployment out)
    ignores_model_name: ClassVar[bool] = False
    #: capabilities a deployment on this engine can never have
    unsupported_capabilities: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, backend: BackendInfo) -> None:
        self.backend = backend

    @abstractmethod
    def build(self, endpoint: Endpoint, body: dict[str, Any], ctx: CallContext) -> UpstreamRequest:
        """The upstream request for an OpenAI request body (which must not be mutated)."""

    @abstractmethod
    def response_body(self, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        """A 2xx non-streamed engine body as OpenAI JSON, and the usage it reports."""

    @abstractmethod
    def error(self, status: int, body: bytes, content_type: str) -> EngineErrorAnswer:
        """A non-2xx engine answer as an EngineErrorAnswer in the OpenAI envelope."""

    @abstractmethod
    def relay(self, ctx: CallContext) -> StreamRelay:
        """A fresh stream translator for one streamed call."""

    @abstractmethod
    async def probe(self, client: ProbeClient) -> ProbeResult:
        """Readiness, served models and load, from cheap endpoints only."""

    async def count_prompt_tokens(
        self, client: TokenizeClient, body: dict[str, Any], upstream_model: str
    ) -> int | None:
        """The prompt tokens of an OpenAI chat `body` by the engine's own tokenizer and chat template, or
        None where the engine has no way to count them (the caller then estimates)."""
        return None

    def stream_content_types(self) -> tuple[str, ...]:
        """Content types a streamed 2xx answer may have; anything else is a protocol error."""
        return ("text/event-stream",)
