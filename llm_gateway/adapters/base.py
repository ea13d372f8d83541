"""The engine adapter protocol: the one seam behind which every engine difference lives.

An adapter, for its engine: builds the upstream request (path, the engine's own auth header, model
rewrite, parameter translation); turns a non-streamed answer into OpenAI JSON; returns a
`StreamRelay` that turns the engine's response stream into clean OpenAI SSE; turns the engine's
error bodies into the OpenAI envelope; probes readiness, served models and load; and, where the
engine can, counts a chat prompt's tokens with its own tokenizer.

Another API's request (Anthropic's Messages) is translated to chat unless the adapter declares that
its engine serves that API faithfully itself (`native_apis`, checked against the real engine by
tests/contract/test_native_messages.py): then the service passes the client's own body through
(`build_native`), and the answer comes back in that API's dialect (`native_response_body`,
`native_relay`). An engine version that turns out not to serve the route (`native_unserved`) is
translated from then on (`speaks_natively`). The engines' evidence, declared or refused, is in their
modules (vLLM declares; llama-server and SGLang refuse). LMDeploy, Ollama and TabbyAPI translate:
their newer releases have a /v1/messages (Ollama `anthropic/anthropic.go`, TabbyAPI
`endpoints/Anthropic/`), unchecked here (the Ollama we run, bigdl-core-cpp's, has none; no real
LMDeploy or TabbyAPI runs here, and their emulators serve none).
Nothing outside `adapters/` branches on the engine kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from llm_gateway.adapters.lora import LoraDriver
from llm_gateway.errors import EngineErrorAnswer, GatewayError
from llm_gateway.types import BackendInfo, CallContext, Endpoint, ProbeResult, Usage
from llm_gateway.wire.chat_events import ChatTranslation
from llm_gateway.wire.client_body import Body


@dataclass(slots=True)
class UpstreamRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Body | None  # bytes, or the client's bytes and added fields in pieces (wire/client_body.Spliced)


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
    holds what the relays share), or into another API's events through a translation (`translate`). What
    the engine's output looks like is known only here: the service reads the attributes after each
    `feed()`."""

    usage: Usage | None
    content_events: int
    #: bytes of generated text passed on (content, text, reasoning, tool-call arguments)
    text_bytes: int
    error: GatewayError | None
    #: True once the engine ended the stream cleanly and its last bytes were passed on: nothing follows
    done: bool
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

    def cut(self, choices: int, prompt_tokens: int) -> bytes:
        """End the stream now, as an engine does at `max_tokens` (finish reason `length` for each of
        `choices`), with nothing after it: the key's reservation is spent."""
        ...

    def fail(self, err: GatewayError) -> bytes:
        """The failure of the stream after its first byte, as the client's error event (nothing after it)."""
        ...


class TranslatedRelay(StreamRelay, Protocol):
    """A `StreamRelay` of OpenAI's chat stream that can answer another API's client instead."""

    def translate(self, tr: ChatTranslation) -> None:
        """From the first chunk on, return `tr`'s output (its API's events) instead of OpenAI SSE."""
        ...


