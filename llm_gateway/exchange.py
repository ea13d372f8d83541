"""The client exchange: what the service needs from the HTTP layer to answer one request.

The service owns this interface and the HTTP layer implements it (`http/call.py`'s `Call`), so the
service never imports the HTTP layer nor writes ASGI messages: it answers whole (`respond`), or
starts a stream and writes to it (`start`, `write`, `end`), and asks to be cancelled when the client
goes away (`watch_disconnect`, `stop_watching`). The exchange records the status it sent, so no
caller keeps a second copy of it. Like httpx's transport seam, it sits below the code that uses it.

An exchange of another API (Anthropic's Messages) translates what the service answers in OpenAI's
dialect. Where it also offers its client's own body (`NativeDialect`, handed to the service beside
the exchange), the service may pass that body to an engine that speaks the API itself; it then says,
before it answers, whether the answer that follows is already in the exchange's dialect
(`answer_natively`): per request, since a failover may move it from such an engine to another.

An exchange may also offer a direct chunk writer (`DirectWriter`, the gateway's own server's): the stream
relay then writes each event from the upstream connection's callback (its push mode). The relay checks for
it once per exchange type (service/stream.py), never by name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

Headers = list[tuple[bytes, bytes]]
JSON = b"application/json"


class ClientExchange(Protocol):
    """One client's request and its answer, as the service sees it."""

    rid: str  # the request id (the client's x-request-id when it is sane, else a fresh one)
    status: int  # the status sent so far; 0 until the answer has started

    def header(self, name: bytes) -> bytes | None:
        """The request header `name` (lower-case bytes), or None."""
        ...

    async def respond(self, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
        """A whole answer: status, headers (content type and length are added) and body."""
        ...

    async def start(self, status: int, headers: Headers, *, hold: bool = False) -> None:
        """The head of a streamed answer; the body follows with `write` and ends with `end`. `hold`: the
        caller writes at once, and the head may wait to leave with that first part (one send)."""
        ...

    async def write(self, data: bytes) -> None:
        """Part of a streamed body, sent at once."""
        ...

    async def end(self, data: bytes = b"") -> None:
        """The end of a streamed body, `data` its last part (sent with the end: one send)."""
        ...

    def watch_disconnect(self, delay_s: float = 0.0) -> None:
        """Cancel the calling task if the client goes away (after `delay_s`, so fast answers skip it)."""
        ...

    def stop_watching(self) -> None:
        """Stop watching for the client's disconnect."""
        ...


class DirectWriter(Protocol):
    """An exchange whose streamed answer can be written from the upstream connection's callback."""

    def direct_writer(self) -> Callable[[bytes], bool] | None:
        """A writer of one chunk of the started stream: True, written now; False, nothing written (`write`
        it, awaiting). None: this exchange has no such writer (its server has none)."""
        ...


class NativeDialect(Protocol):
    """The client's request in its own API, for engines that serve that API natively."""

    native_api: str  # "messages": Anthropic's Messages API
    native_body: dict[str, Any]  # the client's body, validated; never mutated (`limit_output` replaces it)

    def limit_output(self, max_tokens: int) -> None:
        """Hold the native body to `max_tokens` output tokens (what the key's reservation allows)."""
        ...

    def answer_natively(self, native: bool) -> None:
        """Called before `respond`/`start`: True when the answer is the engine's own, in this API's
        dialect (passed through), False when it is OpenAI's (to be translated)."""
        ...
