"""The data passed between an engine and the shared driver.

``EngineHost`` (what an engine needs from the emulator that hosts it), ``Result`` (one
finished generation: text, finish, token counts, timestamps), ``StreamFormat`` (the bytes
of one streamed response, overridden per engine) and ``InferenceJob`` (one inference request
as the engine read it: limits, stop strings, formatter or body builder, queue bound and
hooks). Named apart from the product's ``llm_gateway.service.runtime.Runtime`` and
``llm_gateway.service.pipeline.Job``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from llm_gateway_emulators import wire
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.scheduler import SlotPool
from llm_gateway_emulators.stats import Histogram, Stats

if TYPE_CHECKING:
    from llm_gateway_emulators.config import EmulatorConfig

Reply = tuple[int, wire.Headers, bytes]


class EngineHost(Protocol):
    """What an engine needs from the emulator that hosts it."""

    config: EmulatorConfig
    stats: Stats
    pool: SlotPool
    hist: dict[str, Histogram]
    started_wall: float
    bind_host: str

    def loading(self) -> bool: ...

    def is_loopback_bind(self) -> bool: ...


@dataclass(eq=False)
class Result:
    """One finished (or aborted) generation, for usage, timings and bodies."""

    text: str = ""
    reasoning: str = ""  # non-streamed reasoning text (config.reasoning_tokens)
    finish: str | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    matched: str | None = None
    t_arrive: float = 0.0
    t_slot: float = 0.0
    t_first: float = 0.0
    t_end: float = 0.0
    load_ns: int = 0


class StreamFormat:
    """Bytes of one streamed response; engines override what differs."""

    def headers(self) -> wire.Headers:
        raise NotImplementedError

    def first(self) -> bytes:
        """Sent just before the first token (a role chunk), or nothing."""
        return b""

    def token(self, delta: str) -> bytes:
        raise NotImplementedError

    def reasoning(self, delta: str) -> bytes:
        """A reasoning delta, in the engine's reasoning field."""
        raise NotImplementedError

    def final(self, delta: str, res: Result) -> bytes:
        """The last token, finish, usage and terminator, as the engine sends them."""
        raise NotImplementedError

    def error(self) -> bytes:
        """The engine's in-band error (and terminator, where it sends one)."""
        raise NotImplementedError

    def huge(self, size: int) -> bytes:
        return self.token("x" * size)

    def repeat_abort(self) -> bytes:
        return b""

    def queue_full(self) -> bytes:
        return self.error()

    def ping(self) -> bytes | None:
        return None


@dataclass(eq=False)
class InferenceJob:
    """One inference request as the engine read it."""

    stream: bool
    limit: int
    finish_at_limit: str
    stops: list[str]
    prompt_tokens: int
    body: Callable[[Result], Reply] | None = None
    fmt: StreamFormat | None = None
    error_reply: Callable[[], Reply] | None = None
    queue_bound: int | None = None
    queue_full: Callable[[Request], Awaitable[None]] | None = None
    prepare: Callable[[], Awaitable[int]] | None = None
    ping_interval: float | None = None
    #: chat endpoints only: config.reasoning_tokens applies
    reasoning: bool = False
    effective: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def embedding(
        cls, prompt_tokens: int, body: Callable[[Result], Reply], error_reply: Callable[[], Reply]
    ) -> InferenceJob:
        """An embeddings request: takes a slot and the prompt's prefill time, generates nothing."""
        return cls(
            stream=False,
            limit=0,
            finish_at_limit="length",
            stops=[],
            prompt_tokens=prompt_tokens,
            body=body,
            error_reply=error_reply,
        )