class NativeRelay(StreamRelay, Protocol):
    """A `StreamRelay` for an API the engine serves natively: its bytes are already that API's events."""


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
    #: does the engine's scheduler read a request `priority` (deployments may pass the key's class on)?
    schedules_by_priority: ClassVar[bool] = False
    #: does the engine refuse a request whose prompt plus `max_tokens` exceeds its context window (vLLM,
    #: SGLang), rather than only one whose prompt does, cutting the generation at the window's end
    #: (llama-server)? Read by selection's fit check (candidates.fits); False never refuses a valid request.
    window_counts_output: ClassVar[bool] = False
    #: does the engine close the connection after a streamed answer, although its headers said keep-alive
    #: (llama-server)? Then a stream asks for `Connection: close`, and the upstream client never returns
    #: that connection to its pool: a queued request handed the freed slot at once would take it before the
    #: engine's close arrived, and fail. Checked against each real engine by tests/contract/test_keep_alive.py;
    #: each adapter's docstring says what its engine does.
    closes_after_stream: ClassVar[bool] = False
    #: has the engine a tokenizer endpoint, so that `count_prompt_tokens` counts a prompt with the engine's own
    #: tokenizer and chat template (llama-server, vLLM)? Only then is it asked (routing/prompt_count.py)
    counts_prompts: ClassVar[bool] = False
    #: the request field that asks the engine for one of its slots (llama-server `id_slot`; routing/slots.py),
    #: None where an engine takes none; `slot_count` is how many the engine said it has at the last probe
    slot_field: ClassVar[str | None] = None
    slot_count: int = 0
    #: how the engine serves LoRA adapters of its model (adapters/lora.py); None: it serves none
    lora: ClassVar[LoraDriver | None] = None

    def engine_priority(self, rank: int) -> int:
        """The engine's `priority` value for a gateway class rank (higher rank: sooner)."""
        raise NotImplementedError(f"{self.kind} does not schedule by priority")

    #: APIs besides OpenAI's that the engine serves faithfully itself, passed through rather than
    #: translated to chat: "messages" (Anthropic's /v1/messages, whole and streamed), "count_tokens"
    #: (/v1/messages/count_tokens). Declared only where the contract suite checked the real engine.
    native_apis: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, backend: BackendInfo) -> None:
        self.backend = backend
        #: native APIs this backend's engine turned out not to serve (an older version): translated
        self.unserved: set[str] = set()

    def speaks_natively(self, api: str, body: dict[str, Any] | None = None) -> bool:
        """Is a request of `api` (this client `body`, when given) passed through to this backend's engine
        rather than translated?"""
        return api in self.native_apis and api not in self.unserved

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
    def relay(self, ctx: CallContext) -> TranslatedRelay:
        """A fresh stream translator for one streamed call."""

    @abstractmethod
    async def probe(self, client: ProbeClient) -> ProbeResult:
        """Readiness, served models, their context windows and load, from cheap endpoints only."""

    async def kv_event_endpoints(self, client: ProbeClient) -> tuple[str, ...] | None:
        """The ZeroMQ endpoints the engine publishes its KV-cache events on, as a subscriber connects to them
        (routing/kv_events.py, a backend's `kv_events: auto`); None: the engine does not say."""
        return None

    # -- native APIs (only called for an API in `native_apis`) -----------------------------------------
    def build_native(self, api: str, body: dict[str, Any], ctx: CallContext) -> UpstreamRequest:
        """The upstream request for the client's own `api` body (which must not be mutated)."""
        raise NotImplementedError(f"{self.kind} does not serve '{api}' natively")

    def native_response_body(self, api: str, body: bytes, ctx: CallContext) -> tuple[bytes, Usage | None]:
        """A 2xx non-streamed native answer for the client (the public model name in it), and its usage."""
        raise NotImplementedError(f"{self.kind} does not serve '{api}' natively")

    def native_relay(self, api: str, ctx: CallContext) -> NativeRelay:
        """A fresh relay for one streamed native call."""
        raise NotImplementedError(f"{self.kind} does not serve '{api}' natively")

    def native_unserved(self, api: str, status: int, body: bytes) -> bool:
        """Does this error answer to a native `api` request mean the engine has no such route (a version
        before it)? Then `api` is translated on this backend from now on, this request included."""
        return False

    async def count_native_tokens(
        self, client: TokenizeClient, body: dict[str, Any], chat_body: dict[str, Any], upstream_model: str
    ) -> int | None:
        """The input tokens of a native count_tokens `body` by the engine's own count; where the engine
        turns out not to serve it, `count_prompt_tokens(chat_body)`."""
        return await self.count_prompt_tokens(client, chat_body, upstream_model)

    async def count_prompt_tokens(
        self, client: TokenizeClient, body: dict[str, Any], upstream_model: str
    ) -> int | None:
        """The prompt tokens of an OpenAI chat `body` by the engine's own tokenizer and chat template, or
        None where the engine has no way to count them (the caller then estimates). An adapter that
        overrides this says so (`counts_prompts`)."""
        return None

    def stream_content_types(self) -> tuple[str, ...]:
        """Content types a streamed 2xx answer may have; anything else is a protocol error."""
        return ("text/event-stream",)
