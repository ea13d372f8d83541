"""The engine seam: routing, request bookkeeping and the shared generation driver.

Every engine module subclasses ``Engine`` and supplies its routes, its auth/loading
middleware order, its error envelopes, a ``StreamFormat`` per streamed request and a body
builder per non-streamed one. ``Engine.generate`` runs the part that is the same for all:
take a fault, wait for a slot, sleep TTFT, emit one token per chunk every TPOT, apply
in-flight faults after K chunks, count tokens and latencies, release the slot.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from llm_gateway_emulators import wire
from llm_gateway_emulators.faults import take_fault
from llm_gateway_emulators.httpserver import Request
from llm_gateway_emulators.jobs import EngineHost, InferenceJob, Reply, Result, StreamFormat
from llm_gateway_emulators.scheduler import QueueFull, SlotInfo
from llm_gateway_emulators.textgen import Generation, expected_text, run_all, token_text

if TYPE_CHECKING:
    pass

Handler = Callable[[Request], Awaitable[None]]


def _forever() -> Awaitable[None]:
    return asyncio.get_running_loop().create_future()


class Engine:
    name = ""
    #: llama.cpp and Ollama send the status line only once the first token exists.
    headers_after_first_token = False
    #: vLLM: the port does not accept connections until the model is loaded.
    listen_after_load = False
    default_keepalive_s: float | None = 5.0
    #: the finish reason this engine ends an aborted generation with, for the ``engine_abort`` fault
    #: (SGLang, LMDeploy, vLLM: "abort"); None: the engine has none, and the fault does nothing
    abort_reason: str | None = None

    def __init__(self, rt: EngineHost) -> None:
        self.rt = rt
        self.cfg = rt.config
        self.stats = rt.stats
        self.pool = rt.pool
        self.dates = wire.DateCache()
        self._routes: dict[str, dict[str, tuple[Handler, bool]]] = {}
        self.setup()

    def on_start(self) -> None:
        """Called at every (re)start of listening: a fresh process."""

    # ---- routing ------------------------------------------------------------------
    def setup(self) -> None:
        raise NotImplementedError

    def route(self, methods: str, path: str, handler: Handler, inference: bool = False) -> None:
        table = self._routes.setdefault(path, {})
        for m in methods.split(","):
            table[m.strip().upper()] = (handler, inference)

    def lookup(self, req: Request) -> tuple[Handler, bool] | str:
        """The handler, or "not_found" / "method" when there is none."""
        table = self._routes.get(req.path)
        if table is None:
            return "not_found"
        entry = table.get(req.method) or (table.get("GET") if req.method == "HEAD" else None)
        return entry if entry is not None else "method"

    async def handle(self, req: Request) -> None:
        raise NotImplementedError

    async def call(self, req: Request, entry: tuple[Handler, bool]) -> None:
        handler, inference = entry
        if inference:
            self.stats.requests_total += 1
        await handler(req)

    # ---- helpers --------------------------------------------------------------------
    @staticmethod
    def parse_json(req: Request) -> tuple[Any, json.JSONDecodeError | None]:
        """The body as JSON (parsed once, with the stdlib for Python's error messages)."""
        cached: tuple[Any, json.JSONDecodeError | None] | None = req.state.get("json")
        if cached is not None:
            return cached
        try:
            result: tuple[Any, json.JSONDecodeError | None] = (json.loads(req.body or b"null"), None)
        except json.JSONDecodeError as exc:
            result = (None, exc)
        except UnicodeDecodeError as exc:
            result = (None, json.JSONDecodeError(str(exc), "", 0))
        req.state["json"] = result
        return result

    def bearer(self, req: Request) -> str | None:
        auth = req.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None

    def limit_for(self, requested: Any) -> tuple[int, str]:
        """Token limit and the finish reason when reaching it (no limit: emulated EOS)."""
        if isinstance(requested, int) and not isinstance(requested, bool) and requested >= 0:
            return requested, "length"
        return max(0, self.cfg.natural_stop_tokens), "stop"

    async def reply(self, req: Request, r: Reply) -> None:
        await req.send(*r)

    @staticmethod
    def now() -> int:
        return int(time.time())

    def status_error(self, req: Request, code: int) -> Reply:
        """The engine's own error response for ``error_status:<code>``."""
        raise NotImplementedError

    # ---- the generation driver --------------------------------------------------------
    async def generate(self, req: Request, job: InferenceJob) -> None:
        loop = asyncio.get_running_loop()
        stats = self.stats
        res = Result(prompt_tokens=job.prompt_tokens, t_arrive=loop.time())
        stats.last_effective = job.effective or None
        fault = take_fault(self.cfg)
        if fault is not None:
            stats.faulted += 1
        info = SlotInfo(prompt_tokens=job.prompt_tokens, max_tokens=job.limit, stream=job.stream)
        slot: int | None = None
        ok = False
        try:
            if fault == "no_answer":
                await _forever()
            if fault == "html_200":
                headers = [
                    ("Server", "nginx"),
                    ("Content-Type", "text/html"),
                    ("Content-Length", str(len(wire.HTML_PAGE))),
                ]
                await req.send(200, headers, wire.HTML_PAGE)
                return
            if fault is not None and fault.startswith("error_status:"):
                await self.reply(req, self.status_error(req, int(fault.split(":", 1)[1])))
                return
            skip_ttft = False
            if fault == "slow_first_byte":
                await asyncio.sleep(self.cfg.ttft_s)
                skip_ttft = True
            if job.prepare is not None:
                res.load_ns = await job.prepare()
            if job.stream and not self.headers_after_first_token:
                await self._start_stream(req, job)
            try:
                slot = await self.pool.acquire(info, job.queue_bound)
            except QueueFull:
                stats.rejected += 1
                if job.queue_full is not None:
                    await job.queue_full(req)
                return
            res.t_slot = loop.time()
            stats.prompt_tokens_total += job.prompt_tokens
            if job.stream:
                ok = await self._stream(req, job, res, info, fault, skip_ttft)
            else:
                ok = await self._plain(req, job, res, info, fault, skip_ttft)
        finally:
            pinger = req.state.pop("pinger", None)
            if pinger is not None:
                pinger.cancel()
            if slot is not None:
                self.pool.release(slot)
            if ok:
                stats.completed += 1
                self._observe(res)
            elif not req.finished and req.closed and not req.conn.server_killed:
                stats.cancelled += 1

    async def _start_stream(self, req: Request, job: InferenceJob) -> None:
        assert job.fmt is not None
        await req.start(200, job.fmt.headers())
        if job.ping_interval is not None and job.fmt.ping() is not None:
            loop = asyncio.get_running_loop()
            req.state["pinger"] = loop.create_task(self._pings(req, job.fmt, job.ping_interval))

    def _observe(self, res: Result) -> None:
        h = self.rt.hist
        h["queue"].observe(max(0.0, res.t_slot - res.t_arrive))
        h["ttft"].observe(max(0.0, res.t_first - res.t_arrive))
        h["e2e"].observe(max(0.0, res.t_end - res.t_arrive))
        if res.completion_tokens > 1:
            h["tpot"].observe(max(0.0, (res.t_end - res.t_first) / (res.completion_tokens - 1)))
        reason = res.finish or "abort"
        self.stats.finished_reasons[reason] = self.stats.finished_reasons.get(reason, 0) + 1

    def reasoning_count(self, job: InferenceJob) -> int:
        """How many of the first generated tokens are reasoning (config.reasoning_tokens)."""
        if not job.reasoning:
            return 0
        r = max(0, min(self.cfg.reasoning_tokens, job.limit))
        return r if job.finish_at_limit == "length" or job.limit > 0 else 0

    async def _stream(
        self, req: Request, job: InferenceJob, res: Result, info: SlotInfo, fault: str | None, skip_ttft: bool
    ) -> bool:
        fmt = job.fmt
        assert fmt is not None
        loop = asyncio.get_running_loop()
        cfg = self.cfg
        k = cfg.fault_after_chunks
        deadline = loop.time() + (0.0 if skip_ttft else cfg.ttft_s)
        if deadline > loop.time():
            await asyncio.sleep(deadline - loop.time())
        if fault == "mid_stream_error" and k == 0 and not req.started and job.error_reply is not None:
            await self.reply(req, job.error_reply())  # the first result is an error: plain HTTP error
            return False
        if not req.started:
            await self._start_stream(req, job)
        res.t_first = loop.time()
        pending = fmt.first()
        r = self.reasoning_count(job)
        limit = job.limit - r if job.finish_at_limit == "length" else job.limit
        gen = Generation(limit, job.finish_at_limit, job.stops)
        step, write_now, conn = gen.step, req.write_now, req.conn
        tpot = cfg.tpot_s
        group = max(1, cfg.tokens_per_event)
        held: list[str] = []  # deltas of the event being filled (tokens_per_event > 1)
        held_emit = fmt.token
        sent = 0
        delta: str
        finish: str | None
        try:
            while True:
                if sent < r:
                    delta, finish, emit = token_text(sent), None, fmt.reasoning
                elif limit <= 0:
                    delta, finish, emit = "", "length", fmt.token
                else:
                    delta, finish = step()
                    emit = fmt.token
                info.n_decoded = r + gen.count if sent >= r else sent + 1
                if fault == "engine_abort" and sent >= k and self.abort_reason:
                    finish = self.abort_reason  # its own finish chunk, with the usage so far
                if held and finish is not None and held_emit == emit:
                    delta = "".join(held) + delta  # the last event holds what is left
                    held.clear()
                elif held and (held_emit != emit or finish is not None or (fault is not None and sent >= k)):
                    pending += held_emit("".join(held))  # the event is cut short: reasoning ends, or a fault
                    held.clear()
                if fault is not None and sent >= k:
                    ended = await self._stream_fault(req, fmt, fault, delta, pending)
                    pending = b""
                    if ended:
                        res.completion_tokens = min(sent, r) + gen.count
                        self.stats.tokens_generated_total += res.completion_tokens
                        return False
                    fault = None
                if finish is not None:
                    break
                if delta:
                    sent += 1
                    if group > 1:
                        held.append(delta)
                        held_emit = emit
                        if len(held) < group:
                            delta = ""
                        else:
                            delta = "".join(held)
                            held.clear()
                    if delta:
                        if write_now(pending + emit(delta) if pending else emit(delta)):
                            await conn.drain()
                        pending = b""
                if tpot > 0:
                    deadline += tpot
                    delay = deadline - loop.time()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    else:
                        deadline = loop.time()
        except asyncio.CancelledError:  # the client left: what was generated so far still counts, as engines do
            self.stats.tokens_generated_total += min(sent, r) + gen.count
            raise
        res.finish, res.matched, res.completion_tokens = finish, gen.matched, r + gen.count
        res.t_end = loop.time()
        self.stats.tokens_generated_total += res.completion_tokens
        await req.write(pending + fmt.final(delta, res))
        await req.end()
        return True

    async def _pings(self, req: Request, fmt: StreamFormat, interval: float) -> None:
        while not req.finished and not req.closed:
            await asyncio.sleep(max(0.001, interval))
            ping = fmt.ping()
            if ping and not req.finished:
                await req.write(ping)

    async def _stream_fault(self, req: Request, fmt: StreamFormat, fault: str, delta: str, pending: bytes) -> bool:
        """Apply an in-flight fault; True when the stream is over."""
        if pending:
            await req.write(pending)
        if fault == "reset_mid_stream":
            req.abort()
            return True
        if fault == "garbage_sse":
            await req.write(wire.GARBAGE_EVENTS)
            return False
        if fault == "huge_chunk":
            await req.write(fmt.huge(max(1, self.cfg.huge_chunk_bytes)))
            return False
        if fault == "truncated_sse":
            event = fmt.token(delta or "x")
            await req.write(event[: max(1, len(event) // 2)])
            await req.end()
            req.close()
            return True
        if fault in ("stall_stream", "stall_body"):
            await _forever()
        if fault == "mid_stream_error":
            await req.write(fmt.error())
            await req.end()
            return True
        if fault == "ollama_repeat_abort":
            await req.write(fmt.repeat_abort())
            await req.end()
            return True
        return False  # slow_first_byte and the like: nothing more to do

    async def _plain(
        self, req: Request, job: InferenceJob, res: Result, info: SlotInfo, fault: str | None, skip_ttft: bool
    ) -> bool:
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        r = self.reasoning_count(job)
        limit = job.limit - r if job.finish_at_limit == "length" else job.limit
        text, finish_reason, count, matched = run_all(limit, job.finish_at_limit, job.stops)
        res.reasoning = expected_text(r)
        count += r
        finish: str | None = finish_reason
        if fault == "ollama_repeat_abort":
            k = min(count, cfg.fault_after_chunks)
            text, _, count, matched = run_all(k, "length", [])
            finish = None
        if fault == "engine_abort" and self.abort_reason:
            k = min(count, cfg.fault_after_chunks)
            text, _, count, matched = run_all(k, "length", [])
            finish = self.abort_reason
        delay = (0.0 if skip_ttft else cfg.ttft_s) + cfg.tpot_s * max(0, count - 1)
        res.t_first = loop.time() + (0.0 if skip_ttft else cfg.ttft_s)
        if delay > 0:
            await asyncio.sleep(delay)
        info.n_decoded = count
        res.text, res.finish, res.completion_tokens, res.matched = text, finish, count, matched
        res.t_end = loop.time()
        self.stats.tokens_generated_total += count
        if fault == "mid_stream_error" and job.error_reply is not None:
            await self.reply(req, job.error_reply())
            return False
        if fault == "reset_mid_stream":
            req.abort()
            return False
        if fault == "huge_chunk":
            res.text = "x" * max(1, cfg.huge_chunk_bytes)
        assert job.body is not None
        status, headers, body = job.body(res)
        if fault == "garbage_sse":
            body = b'{"id": "garbage", "choices": [{"message": {"content": "unterminated'
            headers = [(k, str(len(body)) if k.lower() == "content-length" else v) for k, v in headers]
        if fault in ("stall_body", "stall_stream", "truncated_sse"):
            await req.start(status, headers)
            req.write_raw(body[: max(1, len(body) // 2)])
            if fault == "truncated_sse":
                req.close()
                return False
            await _forever()
        await req.send(status, headers, body)
        return fault is None or fault in ("slow_first_byte", "huge_chunk", "ollama_repeat_abort", "engine_abort")
