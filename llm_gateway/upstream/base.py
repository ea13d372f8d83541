"""The seam between the gateway and the HTTP client that talks to engines.

One small protocol, in the spirit of httpx's transport: `send()` opens an exchange and returns once
the engine's status line and headers are in; the body is then read whole or chunk by chunk, and
`close()` releases (or, mid-body, drops) the connection. Implementations translate their own
exceptions into `BackendFailure`s where they enter (`ConnectFailed` when no connection could be made,
`UpstreamUnreachable`, `UpstreamTimeout`, `UpstreamProtocolError`, `StreamInterrupted`), so nothing
above this layer knows which client is in use.

One optional capability is declared beside it: a `PushResponse` (the gateway's own client's) can also hand
each chunk to a callback as it arrives (`pipe`), and say whether a chunk is in hand already (`buffered`);
the stream relay checks for it once per response type (service/stream.py), never by name.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from llm_gateway.wire.client_body import Body

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

    def close(self) -> None:
        """Release the connection; if the body was not read to the end, drop it."""
        ...


class PushResponse(UpstreamResponse, Protocol):
    """An upstream response that can push its chunks: the stream relay's push mode (service/stream.py)."""

    def buffered(self) -> bool:
        """Is a chunk in hand (`read_chunk` answers without waiting)?"""
        ...

    def pipe(self, sink: Callable[[bytes], bool]) -> asyncio.Future[None] | None:
        """From now on each chunk goes to `sink(chunk)` as it arrives, inside the connection's callback;
        `sink` returns False to stop. The future is done when piping stopped, the body ended or failed
        (`read_chunk` then says which). None: something is to be read first (`read_chunk` it)."""
        ...


class UpstreamClient(Protocol):
    async def send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: Body | None,
        timeouts: UpstreamTimeouts,
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...
