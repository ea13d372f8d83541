"""Relaying one engine stream to the client: the relay loop of a streamed generation.

The service (pipeline.py) gets a stream onto an `Attempt`; this loop answers with it: the head (the
transparency and quota headers), then each engine chunk through the adapter's relay (which owns the
engine's shapes) straight to the client, the first generated output timed as TTFT and the gaps after
it batched into the inter-token histogram, a failure after the first byte ended in the client's
dialect, the attempt told how the stream ended, and the usage (the engine's, or estimated from what was
relayed) recorded for billing. A client of another API (Anthropic's Messages, the Responses API) gets the
stream translated by the relay itself (its exchange's `translation()`, wire/chat_events.py): what the
relay returns is the client's bytes, written as they are. It is the hottest loop of the gateway: per event
one read, one feed, one write (bench/: CPU per relayed event). The head leaves with the engine's first
chunk when that came with the engine's headers, and the stream's last part with its end: one send each,
not two. Once the engine's `[DONE]` is relayed the client's answer is ended at once; the rest of the
engine's body (its chunked terminator) is read after, to keep the connection for the next request.

Where the key's limits count tokens, the stream is held to its reservation (`Job.output_cap`: the engine
was asked for no more): should the engine send more content events than that, the relay ends it there
as an engine ends one at `max_tokens` (`StreamRelay.cut`: finish reason `length`) and the engine's
connection is dropped, not drained, so that it stops generating. A stream without a cap pays nothing
for the check: its loop and sink are the plain ones.
"""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import Callable

from llm_gateway.adapters.base import Adapter, StreamRelay
from llm_gateway.adapters.relay_base import usage_or_estimate
from llm_gateway.errors import GatewayError
from llm_gateway.exchange import DirectWriter
from llm_gateway.observability.metrics import Metrics, observe, observe_many
from llm_gateway.routing.attempt import Attempt
from llm_gateway.service.request import Job
from llm_gateway.types import CallContext, Capability, Usage
from llm_gateway.upstream.base import PushResponse, UpstreamResponse
from llm_gateway.wire.chat_events import Translating

#: push mode's two capabilities, on the engine's response and on the client's exchange (checked once per type)
_PUSHES: Capability[PushResponse] = Capability(PushResponse)
_WRITES_DIRECTLY: Capability[DirectWriter] = Capability(DirectWriter)
#: a client of another API, whose stream the relay translates (checked once per exchange type)
_TRANSLATES: Capability[Translating] = Capability(Translating)


