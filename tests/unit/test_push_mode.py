"""The stream relay's push mode is chosen by the declared capabilities (service/stream.py): where the engine's
response pushes (`PushResponse`: the gateway's own client) and the client's exchange has a direct writer
(`DirectWriter`: the gateway's own server), each chunk is fed and written from the upstream connection's
callback; where either lacks it, the relay reads chunk by chunk. The answer is the same either way, so only
what was called tells them apart: a capability that stopped being recognised would slow every stream down
without failing any other test."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.observability.metrics import Metrics
from llm_gateway.service.stream import relay_stream
from llm_gateway.types import BackendInfo, CallContext

EVENTS = [
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"up",'
    b'"choices":[{"index":0,"delta":{"content":"%d"},"finish_reason":null}]}\n\n' % i
    for i in range(3)
] + [b"data: [DONE]\n\n"]


class PullResponse:
    """An engine's streamed answer read chunk by chunk (the UpstreamResponse seam alone)."""

    status = 200
    headers: dict[str, str] = {}

    def __init__(self) -> None:
        self.chunks = list(EVENTS)
        self.calls: list[str] = []

    async def read_chunk(self) -> bytes:
        self.calls.append("read_chunk")
        return self.chunks.pop(0) if self.chunks else b""

    async def read(self, limit: int) -> bytes:
        raise AssertionError("a stream is not read whole")

    def close(self) -> None:
        pass


class PushingResponse(PullResponse):
    """... that also pushes (PushResponse): every chunk to the sink at once, inside `pipe`."""

    def buffered(self) -> bool:
        return False

    def pipe(self, sink: Callable[[bytes], bool]) -> asyncio.Future[None] | None:
        self.calls.append("pipe")
        if not self.chunks:
            return None
        while self.chunks and sink(self.chunks.pop(0)):
            pass
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Exchange:
    """The client's side: records what it was asked to write, and how."""

    rid = "r1"
    status = 0

    def __init__(self) -> None:
        self.written: list[tuple[str, bytes]] = []

    def header(self, name: bytes) -> bytes | None:
        return None

    async def start(self, status: int, headers: Any, *, hold: bool = False) -> None:
        self.status = status

    async def write(self, data: bytes) -> None:
        self.written.append(("write", data))

    async def end(self, data: bytes = b"") -> None:
        self.written.append(("end", data))

    def stop_watching(self) -> None:
        pass


class DirectExchange(Exchange):
    """... with a direct writer (DirectWriter), as the gateway's own server gives one."""

    def direct_writer(self) -> Callable[[bytes], bool] | None:
        def now(data: bytes) -> bool:
            self.written.append(("direct", data))
            return True

        return now


def _job(call: Exchange) -> Any:
    rec = SimpleNamespace(t0=0.0, ttft_s=None, live=None, outcome="ok", error=None, trace=None)
    info = SimpleNamespace(prompt_tokens=3, choices=1)
    return SimpleNamespace(
        call=call, rec=rec, info=info, native=None, progress=None, output_cap=None, answered=lambda attempt: []
    )


async def _relay(resp: PullResponse, call: Exchange) -> None:
    adapter = VLLMAdapter(BackendInfo("b", "http://b.test"))
    breaker = SimpleNamespace(success=lambda: None, failure=lambda now: None)
    dep = SimpleNamespace(backend=SimpleNamespace(adapter=adapter, name="b"), model="m", breaker=breaker)
    ctx = CallContext("chat", "m", "up", True, False, call.rid)
    attempt = SimpleNamespace(deployment=dep, ended=lambda err: None)
    await relay_stream(Metrics(), _job(call), attempt, resp, ctx)  # type: ignore[arg-type]


async def test_both_capabilities_push_each_chunk_through_the_direct_writer() -> None:
    resp, call = PushingResponse(), DirectExchange()
    await _relay(resp, call)
    assert resp.calls[0] == "pipe" and "read_chunk" not in resp.calls[:1]
    assert [how for how, _ in call.written] == ["direct"] * 3 + ["end"]  # [DONE] leaves with the end


@pytest.mark.parametrize(
    ("resp", "call"),
    [(PullResponse, DirectExchange), (PushingResponse, Exchange), (PullResponse, Exchange)],
    ids=["response-pulls", "exchange-without-writer", "neither"],
)
async def test_without_either_capability_the_relay_reads_chunk_by_chunk(
    resp: type[PullResponse], call: type[Exchange]
) -> None:
    r, c = resp(), call()
    await _relay(r, c)
    assert "pipe" not in r.calls and r.calls[0] == "read_chunk"
    assert [how for how, _ in c.written] == ["write"] * 3 + ["end"]
    assert b"".join(data for _, data in c.written).count(b"data: ") == 4
