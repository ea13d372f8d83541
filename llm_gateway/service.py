"""The steps of one generation request (chat, completions, embeddings); each step lives elsewhere.

read the body (request_info) -> resolve the public model -> check the key may use it -> reserve rate limits -> count
the prompt where a window is ambiguous (prompt_count) -> dispatch to a deployment (selection, admission, retries,
failover) -> answer: the whole JSON body, or the stream relayed chunk by chunk -> settle the limits with the real
usage. Streams: the adapters always ask the engine for usage (the extra chunk is stripped unless the client asked);
if the engine never sent it (a cut stream, a client that left), the completion is estimated from what was relayed
(`RelayBase.completion_estimate`), so an aborted stream still pays for what was generated. Another API (Anthropic's
/v1/messages) is a translating `ClientExchange` around the same steps, and `count_prompt_tokens` counts a chat
prompt with an engine's own tokenizer where it has one. A request queues with its key's ticket (dispatch.Trace); a
stream that waits hears its place (queue_progress). With the client's own body beside it (`NativeDialect`), each
attempt asks its deployment's adapter whether the engine speaks that API itself: then the body passes through and
the exchange is told so (`answer_natively`); all else (limits, retries, failover, breaker, metrics, usage) is the
same path. The service answers through the `ClientExchange` it owns (exchange.py), never through ASGI; the first
generated output (for TTFT) is reported by the adapter's relay, which knows the engine's shapes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from llm_gateway.adapters.base import Adapter, StreamRelay
from llm_gateway.adapters.relay_base import usage_or_estimate
from llm_gateway.auth import Principal
from llm_gateway.backend_calls import COUNT_ATTEMPTS, ERROR_BODY_LIMIT, BackendPoster
from llm_gateway.dispatch import Trace, eligible, priority_rank, release, ticket_for
from llm_gateway.errors import DONE, GatewayError, ModelNotFound, UpstreamProtocolError
from llm_gateway.exchange import ClientExchange, Headers, NativeDialect
from llm_gateway.limits.limiter import quota_headers
from llm_gateway.observability.record import RequestRecord
from llm_gateway.prompt_count import PromptCounter, ambiguous_routes
from llm_gateway.queue_progress import QueueProgress
from llm_gateway.request_info import RequestInfo, read_request
from llm_gateway.routing.table import Deployment, ModelRoute
from llm_gateway.runtime import Gateway, Runtime
from llm_gateway.types import CallContext, Endpoint, Usage
from llm_gateway.upstream.base import UpstreamResponse

RESPONSE_LIMIT = 256 * 1024 * 1024
DISCONNECT_WATCH_DELAY_S = 0.25


@dataclass(slots=True)
class Job:
    """One generation request on its way through the steps."""

    call: ClientExchange
    rec: RequestRecord
    rt: Runtime
    endpoint: Endpoint
    body: dict[str, Any]
    route: ModelRoute
    info: RequestInfo
    quota: Headers  # x-ratelimit-* for every answer
    native: NativeDialect | None = None  # the client's own body, for engines that speak its API
    trace: Trace = field(default_factory=Trace)  # the dispatch so far; its ticket orders the queues
    early: QueueProgress | None = None  # a stream whose answer started while it waited in a queue

    def context(self, group: ModelRoute, dep: Deployment) -> CallContext:
        nat = self.native
        return CallContext(
            self.endpoint,
            group.name,
            dep.upstream_model,
            self.info.stream,
            self.info.wants_usage,
            self.call.rid,
            self.rt.config.server.reasoning_field,
            self.body.get("encoding_format") == "base64",
            nat.native_api if nat and dep.backend.adapter.speaks_natively(nat.native_api, nat.native_body) else None,
            self.trace.rank if dep.cfg.engine_priority else None,
        )

    def session(self) -> str | None:
        v = self.call.header(self.rt.session_header)
        return v.decode("latin-1")[:256] if v else None

    def answer_headers(self, dep: Deployment) -> Headers:
        """Transparency and quota headers, and the gateway's own time so far (everything but the waits)."""
        rec = self.rec
        rec.overhead_s = time.perf_counter() - rec.t0 - rec.upstream_s - rec.waited_s
        return [
            (b"x-request-id", self.call.rid.encode()),
            (b"x-gateway-backend", dep.backend.name.encode()),
            (b"x-gateway-engine", dep.backend.kind.encode()),
            (b"x-gateway-model", rec.model.encode()),
            *self.quota,
            (b"x-gateway-overhead-ms", f"{rec.overhead_s * 1000:.3f}".encode()),
        ]

    def traced(self, trace: Trace) -> None:
        rec = self.rec
        rec.attempts = trace.attempts
        rec.waited_s += trace.waited_s
        dep = trace.deployment
        if dep is not None:
            rec.backend, rec.engine, rec.upstream_model = dep.backend.name, dep.backend.kind, dep.upstream_model
            if trace.route is not None:
                rec.model = trace.route.name


