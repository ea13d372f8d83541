"""The steps of one generation request (chat, completions, embeddings); each step lives elsewhere.

read the body (request_info) -> resolve the public model -> check the key may use it -> reserve rate limits -> count
the prompt where a window is ambiguous (prompt_count) -> dispatch to a deployment (selection, admission, retries,
failover) -> answer: the whole JSON body, or the stream relayed chunk by chunk -> settle the limits with the real
usage. Streams: the adapters always ask the engine for usage (the extra chunk is stripped unless the client asked);
if the engine never sent it (a cut stream, a client that left), the completion is estimated from what was relayed
(`RelayBase.completion_estimate`), so an aborted stream still pays for what was generated. Another API (Anthropic's
/v1/messages) is a translating `ClientExchange` around the same steps, and `count_prompt_tokens` counts a chat
prompt with an engine's own tokenizer where it has one. Dispatch takes the request (its key and asked class make
its queue ticket) and hands each try to the exchange as an `Attempt`, which owns the slot and the breaker's report;
a stream that waits hears its place (queue_progress). With the client's own body beside it (`NativeDialect`), each
attempt asks its deployment's adapter whether the engine speaks that API itself: then the body passes through and
the exchange is told so (`answer_natively`); all else (limits, retries, failover, breaker, metrics, usage) is the
same path. The service answers through the `ClientExchange` it owns (exchange.py), never through ASGI; the first
generated output (for TTFT) is reported by the adapter's relay, which knows the engine's shapes. The request's state
is a `Job` (request.py); a stream's relay loop is stream.py.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from llm_gateway.access.keys import Principal
from llm_gateway.adapters.relay_base import ChargedError
from llm_gateway.errors import GatewayError, ModelNotFound, UpstreamProtocolError
from llm_gateway.exchange import ClientExchange, NativeDialect
from llm_gateway.observability.record import RequestRecord
from llm_gateway.routing.attempt import Attempt
from llm_gateway.routing.backend_calls import COUNT_ATTEMPTS, ERROR_BODY_LIMIT, BackendPoster
from llm_gateway.routing.candidates import eligible
from llm_gateway.routing.gathered import Gathered
from llm_gateway.routing.prompt_count import PromptCounter, ambiguous_routes
from llm_gateway.routing.request_info import RequestInfo, cap_output, read_request
from llm_gateway.routing.table import Deployment, ModelRoute
from llm_gateway.service.queue_progress import QueueProgress
from llm_gateway.service.request import Job
from llm_gateway.service.runtime import Gateway, Runtime
from llm_gateway.service.stream import relay_stream
from llm_gateway.types import CallContext, Endpoint, Usage
from llm_gateway.upstream.base import UpstreamResponse

RESPONSE_LIMIT = 256 * 1024 * 1024
DISCONNECT_WATCH_DELAY_S = 0.25


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
        gathered: Gathered | None = None,
    ) -> None:
        """`gathered`: what a translation that built `body` gathered of its messages (request_info.Gathered)."""
        info, route = self._route(call, rec, rt, endpoint, body, who, gathered)
        generates = endpoint != "embeddings"
        prompt, choices = info.prompt_tokens, info.choices
        asked = info.max_tokens if info.max_tokens is not None else rt.config.limits.default_max_tokens
        budget = prompt + (asked * choices if generates else 0)  # n choices of up to max_tokens each
        decision, reservation = await rt.limiter.admit(
            who, route.name, budget, call.rid, prompt_tokens=prompt, choices=choices, flexible=generates
        )
        rec.metered = True  # counted against the key's limits: a refusal from here on is not metered again
        output_cap = None
        if generates and reservation is not None and rt.limiter.counts_tokens(reservation.scopes):
            # the reservation is what the request may spend (a budget may have granted less than asked): the
            # engine is held to it, per choice, in the field its adapter reads; the body is touched only then
            budget = reservation.tokens
            cap = (budget - prompt) // choices
            if info.max_tokens is None or cap < info.max_tokens:
                cap_output(endpoint, body, cap)
                info.max_tokens = cap
                if native is not None:
                    native.limit_output(cap)
            output_cap = cap * choices
        quota, priority = rt.limiter.quota_headers(decision), call.header(rt.priority_header)
        job = Job(call, rec, rt, endpoint, body, route, info, quota, who, budget, priority, native, output_cap)
        usage: Usage | None = None
        failed = False
        try:
            if counted := ambiguous_routes(rt.table, route, info):  # near a window: the engine's count decides
                await self.counter.settle(self.gw.upstream, counted, body, info)
            usage = await (self._stream(job) if info.stream else self._unary(job))
        except GatewayError as e:
            failed = True  # answered with an error before any output: nothing was generated, unless the
            if isinstance(e, ChargedError):  # engine says it did (an unfinished whole answer): that is paid
                rec.prompt_tokens = e.usage.prompt_tokens or info.prompt_tokens
                rec.completion_tokens = e.usage.completion_tokens
            for k, v in job.quota:  # the quota headers go on every answer, errors included
                e.headers.setdefault(k.decode(), v.decode())
            raise
        finally:
            if usage is None and rec.completion_tokens is not None:
                usage = Usage(rec.prompt_tokens or info.prompt_tokens, rec.completion_tokens)
            # settle: the real usage; 0 for a request that failed before any output; the reserved
            # estimate when the engine's count is unknown (a client that left mid-generation pays for it)
            actual = usage.total_tokens if usage else (0 if failed else None)
            if job.attempt is not None:  # the key's fair share counts what it really used
                job.attempt.settle(actual)
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
        gathered: Gathered | None = None,
    ) -> tuple[RequestInfo, ModelRoute]:
        """Read the body, resolve the public model and check that the key may use it."""
        info = read_request(endpoint, body, gathered)
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
        rt.auth.check_model(who, route.name, route.cfg.aliases)  # the canonical model, never the alias asked
        return info, route

    async def count_prompt_tokens(
        self,
        call: ClientExchange,
        rec: RequestRecord,
        rt: Runtime,
        body: dict[str, Any],
        who: Principal,
        native_body: dict[str, Any] | None = None,
        gathered: Gathered | None = None,
    ) -> tuple[int, str]:
        """The prompt tokens of a chat body (or of `native_body`, the client's own, where the engine serves its
        count): (count, "engine") from the first routable deployment whose engine counts them, else (the
        gateway's estimate, "estimate"); at most `COUNT_ATTEMPTS` engines asked. Nothing is generated, so no
        tokens or budget are charged; but it asks an engine, so it is one request against the key's requests
        per minute, and holds a concurrency lease while it runs (`Limiter.admit_requests`)."""
        info, route = self._route(call, rec, rt, "chat", body, who, gathered)
        _, reservation = await rt.limiter.admit_requests(who, route.name, call.rid)
        rec.metered = True
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
            settled = rt.limiter.finish(reservation, 0)  # the lease back (no tokens were reserved)
            await (settled if rt.limiter.inline else asyncio.shield(settled))
        return info.prompt_tokens, "estimate"

    async def _send_upstream(self, job: Job, dep: Deployment, ctx: CallContext) -> UpstreamResponse:
        adapter, rec, api = dep.backend.adapter, job.rec, ctx.native_api
        if api is not None and job.native is not None:
            req = adapter.build_native(api, job.native.native_body, ctx)
        else:
            req = adapter.build(job.endpoint, job.body, ctx)
        if ctx.stream and adapter.closes_after_stream:
            req.headers["Connection"] = "close"  # the engine closes it after the stream: never pooled
        if rec.trace is not None and job.attempt is not None and job.attempt.trace is not None:
            job.attempt.trace.inject(req.headers)  # the attempt's span as the engine's parent (W3C traceparent)
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
        rec = job.rec

        async def exchange(attempt: Attempt) -> tuple[bytes, Usage | None, str | None, list[str] | None]:
            ctx = job.context(attempt)
            resp = await self._send_upstream(job, attempt.deployment, ctx)
            t = time.perf_counter()
            try:
                data = await resp.read(RESPONSE_LIMIT)
            finally:
                resp.close()
                rec.upstream_s += time.perf_counter() - t
            a, api = attempt.deployment.backend.adapter, ctx.native_api
            out, usage = a.native_response_body(api, data, ctx) if api else a.response_body(data, ctx)
            return out, usage, api, ctx.finish_reasons  # the reasons as the adapter read them, where it did

        job.call.watch_disconnect(DISCONNECT_WATCH_DELAY_S)
        rt = job.rt
        try:
            attempt, (out, usage, api, reasons) = await rt.dispatcher.run(rt.table, job, exchange)
        finally:
            job.call.stop_watching()
        attempt.ok()
        attempt.release()  # the engine's part is done: the client's write does not hold the slot
        if usage is not None:
            rec.prompt_tokens, rec.completion_tokens = usage.prompt_tokens, usage.completion_tokens
        if job.native is not None:
            job.native.answer_natively(api is not None)
        await job.call.respond(200, out, job.answered(attempt))
        if rec.trace is not None:
            rec.trace.answered(out, reasons)  # finish reasons (and the text, where content is captured)
        return usage

    # -- streams -----------------------------------------------------------------------------------------
    async def _stream(self, job: Job) -> Usage | None:
        async def exchange(attempt: Attempt) -> tuple[UpstreamResponse, CallContext]:
            dep = attempt.deployment
            ctx = job.context(attempt)
            resp = await self._send_upstream(job, dep, ctx)
            ct = resp.headers.get("content-type", "")
            if not ct.startswith(dep.backend.adapter.stream_content_types()):
                resp.close()
                raise UpstreamProtocolError(
                    f"backend '{dep.backend.name}' answered a stream request with content type '{ct[:60]}'",
                    backend=dep.backend.name,
                )
            return resp, ctx

        call, rt = job.call, job.rt
        call.watch_disconnect()
        if job.native is None and rt.config.routing.queue_progress_s > 0:  # a native dialect chooses later
            job.progress = QueueProgress(call, [(b"x-request-id", call.rid.encode()), *job.quota])
            job.progress_s = rt.config.routing.queue_progress_s
        try:
            try:
                attempt, (resp, ctx) = await rt.dispatcher.run(rt.table, job, exchange)
            except GatewayError as e:
                if job.progress is not None and job.progress.started:
                    await job.progress.fail(e)  # the 200 went out while it waited: the error ends the stream
                raise
            try:
                return await relay_stream(self.gw.metrics, job, attempt, resp, ctx)
            finally:
                resp.close()  # mid-body this drops the connection: the engine stops generating
                attempt.release()  # once, after the relay told the breaker; unreported (the client left): neutral
        finally:
            call.stop_watching()
