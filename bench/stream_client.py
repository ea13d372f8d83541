#!/usr/bin/env python3
"""Streaming load generator (aiohttp on uvloop). Two modes, both bounded in count and time.

closed loop (`-c C -d SECONDS`): C workers POST `"stream": true` requests back to back until
  the duration (or --max-requests) is reached. Prints `STREAMJSON {...}`.
hold (`--hold N`): opens N streams at --open-rate per second (at most --open-inflight waiting for
  their first byte at once), keeps them all open while they stream, reads each to the end. Prints
  `OPEN <open now> <first bytes so far> <started>` every second, `ALLOPEN N` the moment all N are
  open at once, and at the end `HOLDJSON {...}` with the peak number of streams open at once. With
  --engine-hold ID the fake engine keeps every stream going (one token per tpot) until the harness
  calls its /fake/release?hold=ID, so "all open at once" does not depend on timing.

Per good stream also the longest gap between two reads after its first byte (`max_gap_us`: the longest
over all streams); with --stall-ms a stream whose longest gap exceeds it counts as `stalled` (the boards'
rule is 10x the engine's pace).

--dialect picks the API spoken (the request body is built from --body, an OpenAI chat body, with the same
prompt, sampling and token count in each; with --native-body, --body is already in the dialect, e.g. one of
agent_request.py's coding-agent requests, and only `stream` and the token limit are set): `chat` (POST
/v1/chat/completions, OpenAI SSE), `messages` (Anthropic's POST /v1/messages: `event: NAME` frames) or
`responses` (OpenAI's POST /v1/responses).

Per stream: TTFT = first body bytes after the request was sent; total latency; SSE frames; and the
relayed *token deltas*, counted the same way in every dialect so that "per event" compares like with
like: a chat frame whose `choices[0].delta.content` is a non-empty string; an Anthropic
`content_block_delta` frame with a non-empty `text_delta`; a Responses `response.output_text.delta`
frame with a non-empty `delta`. Every frame's data is parsed as JSON. A stream is good only with status
200, `text/event-stream`, every frame valid JSON, no error frame, its terminal frame last and nothing
after it (chat: `data: [DONE]`; messages: `message_stop`; responses: `response.completed`, or
`response.incomplete` whose reason is `max_output_tokens`: the API's own end for a stream cut at the
token limit, which is what every bench stream is), and, with --expect-deltas N, exactly N token deltas.
Comment-only frames (`: ...`, keep-alives) are ignored. Latencies in the JSON are microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import time
from pathlib import Path

import aiohttp

try:
    from orjson import loads as json_loads
except ImportError:  # the project's venv has orjson; plain json is the fallback
    from json import loads as json_loads

DIALECTS = ("chat", "messages", "responses")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
# the frame that ends a good stream, and the frame names that are an error, per dialect
TERMINAL = {"messages": "message_stop", "responses": "response.completed"}
ERROR_EVENTS = {"messages": {"error"}, "responses": {"error", "response.failed", "response.incomplete"}}


def pct(sorted_vals: list[float], p: float) -> float:
    if not sorted_vals:
        return 0.0
    return sorted_vals[min(len(sorted_vals) - 1, round(p / 100 * (len(sorted_vals) - 1)))]


class Stats:
    def __init__(self) -> None:
        self.ttfts: list[float] = []
        self.totals: list[float] = []
        self.deltas: list[int] = []  # token deltas per good stream
        self.frames: list[int] = []  # SSE frames per good stream
        self.max_gaps: list[float] = []  # per good stream: its longest gap between reads after the first byte
        self.errors: dict[str, int] = {}
        self.open = self.peak_open = self.first_bytes = 0
        self.t_all_open: float | None = None
        self.t_last_first_byte = 0.0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def summary(self, elapsed: float, stall_s: float = 0.0, **extra: object) -> dict[str, object]:
        t, f, g = sorted(self.ttfts), sorted(self.totals), sorted(self.max_gaps)
        us = lambda v: int(v * 1e6)  # noqa: E731
        return {
            "requests": len(self.totals),
            "duration_us": us(elapsed),
            "errors": sum(self.errors.values()),
            "error_kinds": self.errors,
            "deltas_total": sum(self.deltas),
            "deltas_median": sorted(self.deltas)[len(self.deltas) // 2] if self.deltas else 0,
            "frames_median": sorted(self.frames)[len(self.frames) // 2] if self.frames else 0,
            "p50_us": us(pct(f, 50)),
            "p90_us": us(pct(f, 90)),
            "p99_us": us(pct(f, 99)),
            "max_us": us(f[-1]) if f else 0,
            "ttft_p50_us": us(pct(t, 50)),
            "ttft_p90_us": us(pct(t, 90)),
            "ttft_p99_us": us(pct(t, 99)),
            "ttft_max_us": us(t[-1]) if t else 0,
            "max_gap_us": us(g[-1]) if g else 0,
            "stalled": sum(v > stall_s for v in g) if stall_s > 0 else None,
            **extra,
        }


class SSEReader:
    """One stream's SSE frames, parsed across chunk boundaries and classified for its dialect.

    `deltas`: token deltas relayed (see the module doc); `frames`: all frames; `ended`: the terminal frame
    came; `error`: why the stream is not good (None while it is)."""

    __slots__ = ("_buf", "deltas", "dialect", "ended", "error", "frames")

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        self._buf = b""
        self.deltas = self.frames = 0
        self.ended = False
        self.error: str | None = None

    def feed(self, chunk: bytes) -> None:
        buf = self._buf + chunk if self._buf else chunk
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n")
        *whole, self._buf = buf.split(b"\n\n")
        for raw in whole:
            if raw.strip(b"\n") and self.error is None:
                self._frame(raw)

    def finish(self) -> str | None:
        """At the end of the body: None if the stream is good, else the kind of error."""
        if self.error is None and self._buf.strip():
            self.error = "partial_frame"
        if self.error is None and not self.ended:
            self.error = "no_terminal_frame"
        return self.error

    def _frame(self, raw: bytes) -> None:
        lines = [line for line in raw.split(b"\n") if line and not line.startswith(b":")]
        if not lines:
            return  # only SSE comments (a keep-alive): no frame
        self.frames += 1
        if self.ended:
            self.error = "frame_after_end"
            return
        name, data = "", []
        for line in lines:
            if line.startswith(b"data:"):
                data.append(line[5:].removeprefix(b" "))
            elif line.startswith(b"event:"):
                name = line[6:].strip().decode()
        payload = b"\n".join(data)
        if self.dialect == "chat":
            if payload == b"[DONE]":
                self.ended = True
                return
        elif not name:
            self.error = "frame_without_event"
            return
        if not payload:
            self.error = "frame_without_data"
            return
        try:
            obj = json_loads(payload)
        except ValueError:
            self.error = "bad_json"
            return
        if not isinstance(obj, dict):
            self.error = "bad_json"
            return
        if self.dialect == "chat":
            if "error" in obj:
                self.error = "error_event"
                return
            ch = obj.get("choices")
            if ch and isinstance(ch, list) and isinstance(ch[0], dict):
                d = ch[0].get("delta")
                if isinstance(d, dict) and isinstance(d.get("content"), str) and d["content"]:
                    self.deltas += 1
            return
        if name == "response.incomplete" and _incomplete_reason(obj) == "max_output_tokens":
            self.ended = True  # the Responses API's own end for "stopped at max_output_tokens": a proper end
            return
        if name in ERROR_EVENTS[self.dialect] or "error" in obj:
            self.error = "error_event"
            return
        if obj.get("type") != name:
            self.error = "type_mismatch"  # both dialects repeat the event name as the data's "type"
            return
        if self.dialect == "messages":
            if name == "content_block_delta":
                d = obj.get("delta")
                if isinstance(d, dict) and d.get("type") == "text_delta" and isinstance(d.get("text"), str):
                    self.deltas += bool(d["text"])
        elif name == "response.output_text.delta":
            d = obj.get("delta")
            self.deltas += isinstance(d, str) and bool(d)
        if name == TERMINAL[self.dialect]:
            self.ended = True


def _incomplete_reason(obj: dict) -> object:
    resp = obj.get("response")
    details = resp.get("incomplete_details") if isinstance(resp, dict) else None
    return details.get("reason") if isinstance(details, dict) else None


async def one_stream(
    s: aiohttp.ClientSession,
    a: argparse.Namespace,
    data: bytes,
    hdrs: dict[str, str],
    st: Stats,
    opened: asyncio.Semaphore | None = None,
) -> None:
    t0 = time.perf_counter()
    got_first = False
    counted_open = False
    last = max_gap = 0.0
    try:
        async with s.post(a.url, data=data, headers=hdrs) as r:
            sse = SSEReader(a.dialect)
            async for chunk in r.content.iter_any():
                now = time.perf_counter()
                if got_first:
                    if now - last > max_gap:
                        max_gap = now - last
                    last = now
                else:
                    got_first = True
                    last = now
                    ttft = now - t0
                    st.first_bytes += 1
                    st.t_last_first_byte = now
                    st.open += 1
                    counted_open = True
                    st.peak_open = max(st.peak_open, st.open)
                    if a.hold and st.open == a.hold and st.t_all_open is None:
                        st.t_all_open = time.perf_counter()
                        print(f"ALLOPEN {st.open}", flush=True)  # the harness waits for this line
                    if opened is not None:
                        opened.release()
                        opened = None
                sse.feed(chunk)
            t1 = time.perf_counter()
            if r.status != 200:
                st.error(f"status_{r.status}")
            elif not got_first:
                st.error("empty_body")
            elif not r.content_type.startswith("text/event-stream"):
                st.error("not_event_stream")
            elif (kind := sse.finish()) is not None:
                st.error(kind)
            elif a.expect_deltas and sse.deltas != a.expect_deltas:
                st.error("wrong_delta_count")
            else:
                st.ttfts.append(ttft)
                st.totals.append(t1 - t0)
                st.deltas.append(sse.deltas)
                st.frames.append(sse.frames)
                st.max_gaps.append(max_gap)
    except asyncio.CancelledError:
        st.error("deadline")
        raise
    except Exception as e:  # count it and carry on
        st.error(type(e).__name__)
    finally:
        if counted_open:
            st.open -= 1
        if opened is not None:
            opened.release()


def dialect_body(chat: dict, dialect: str, tokens: int) -> dict:
    """The same request (model, prompt, sampling, token count, streamed) in `dialect`, from a chat body."""
    model = chat.get("model", "fake-model")
    sampling = {k: chat[k] for k in ("temperature", "top_p") if k in chat}
    if dialect == "chat":
        return {**chat, "model": model, "stream": True, "max_tokens": tokens}
    system = "\n".join(str(m["content"]) for m in chat.get("messages", []) if m.get("role") == "system")
    turns = [m for m in chat.get("messages", []) if m.get("role") != "system"] or [{"role": "user", "content": "Hi"}]
    if dialect == "messages":
        body: dict = {"model": model, "max_tokens": tokens, "stream": True, "messages": turns, **sampling}
        if system:
            body["system"] = system
        return body
    if dialect == "responses":
        text = turns[0]["content"] if len(turns) == 1 and turns[0].get("role") == "user" else None
        body = {"model": model, "input": text if isinstance(text, str) else turns, "stream": True}
        body.update({"max_output_tokens": tokens, "store": False, **sampling})
        if system:
            body["instructions"] = system
        return body
    raise ValueError(f"unknown dialect {dialect!r}")


def request_headers(dialect: str, key: str) -> dict[str, str]:
    if dialect == "messages":  # what Anthropic's SDK sends (the gateway also takes Bearer)
        return {"Content-Type": "application/json", "x-api-key": key, "anthropic-version": "2023-06-01"}
    return {"Content-Type": "application/json", "Authorization": "Bearer " + key}


HELD_MAX_TOKENS = 4096
#: the field each dialect's body gives the answer's token limit in
TOKEN_FIELD = {"chat": "max_tokens", "messages": "max_tokens", "responses": "max_output_tokens"}


def request_body(a: argparse.Namespace) -> bytes:
    chat = json.loads(Path(a.body).read_bytes()) if a.body else {"messages": [{"role": "user", "content": "Hi"}]}
    chat["model"] = a.model or chat.get("model", "fake-model")
    # a held stream runs until the harness releases it, past any max_tokens the fake engine would otherwise
    # honour; a gateway that holds streams to their reservation (budgets, tpm) cuts a stream at its max_tokens,
    # so a held stream asks for more than the hold can produce
    tokens = max(a.tokens, HELD_MAX_TOKENS) if a.engine_hold else a.tokens
    if a.native_body:  # already in the dialect (bench/agent_request.py): only streamed, with the token count
        body = {**chat, "stream": True, TOKEN_FIELD[a.dialect]: tokens}
    else:
        body = dialect_body(chat, a.dialect, tokens)
    if a.tpot_ms is not None:
        body["fake_tpot_ms"] = a.tpot_ms  # read by bench/fake_engine.py, passed through by the proxies
    if a.engine_hold:
        body["fake_hold"] = a.engine_hold  # the fake engine streams until the harness calls /fake/release?hold=ID
    return json.dumps(body).encode()


async def run(a: argparse.Namespace) -> None:
    data = request_body(a)
    hdrs = request_headers(a.dialect, os.environ.get("BENCH_API_KEY", "sk-x"))
    st = Stats()
    conn = aiohttp.TCPConnector(
        limit=0 if a.hold else a.concurrency, local_addr=(a.local_addr, 0) if a.local_addr else None
    )
    timeout = aiohttp.ClientTimeout(total=a.timeout, sock_connect=30)
    async with aiohttp.ClientSession(connector=conn, timeout=timeout) as s:
        t_start = time.perf_counter()
        if a.hold:
            opened = asyncio.Semaphore(a.open_inflight)
            tasks: list[asyncio.Task[None]] = []

            async def opener() -> None:
                for i in range(a.hold):
                    delay = t_start + i / a.open_rate - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await opened.acquire()
                    tasks.append(asyncio.create_task(one_stream(s, a, data, hdrs, st, opened)))

            async def progress() -> None:  # one line a second, for the harness to see a stalled ramp
                while True:
                    await asyncio.sleep(1.0)
                    print(f"OPEN {st.open} {st.first_bytes} {len(tasks)}", flush=True)

            op = asyncio.create_task(opener())
            prog = asyncio.create_task(progress())
            await asyncio.wait([op], timeout=a.deadline)
            left = max(0.0, a.deadline - (time.perf_counter() - t_start))
            if tasks and left > 0:
                await asyncio.wait(tasks, timeout=left)
            for t in [op, prog, *tasks]:
                t.cancel()
            await asyncio.gather(op, prog, *tasks, return_exceptions=True)
            elapsed = time.perf_counter() - t_start
            extra = {
                "hold": a.hold,
                "started": len(tasks),
                "first_bytes": st.first_bytes,
                "peak_open": st.peak_open,
                "all_open_s": round(st.t_all_open - t_start, 3) if st.t_all_open else None,
                "ramp_s": round(st.t_last_first_byte - t_start, 3) if st.first_bytes else None,
            }
            print("HOLDJSON " + json.dumps(st.summary(elapsed, a.stall_ms / 1e3, **extra)), flush=True)
            return
        deadline = t_start + a.duration
        started = 0

        async def worker() -> None:
            nonlocal started
            while time.perf_counter() < deadline and started < a.max_requests:
                started += 1
                await one_stream(s, a, data, hdrs, st)

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(a.concurrency))), a.duration + a.timeout + 5)
        elapsed = time.perf_counter() - t_start
    print("STREAMJSON " + json.dumps(st.summary(elapsed, a.stall_ms / 1e3)), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url", help="the full URL, path included (see --dialect)")
    ap.add_argument("--dialect", choices=DIALECTS, default="chat", help="the API the URL speaks")
    ap.add_argument("--expect-deltas", type=int, default=0, help="a good stream has exactly this many token deltas")
    ap.add_argument("--body", help="request JSON file (model/stream/max_tokens are overridden)")
    ap.add_argument(
        "--native-body",
        action="store_true",
        help="--body is already in --dialect (e.g. bench/agent_request.py's): sent as it is but streamed, "
        "with --tokens as its token limit; else it is a chat body translated to the dialect",
    )
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens: the fake engine sends exactly that many")
    ap.add_argument("--tpot-ms", type=int, help="fake_tpot_ms in the body (fake engine's delay between tokens)")
    ap.add_argument("-c", "--concurrency", type=int, default=16)
    ap.add_argument("-d", "--duration", type=float, default=10.0)
    ap.add_argument("--max-requests", type=int, default=1_000_000)
    ap.add_argument("--timeout", type=float, default=60.0, help="per stream, seconds")
    ap.add_argument("--hold", type=int, default=0, help="hold mode: open this many streams at once")
    ap.add_argument("--open-rate", type=float, default=1000.0, help="hold mode: streams opened per second")
    ap.add_argument("--open-inflight", type=int, default=256, help="hold mode: most streams awaiting first byte")
    ap.add_argument("--deadline", type=float, default=120.0, help="hold mode: overall limit, seconds")
    ap.add_argument("--engine-hold", metavar="ID", help="streams last until the engine's /fake/release?hold=ID")
    ap.add_argument("--stall-ms", type=float, default=0.0, help="a gap after the first byte over this is a stall")
    ap.add_argument("--local-addr", help="source address (127.0.0.x) to spread connections over 4-tuples")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if a.hold and a.hold + 64 > hard:
        raise SystemExit(f"--hold {a.hold} needs more fds than this process may open ({hard}); split the load")
    try:
        import uvloop

        uvloop.run(run(a))
    except ImportError:
        asyncio.run(run(a))


if __name__ == "__main__":
    main()
