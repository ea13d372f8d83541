#!/usr/bin/env python3
"""A fake OpenAI-compatible engine (vLLM-shaped) that is never the bottleneck of the bench.

Kept beside llm_gateway_emulators because the emulator's vLLM costs ~80 µs CPU per non-streamed chat
against ~14 here (~490 against ~34 per 64-token stream at tpot 0, ~920 against ~520 at tpot 1 ms),
which would make the engine, not the proxy, the bottleneck (server `taskset -c 1`, `taskset -c 0 wrk
-t1 -c64 -d4s -s bench/post.lua URL -- bench/request.json`, user+sys from /proc/PID/stat, 2-core box).

Raw `asyncio.Protocol` on uvloop, hand-rolled HTTP/1.1 with keep-alive, every response body
pre-serialised (cached per token count). Serves on 127.0.0.1 only, on one or more ports:

  POST /v1/chat/completions  non-streaming: one JSON body with `usage`;
                             `"stream": true`: SSE, one HTTP chunk per token: the first carries the
                             role chunk and token 1, then one token per `tpot`, then the finish chunk,
                             the usage chunk (only when `stream_options.include_usage` is true) and
                             `data: [DONE]`
  GET  /v1/models            one model (`fake-model`)
  GET  /health               200
  GET  /metrics              vLLM's names: vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc
  GET  /stats                JSON counters for the harness (connections accepted and open, requests)

  POST /fake/release?hold=ID ends the held streams (below) with that id, now and later; answers how many

Per request, read from the body without parsing it: `max_tokens` sets the number of tokens (default
`--tokens`, capped at `--max-tokens-cap`), `fake_tpot_ms` the delay between tokens (default
`--tpot-ms`); `"fake_hold": "ID"` makes a stream send one token per tpot until `/fake/release?hold=ID`
(or `--max-hold-s`), then finish normally: the harness uses it to keep N streams open at once for as
long as it needs. A stream that arrives after its id was released (one a proxy had queued) ends at
its first token. `--keepalive-s` closes connections idle that long (vLLM/uvicorn: 5 s; 0 = never).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import signal
import time

MODEL = "fake-model"
STATS = {"connections": 0, "open": 0, "requests": 0, "chat": 0, "streams": 0, "active_streams": 0, "bad": 0}
WORDS = ("The", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "and", "a", "gateway", ".")
CREATED = int(time.time())
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def http_response(body: bytes, ctype: bytes = b"application/json", status: bytes = b"200 OK") -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (status, ctype, len(body), body)


def http_chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


class Responses:
    """Pre-serialised answers, built once per (tokens, include_usage)."""

    def __init__(self) -> None:
        self._full: dict[int, bytes] = {}
        self._stream: dict[tuple[int, bool], list[bytes]] = {}

    @staticmethod
    def _tokens(n: int) -> list[str]:
        return [(" " if i else "") + WORDS[i % len(WORDS)] for i in range(n)]

    @staticmethod
    def _usage(n: int) -> dict[str, int]:
        return {"prompt_tokens": 42, "completion_tokens": n, "total_tokens": 42 + n}

    def full(self, n: int) -> bytes:
        r = self._full.get(n)
        if r is None:
            body = {
                "id": "chatcmpl-fake0123456789",
                "object": "chat.completion",
                "created": CREATED,
                "model": MODEL,
                "system_fingerprint": None,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(self._tokens(n)), "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": "length",
                        "stop_reason": None,
                    }
                ],
                "usage": self._usage(n),
            }
            r = self._full[n] = http_response(json.dumps(body, separators=(",", ":")).encode())
        return r

    def held(self, usage: bool) -> tuple[bytes, bytes, bytes]:
        """(first write, one more token, closing write) of a stream that lasts until released."""
        first, *_ = self.stream(2, usage)
        last = self.stream(2, usage)[-1]
        token = self.stream(3, usage)[1]
        return first, token, last

    def stream(self, n: int, usage: bool) -> list[bytes]:
        """The HTTP chunks of one streamed answer: one write per token, the last one closes the body."""
        r = self._stream.get((n, usage))
        if r is None:
            base = {"id": "chatcmpl-fake0123456789", "object": "chat.completion.chunk", "created": CREATED}
            base["model"] = MODEL

            def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                return sse({**base, "choices": [choice]})

            r = []
            for i, t in enumerate(self._tokens(n)):
                role = chunk({"role": "assistant", "content": ""}) if i == 0 else b""
                r.append(http_chunk(role + chunk({"content": t})))
            tail = chunk({}, "length")
            if usage:
                tail += sse({**base, "choices": [], "usage": self._usage(n)})
            tail += b"data: [DONE]\n\n"
            r[-1] += http_chunk(tail) + b"0\r\n\r\n"
            self._stream[(n, usage)] = r
        return r


def metrics_text() -> bytes:
    m = f'engine="0",model_name="{MODEL}"'
    running = STATS["active_streams"]
    lines = [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{m}}} {float(running)}",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{m}}} 0.0",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{m}}} {min(0.9, running / 10000):.4f}",
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
        f'vllm:request_success_total{{finished_reason="length",{m}}} {float(STATS["chat"])}',
    ]
    return ("\n".join(lines) + "\n").encode()


def body_int(body: bytes, key: bytes) -> int | None:
    """The integer value of `"key": N` in a JSON body, found without parsing it (None if absent)."""
    i = body.find(key)
    if i < 0:
        return None
    i += len(key)
    n = len(body)
    while i < n and body[i] in b' \t:"':
        i += 1
    j = i
    while j < n and 48 <= body[j] <= 57:
        j += 1
    return int(body[i:j]) if j > i else None


def body_str(body: bytes, key: bytes) -> bytes | None:
    """The string value of `"key": "value"` in a JSON body (no escapes), found without parsing it."""
    i = body.find(key)
    if i < 0:
        return None
    i = body.find(b'"', i + len(key))
    j = body.find(b'"', i + 1)
    return body[i + 1 : j] if i >= 0 and j > i else None


class Engine(asyncio.Protocol):
    cfg: argparse.Namespace
    responses = Responses()
    conns: set[Engine] = set()
    released: set[bytes] = set()  # hold ids ended by /fake/release

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        STATS["connections"] += 1
        STATS["open"] += 1
        self.t: asyncio.Transport = transport  # type: ignore[assignment]
        self.buf = bytearray()
        self.busy = False  # a delayed response is being written; later pipelined requests wait
        self.close_after = False
        self.last = time.monotonic()
        self.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        STATS["open"] -= 1
        if self.busy:
            STATS["active_streams"] -= 1
            self.busy = False
        self.conns.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if not self.busy:
            self.process()

    def process(self) -> None:
        buf = self.buf
        while not self.busy:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buf[:end]).lower()
            start = end + 4
            if b"transfer-encoding: chunked" in head:
                z = buf.find(b"\r\n0\r\n\r\n", start - 2)
                if z < 0:
                    return
                body, used = bytes(buf[start : z + 2]), z + 7  # raw chunked body: fine for key lookups
            else:
                n = body_int(head, b"content-length:") or 0
                if len(buf) < start + n:
                    return
                body, used = bytes(buf[start : start + n]), start + n
            del buf[:used]
            self.close_after = b"connection: close" in head
            self.last = time.monotonic()
            self.handle(head, body)
            if self.close_after and not self.busy:
                self.t.close()
                return

    def handle(self, head: bytes, body: bytes) -> None:
        STATS["requests"] += 1
        cfg = self.cfg
        sp = head.find(b" ")
        path, _, query = head[sp + 1 : head.find(b" ", sp + 1)].partition(b"?")
        if head.startswith(b"post") and path.endswith(b"/chat/completions"):
            STATS["chat"] += 1
            n = body_int(body, b'"max_tokens"')
            n = cfg.tokens if n is None else max(1, min(n, cfg.max_tokens_cap))
            if b'"stream":true' in body or b'"stream": true' in body:
                STATS["streams"] += 1
                usage = b'"include_usage":true' in body or b'"include_usage": true' in body
                writes = self.responses.stream(n, usage)
                tpot = body_int(body, b'"fake_tpot_ms"')
                tpot_s = cfg.tpot_ms / 1e3 if tpot is None else tpot / 1e3
                self.t.write(STREAM_HEAD)
                hold = body_str(body, b'"fake_hold"')
                if hold is not None:
                    self.busy = True
                    STATS["active_streams"] += 1
                    loop = asyncio.get_running_loop()
                    parts = self.responses.held(usage)
                    until = loop.time() + cfg.max_hold_s
                    start = loop.time() + cfg.ttft_ms / 1e3
                    loop.call_at(start, self.step_held, loop, parts, tpot_s, 0, hold, until)
                    return
                if tpot_s <= 0 and cfg.ttft_ms <= 0:
                    self.t.write(b"".join(writes))
                    return
                self.busy = True
                STATS["active_streams"] += 1
                loop = asyncio.get_running_loop()
                t0 = loop.time() + cfg.ttft_ms / 1e3
                loop.call_at(t0, self.step, loop, writes, t0, tpot_s, 0)
            else:
                self.t.write(self.responses.full(n))
        elif path in (b"/v1/models", b"/models"):
            self.t.write(MODELS)
        elif path == b"/metrics":
            self.t.write(http_response(metrics_text(), b"text/plain; version=0.0.4; charset=utf-8"))
        elif path == b"/health":
            self.t.write(http_response(b""))
        elif path == b"/fake/release":
            hold = query.partition(b"hold=")[2].split(b"&")[0]
            Engine.released.add(hold)
            self.t.write(
                http_response(json.dumps({"released": hold.decode(), "held": STATS["active_streams"]}).encode())
            )
        elif path == b"/stats":
            self.t.write(http_response(json.dumps(STATS).encode()))
        else:
            STATS["bad"] += 1  # vLLM's (FastAPI's) answer for a path it has no route for: the gateway then
            # translates what it would have passed through natively (Anthropic's /v1/messages)
            self.t.write(http_response(b'{"detail":"Not Found"}', status=b"404 Not Found"))

    def step(self, loop: asyncio.AbstractEventLoop, writes: list[bytes], t0: float, tpot_s: float, i: int) -> None:
        if not self.busy or self.t.is_closing():
            return
        self.t.write(writes[i])
        if i + 1 < len(writes):
            loop.call_at(t0 + (i + 1) * tpot_s, self.step, loop, writes, t0, tpot_s, i + 1)
            return
        self.finished()

    def step_held(
        self,
        loop: asyncio.AbstractEventLoop,
        parts: tuple[bytes, bytes, bytes],
        tpot_s: float,
        i: int,
        hold: bytes,
        until: float,
    ) -> None:
        if not self.busy or self.t.is_closing():
            return
        if i and (hold in Engine.released or loop.time() >= until):
            self.t.write(parts[2])
            self.finished()
            return
        self.t.write(parts[0] if i == 0 else parts[1])
        loop.call_later(max(tpot_s, 0.001), self.step_held, loop, parts, tpot_s, i + 1, hold, until)

    def finished(self) -> None:
        self.busy = False
        STATS["active_streams"] -= 1
        self.last = time.monotonic()
        if self.close_after:
            self.t.close()
        elif self.buf:
            self.process()


async def reap_idle(keepalive_s: float) -> None:
    """Close connections idle for keepalive_s (one sweep a second, no timer per request)."""
    while True:
        await asyncio.sleep(1.0)
        cutoff = time.monotonic() - keepalive_s
        for c in [c for c in Engine.conns if not c.busy and not c.buf and c.last < cutoff]:
            c.t.close()


# a coding agent's model window (128k): with 8,192 the agent-sized request (~18k tokens estimated, bounds 4.5k to
# 74k) was ambiguous for the window, and the gateway asked the engine's /tokenize (404 here) on every request
MODELS = http_response(
    json.dumps(
        {
            "object": "list",
            "data": [{"id": MODEL, "object": "model", "created": CREATED, "owned_by": "fake", "max_model_len": 131072}],
        }
    ).encode()
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", default="9100", help="port, or comma-separated ports (all served by this process)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per answer when the request sets no max_tokens")
    ap.add_argument("--max-tokens-cap", type=int, default=4096)
    ap.add_argument("--tpot-ms", type=float, default=1.0, help="delay between stream tokens (0: all in one write)")
    ap.add_argument("--ttft-ms", type=float, default=0.0, help="delay before the first token of a stream")
    ap.add_argument("--max-hold-s", type=float, default=900.0, help="a held stream ends after this anyway")
    ap.add_argument("--keepalive-s", type=float, default=0.0, help="close idle connections after this (0: never)")
    ap.add_argument("--no-uvloop", action="store_true")
    a = ap.parse_args()
    Engine.cfg = a
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ports = [int(p) for p in a.port.split(",")]

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        servers = [await loop.create_server(Engine, a.host, p, backlog=8192) for p in ports]
        reaper = loop.create_task(reap_idle(a.keepalive_s)) if a.keepalive_s > 0 else None
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):  # also when started with SIGINT ignored (background jobs)
            loop.add_signal_handler(sig, stop.set)
        print(
            f"fake_engine on {a.host}:{','.join(map(str, ports))} tokens={a.tokens} tpot={a.tpot_ms}ms "
            f"ttft={a.ttft_ms}ms keepalive={a.keepalive_s}s fds={resource.getrlimit(resource.RLIMIT_NOFILE)[0]}",
            flush=True,
        )
        await stop.wait()  # the servers serve from create_server on
        for s in servers:
            s.close()
        if reaper is not None:
            reaper.cancel()

    try:
        if a.no_uvloop:
            asyncio.run(serve())
        else:
            import uvloop

            uvloop.run(serve())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