async def relay_stream(
    metrics: Metrics, job: Job, attempt: Attempt, resp: UpstreamResponse, ctx: CallContext
) -> Usage | None:
    """Answer with the engine's stream `resp`, relayed event by event in the client's dialect, and tell the
    attempt how it ended (its slot is the caller's to release); returns the usage."""
    call, rec, dep = job.call, job.rec, attempt.deployment
    if job.native is not None:
        job.native.answer_natively(ctx.native_api is not None)
    relay, cut = _relay_for(dep.backend.adapter, ctx, call)
    prompt_estimate = job.info.prompt_tokens
    rec.live = lambda: (prompt_estimate, relay.completion_estimate())  # read by the ledger's crash checkpoint
    headers = job.answered(attempt)
    headers += [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ]
    itl = metrics.child(metrics.itl, dep.model, dep.backend.name)
    #: the times of the relayed writes from the first generated output on (after a batch, from the batch's last):
    #: their gaps are the inter-token latencies, observed 64 at a time (`observe_many`); a time appended per event
    #: costs fewer bytecodes than a gap computed and the time kept for the next one
    stamps: list[float] = []
    first = True
    write = call.write
    feed: Callable[[bytes], bytes] = relay.feed
    trace = rec.trace
    if trace is not None and trace.sampled:  # the finish reasons of what is relayed, for the request's span
        feed = trace.watch(feed)
    err: GatewayError | None = None
    read = resp.read_chunk

    def timed(out: bytes) -> None:
        """The first generated output's time (TTFT), then the times of the relayed writes after it."""
        nonlocal first
        now = time.perf_counter()
        if first:
            if relay.output_started:  # not a role-only or empty chunk: the first generated output
                first = False
                rec.ttft_s = now - rec.t0
                observe(metrics.child(metrics.ttft, dep.model, dep.backend.name), rec.ttft_s)
                stamps.append(now)
        else:
            stamps.append(now)
            if len(stamps) > 64:
                observe_gaps()

    def observe_gaps() -> None:
        """The gaps between the kept times into the histogram; the last time stays, for the next gap."""
        if len(stamps) > 1:
            observe_many(itl, list(map(operator.sub, stamps[1:], stamps)))
            del stamps[:-1]

    # push mode where the upstream response and the client's exchange both can (the gateway's own client,
    # a plain OpenAI stream): each chunk is fed and written inside the upstream connection's callback;
    # what cannot be written at once (the client's socket is full) is kept and written here, waiting
    pushes = _PUSHES.of(resp)
    direct = _WRITES_DIRECTLY.of(call)
    try_write = direct.direct_writer() if direct is not None else None
    pipe: Callable[[Callable[[bytes], bool]], asyncio.Future[None] | None] | None = None
    if pushes is not None and try_write is not None:
        pipe = pushes.pipe
    #: what is still to be written: the last part of the stream (written with the end: one send) or what
    #: the client's socket could not take at once
    kept: list[bytes] = []
    perf_counter = time.perf_counter
    cap = job.output_cap
    over = False  # ended at the cap: the engine's connection is dropped, not drained

    def sink(chunk: bytes) -> bool:
        """One engine chunk, inside the upstream connection's callback: fed, timed (`timed` inline: this
        runs once per event) and written."""
        out = feed(chunk)
        if out:
            if first:
                timed(out)
            else:
                stamps.append(perf_counter())
                if len(stamps) > 64:
                    observe_gaps()
            if relay.done or relay.error is not None or not try_write(out):  # type: ignore[misc]
                kept.append(out)
                return False
            return True  # written, and no error (the writer cannot set one)
        return relay.error is None

    def capped(chunk: bytes) -> bool:
        """`sink`, then the end of the stream where it passed the cap."""
        nonlocal over
        ok = sink(chunk)
        if relay.content_events > cap and not relay.done and relay.error is None:  # type: ignore[operator]
            kept.append(relay.cut(job.info.choices, job.info.prompt_tokens))
            over = True
            return False
        return ok

    sink_of_call = capped if cap is not None else sink

    try:
        if job.progress is None or not job.progress.started:
            # the engine's first chunk is often in hand with its headers: the head leaves with it, one send
            out = feed(await read()) if pushes is not None and pushes.buffered() else b""
            if out:
                timed(out)
            await call.start(200, headers, hold=bool(out))
            if out:
                if relay.done or relay.error is not None:
                    kept.append(out)
                else:
                    await write(out)
        while not (relay.done or relay.error is not None):
            piped = pipe(sink_of_call) if pipe is not None else None
            if piped is not None:
                await piped
                if relay.done or relay.error is not None:
                    break
                for out in kept:
                    await write(out)
                kept.clear()
                continue
            chunk = await read()
            if not chunk:
                if tail := relay.finish():
                    kept.append(tail)
                break
            out = feed(chunk)
            if out:
                timed(out)
                if relay.done or relay.error is not None:
                    kept.append(out)
                else:
                    await write(out)
            if cap is not None and relay.content_events > cap and not relay.done and relay.error is None:
                kept.append(relay.cut(job.info.choices, job.info.prompt_tokens))
                over = True
    except GatewayError as e:  # the engine failed mid-body: cut, idle timeout, reset
        err = e
        if relay.error is None:
            kept.append(cut(e))
    finally:
        observe_gaps()
        rec.prompt_tokens, rec.completion_tokens, rec.usage_estimated = usage_or_estimate(relay, job.info.prompt_tokens)
    err = err or relay.error
    attempt.ended(err)
    if err is not None:
        rec.outcome, rec.error = "stream_error", err.code
    call.stop_watching()
    last = kept[0] if len(kept) == 1 else b"".join(kept)
    if trace is not None and trace.sampled and last:  # a cut at the cap or after a failure: its finish reason
        trace.finished(last)
    await call.end(last)
    if relay.done and err is None and not over:  # the client has its answer; the rest of the body frees the connection
        try:
            while await read():
                pass
        except GatewayError:
            pass
    return relay.usage


def _relay_for(adapter: Adapter, ctx: CallContext, call: object) -> tuple[StreamRelay, Callable[[GatewayError], bytes]]:
    """The call's relay, and how a failure after the first byte reaches the client in its dialect: the
    engine's own API's relay, or OpenAI's, translated for a client of another API (`Translating`)."""
    if ctx.native_api is not None:
        native = adapter.native_relay(ctx.native_api, ctx)
        return native, native.fail
    relay = adapter.relay(ctx)
    translating = _TRANSLATES.of(call)
    if translating is not None and (tr := translating.translation()) is not None:
        relay.translate(tr)
    return relay, relay.fail
