"""The seam between the gateway and the HTTP client that talks to engines.

One small protocol, in the spirit of httpx's transport: `send()` opens an exchange and returns once
the engine's status line and headers are in; the body is then read whole or chunk by chunk, and
`close()` releases (or, mid-body, drops) the connection. Implementations translate their own
exceptions into `BackendFailure`s where they enter (`ConnectFailed` when no connection could be made,
`UpstreamUnreachable`, `UpstreamTimeout`, `UpstreamProtocolError`, `StreamInterrupted`), so nothing
above this layer knows which client is in use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class UpstreamTimeouts:
    connect_s: float
    first_byte_s: float
    idle_s: float
    total_s: float


class UpstreamResponse(Protocol):
    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    async def read(self, limit: int) -> bytes:
        """The whole body; UpstreamProtocolError beyond `limit` bytes."""
        ...

    async def read_chunk(self) -> bytes:
        """The next body bytes as they arrive, b"" at the end (idle timeout between chunks applies)."""
        ...

    def iter_chunks(self) -> AsyncIterator[bytes]:
        """The same, as an async iterator."""
        ...

    def close(self) -> None:
        """Release the connection; if the body was not read to the end, drop it."""
        ...


class UpstreamClient(Protocol):
    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        timeouts: UpstreamTimeouts,
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...
