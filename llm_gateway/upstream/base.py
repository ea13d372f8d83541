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

#: how long a client keeps an idle connection to an engine for reuse: under the 5 s after which the
#: engines close one themselves (uvicorn's `timeout_keep_alive` default, under vLLM, SGLang, LMDeploy
#: and TabbyAPI; cpp-httplib's keep-alive timeout under llama-server, measured at 5.003 s; Ollama's Go
#: server keeps them). A connection the gateway kept longer than its engine would be reused just as the
#: engine closes it: the request goes out on a dying socket and comes back as "closed without answering"
#: (the prober, every 4.5-5.5 s by default, hit exactly that and took a healthy backend down).
POOL_IDLE_S = 4.0


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