class GenerationService:
    def __init__(self, gw: Gateway) -> None:
        self.gw, self.counter = gw, PromptCounter(gw.metrics)  # the counter: exact counts near a window

    async def handle(
        self,
        call: ClientExchange,
        rec: RequestRecord,
        rt: Runtime,
        endpoint: Endpoint,
        body: dict[str, Any],
        who: Principal,
        native: NativeDialect | None = None,
    ) -> None:
        info, route = self._route(call, rec, rt, endpoint, body, who)
        limits = rt.config.limits
        budget = info.prompt_tokens + (
            0 if endpoint == "embeddings" else (info.max_tokens or limits.default_max_tokens)
        )
        decision, reservation = await rt.limiter.admit(
            who, route.name, budget, call.rid, prompt_tokens=info.prompt_tokens
        )
        job = Job(call, rec, rt, endpoint, body, route, info, quota_headers(decision), native)
        job.trace.rank = priority_rank(who, call.header(rt.priority_header))
        job.trace.ticket = ticket_for(who, job.trace.rank, budget, rt.config.routing)
        usage: Usage | None = None
        failed = False
        try:
            if counted := ambiguous_routes(rt.table, route, info):  # near a window: the engine's count decides
                await self.counter.settle(self.gw.upstream, counted, body, info)
            usage = await (self._stream(job) if info.stream else self._unary(job))
        except GatewayError as e:
            failed = True  # answered with an error before any output: nothing was generated, unless the
            spent = getattr(e, "usage", None)  # engine says it did (an unfinished whole answer): that is paid
            if isinstance(spent, Usage):
                rec.prompt_tokens = spent.prompt_tokens or info.prompt_tokens
                rec.completion_tokens = spent.completion_tokens
            for k, v in job.quota:  # the quota headers go on every answer, errors included
                e.headers.setdefault(k.decode(), v.decode())
            raise
        finally:
            if usage is None and rec.completion_tokens is not None:
                usage = Usage(rec.prompt_tokens or info.prompt_tokens, rec.completion_tokens)
            # settle: the real usage; 0 for a request that failed before any output; the reserved
            # estimate when the engine's count is unknown (a client that left mid-generation pays for it)
            actual = usage.total_tokens if usage else (0 if failed else None)
            if job.trace.deployment is not None:  # the key's fair share counts what it really used
                job.trace.deployment.admission.settle(job.trace.ticket, actual)
            real_prompt = usage.prompt_tokens if usage else None  # prices a cost budget's input exactly
            settled = rt.limiter.finish(reservation, actual, prompt_tokens=real_prompt)
            # a cancelled client must not cut it short: in-process it cannot (never suspends), else shielded
            await (settled if rt.limiter.inline else asyncio.shield(settled))

    def _route(
        self,
        call: ClientExchange,
        rec: RequestRecord,
        rt: Runtime,
        endpoint: Endpoint,
        body: dict[str, Any],
        who: Principal,
    ) -> tuple[RequestInfo, ModelRoute]:
        """Read the body, resolve the public model and check that the key may use it."""
        info = read_request(endpoint, body)
        fmt = call.header(rt.format_header)
        if fmt:
            info.format = fmt.decode("latin-1").strip().lower()[:32]
        rec.stream = info.stream
        route = rt.table.resolve(info.model)
        if route is None:  # the name is not echoed: a client that pastes a key there must not see it mirrored
            raise ModelNotFound(
                "The requested model does not exist; GET /v1/models lists the models this key may use.", param="model"
            )
        rec.model = route.name
        if not (who.may_use(route.name) or who.may_use(info.model)):
            rt.auth.check_model(who, route.name)
        return info, route

    async def count_prompt_tokens(
        self,
        call: ClientExchange,
        rec: RequestRecord,
        rt: Runtime,
        body: dict[str, Any],
        who: Principal,
        native_body: dict[str, Any] | None = None,
    ) -> tuple[int, str]:
        """The prompt tokens of a chat body (or of `native_body`, the client's own, where the engine serves its
        count): (count, "engine") from the first routable deployment whose engine counts them, else (the
        gateway's estimate, "estimate"); at most `COUNT_ATTEMPTS` engines asked. Not charged: nothing is generated."""
        info, route = self._route(call, rec, rt, "chat", body, who)
        now = time.monotonic()
        t = time.perf_counter()
        failures = 0
        try:
            for dep in eligible(route, info):
                b = dep.backend
                if failures >= COUNT_ATTEMPTS:
                    break
                if not (b.routable() and dep.breaker.available(now) and dep.model_present()):
                    continue
                a, poster, up = b.adapter, BackendPoster(self.gw.upstream, b), dep.upstream_model
                try:
                    if native_body is not None and a.speaks_natively("count_tokens", native_body):
                        n = await a.count_native_tokens(poster, native_body, body, up)
                    else:
                        n = await a.count_prompt_tokens(poster, body, up)
                except GatewayError:
                    failures += 1  # the count is a courtesy: a failing engine falls back to the estimate
                    continue
                if n is not None:
                    rec.backend, rec.engine, rec.upstream_model = b.name, b.kind, dep.upstream_model
                    return n, "engine"
        finally:
            rec.upstream_s += time.perf_counter() - t
        return info.prompt_tokens, "estimate"

    async def _send_upstream(self, job: Job, dep: Deployment, ctx: CallContext) -> UpstreamResponse:
        adapter, rec, api = dep.backend.adapter, job.rec, ctx.native_api
        if api is not None and job.native is not None:
            req = adapter.build_native(api, job.native.native_body, ctx)
        else:
            req = adapter.build(job.endpoint, job.body, ctx)
        t = time.perf_counter()
        try:
            resp = await self.gw.upstream.send(
                req.method, dep.backend.cfg.url + req.path, req.headers, req.body, dep.backend.timeouts
            )
        finally:
            rec.upstream_s += time.perf_counter() - t
        status = resp.status
        if status < 300:
            return resp
        t = time.perf_counter()
        try:
            data = await resp.read(ERROR_BODY_LIMIT)
        finally:
            resp.close()
            rec.upstream_s += time.perf_counter() - t
        if status < 400:
            name = dep.backend.name
            raise UpstreamProtocolError(
                f"backend '{name}' answered with a redirect ({status}); the gateway does not follow them", backend=name
            )
        if api is not None and adapter.native_unserved(api, status, data):
            adapter.unserved.add(api)  # an engine version without the route: translated from now on,
            ctx.native_api = None  # this call included
            return await self._send_upstream(job, dep, ctx)
        raise adapter.error(status, data, resp.headers.get("content-type", ""))

    # -- whole answers ---------------------------------------------------------------------------------
    async def _unary(self, job: Job) -> Usage | None:
        trace = job.trace
        rec = job.rec

        async def exchange(dep: Deployment, group: ModelRoute) -> tuple[bytes, Usage | None, str | None]:
            ctx = job.context(group, dep)
            resp = await self._send_upstream(job, dep, ctx)
            t = time.perf_counter()
            try:
                data = await resp.read(RESPONSE_LIMIT)
            finally:
                resp.close()
                rec.upstream_s += time.perf_counter() - t
            a, api = dep.backend.adapter, ctx.native_api
            return *(a.native_response_body(api, data, ctx) if api else a.response_body(data, ctx)), api

        job.call.watch_disconnect(DISCONNECT_WATCH_DELAY_S)
        rt = job.rt
        try:
            out, usage, api = await rt.dispatcher.run(rt.table, job.route, job.info, job.session(), exchange, trace)
        finally:
            job.call.stop_watching()
            job.traced(trace)
        dep = trace.deployment
        assert dep is not None
        release(dep)
        dep.breaker.success()
        if usage is not None:
            rec.prompt_tokens, rec.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        if job.native is not None:
            job.native.answer_natively(api is not None)
        await job.call.respond(200, out, job.answer_headers(dep))
        return usage

    # -- streams -----------------------------------------------------------------------------------------
    async def _stream(self, job: Job) -> Usage | None:
        trace = job.trace

        async def exchange(dep: Deployment, group: ModelRoute) -> tuple[UpstreamResponse, CallContext]:
            ctx = job.context(group, dep)
            resp = await self._send_upstream(job, dep, ctx)
            ct = resp.headers.get("content-type", "")
            if not ct.startswith(dep.backend.adapter.stream_content_types()):
                resp.close()
                raise UpstreamProtocolError(
                    f"backend '{dep.backend.name}' answered a stream request with content type '{ct[:60]}'",
                    backend=dep.backend.name,
                )
            return resp, ctx

        job.call.watch_disconnect()
        progress = None
        if job.native is None and job.rt.config.routing.queue_progress_s > 0:  # a native dialect chooses later
            progress = trace.progress = QueueProgress(job.call, [(b"x-request-id", job.call.rid.encode()), *job.quota])
            trace.progress_s = job.rt.config.routing.queue_progress_s
        job.early = progress
        try:
            try:
                resp, ctx = await job.rt.dispatcher.run(
                    job.rt.table, job.route, job.info, job.session(), exchange, trace
                )
            except GatewayError as e:
                if progress is not None and progress.started:
                    await progress.fail(e)  # the 200 went out while it waited: the error ends the stream
                raise
            finally:
                job.traced(trace)
            dep = trace.deployment
            assert dep is not None
            try:
                return await self._relay(job, dep, resp, ctx)
            except asyncio.CancelledError:
                dep.breaker.neutral()  # the client left: says nothing about the backend
                raise
            finally:
                resp.close()  # mid-body this drops the connection: the engine stops generating
                release(dep)
        finally:
            job.call.stop_watching()

    async def _relay(self, job: Job, dep: Deployment, resp: UpstreamResponse, ctx: CallContext) -> Usage | None:
        call, rec = job.call, job.rec
        relay, cut = _relay_for(dep.backend.adapter, ctx)
        if job.native is not None:
            job.native.answer_natively(ctx.native_api is not None)
        headers = job.answer_headers(dep)
        headers += [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        if job.early is None or not job.early.started:
            await call.start(200, headers)
        itl = self.gw.metrics.child(self.gw.metrics.itl, dep.model, dep.backend.name)
        first = True
        last = time.perf_counter()
        write = call.write
        feed = relay.feed
        err: GatewayError | None = None
        read = resp.read_chunk
        try:
            while chunk := await read():
                out = feed(chunk)
                if out:
                    now = time.perf_counter()
                    if first:
                        if relay.output_started:  # not a role-only or empty chunk: the first generated output
                            first = False
                            rec.ttft_s = now - rec.t0
                            self.gw.metrics.child(self.gw.metrics.ttft, dep.model, dep.backend.name).observe(rec.ttft_s)
                    else:
                        itl.observe(now - last)
                    last = now
                    await write(out)
                if relay.error is not None:
                    break
            else:
                if tail := relay.finish():
                    await call.write(tail)
        except GatewayError as e:  # the engine failed mid-body: cut, idle timeout, reset
            err = e
            if relay.error is None:
                await call.write(cut(e))
        finally:
            rec.prompt_tokens, rec.completion_tokens, rec.usage_estimated = usage_or_estimate(
                relay, job.info.prompt_tokens
            )
        err = err or relay.error
        if err is None or err.status < 500:
            dep.breaker.success()
        else:
            dep.breaker.failure(time.monotonic())
        if err is not None:
            rec.outcome, rec.error = "stream_error", err.code
        call.stop_watching()
        await call.end()
        return relay.usage


def _relay_for(adapter: Adapter, ctx: CallContext) -> tuple[StreamRelay, Callable[[GatewayError], bytes]]:
    """The call's relay, and how a failure after the first byte reaches the client in its dialect."""
    if ctx.native_api is not None:
        relay = adapter.native_relay(ctx.native_api, ctx)
        return relay, relay.fail
    return adapter.relay(ctx), lambda e: e.sse_event() + DONE
