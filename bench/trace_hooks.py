"""Instructions per call of each tracing hook and of the OTLP encoding of each span, counted by callgrind: where the
CPU that tracing at 100 % sampling adds to a request goes (issue 40), one piece at a time.

bench/whole_instructions.py counts the whole gateway (every thread) and gives the ratio the issue reads; this splits
what it adds into its parts, with no server: observability/tracing.py's hooks on a request of the bench's shape
(RequestRecord of a whole chat answer, one attempt), as the gateway calls them (`begin` in http/asgi.py, `attempt`
in service/request.py, `inject` in service/pipeline.py, `attempt_end` when the attempt's slot is freed, `answered`
with the reasons the adapter read, `end` from the record), and, for a checkout whose export thread encodes spans
from tuples, otlp.Encoder.span of the request's SERVER and CLIENT spans (where the hooks write the spans' bytes
themselves, `attempt_end` and `end` include that, and the encode pieces are not counted). Each piece runs `--calls`
times in a process under `valgrind --tool=callgrind` and once with none; the difference over `--calls` is its
instructions per call, less the harness loop's (`noop`).

    PYTHONPATH=. .venv/bin/python bench/trace_hooks.py [--calls 5000] [--only begin,end]
    ... --gateway-dir ../other-checkout     # that checkout's llm_gateway (an A/B: run both)
"""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
PIECES = ("noop", "begin", "attempt", "inject", "attempt_end", "answered", "end", "encode_server", "encode_client")
_TOTAL = re.compile(rb"^(?:summary|totals):\s+(\d+)", re.M)
#: a whole answer as the gateway sends it for the bench's request (bench/fake_engine.py's, 64 tokens)
ANSWER = {
    "id": "chatcmpl-fake0123456789",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "fake-model",
    "system_fingerprint": None,
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": " ".join(["lorem", "ipsum", "dolor", "sit"] * 16)},
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    ],
    "usage": {"prompt_tokens": 42, "completion_tokens": 64, "total_tokens": 106},
}


class _Backend:
    class cfg:  # the shape routing/table.py's backend has
        url = "http://127.0.0.1:8001"

    kind = "vllm"
    name = "fake-a"


class _Deployment:
    backend = _Backend()
    upstream_model = "fake-model"


class _Route:
    class cfg:
        strategy = "least_load"

    name = "fake-model"


class _Ticket:
    priority = 1


class _Attempt:
    deployment = _Deployment()
    route = _Route()
    ticket = _Ticket()


class _NoSender:
    def send(self, body: bytes) -> None:
        pass

    def close(self) -> None:
        pass


def pieces() -> dict[str, Callable[[], object]]:
    """Each piece as a call on one request's objects (made here, in the process that counts)."""
    import orjson

    from llm_gateway.observability.record import RequestRecord
    from llm_gateway.observability.tracing import Tracing
    from llm_gateway.settings import TracingConfig

    tracing = Tracing(TracingConfig(enabled=True, endpoint="http://127.0.0.1:9", sampling_ratio=1.0))
    tracing.batcher.shutdown()  # its thread stopped: spans are kept here, encoded by the encode_* pieces
    tracing.batcher.sender = _NoSender()
    spans: list[Any] = []
    tracing.emit = spans.append
    if hasattr(tracing, "spans"):  # a checkout whose hooks append to the queue themselves while it has room
        tracing.spans, tracing.room = spans, 1 << 30
    rec = RequestRecord("0123456789abcdef01234567", time.perf_counter(), "POST", "/v1/chat/completions", "chat")
    rec.model, rec.backend, rec.engine, rec.upstream_model, rec.key = "fake-model", "fake-a", "vllm", "fake-model", "k"
    rec.attempts, rec.status, rec.prompt_tokens, rec.completion_tokens = 1, 200, 42, 64
    trace = tracing.begin(rec, {b"content-type": b"application/json"})
    attempt, body = _Attempt(), {"messages": []}
    attempt_trace = trace.attempt(attempt, rec, body)
    attempt_trace.end()
    answer = orjson.dumps(ANSWER)
    if len(inspect.signature(trace.answered).parameters) > 1:  # the reasons as the adapter read them
        answered: Callable[[], object] = lambda: trace.answered(answer, ["length"])  # noqa: E731
    else:  # a checkout before CallContext.finish_reasons: the answer's bytes read
        answered = lambda: trace.answered(answer)  # noqa: E731
    answered()
    trace.end(rec)
    client, server = spans[-2], spans[-1]
    enc = tracing.batcher.encoder
    written = isinstance(server, bytes)  # the hooks write the spans' bytes: nothing left to encode
    if not written:
        enc.span(server), enc.span(client)

    def attempt_again() -> object:
        trace._attempts = 0  # each call the request's first attempt (its span's name and values kept)
        return trace.attempt(attempt, rec, body)

    def bounded(f: Callable[[], object]) -> Callable[[], object]:
        def call() -> object:
            if len(spans) > 512:
                spans.clear()
            return f()

        return call

    return {
        "noop": bounded(lambda: None),
        "begin": bounded(lambda: tracing.begin(rec, {})),
        "attempt": bounded(attempt_again),
        "inject": bounded(lambda: attempt_trace.inject({})),
        "attempt_end": bounded(attempt_trace.end),
        "answered": bounded(answered),
        "end": bounded(lambda: trace.end(rec)),
        "encode_server": bounded(lambda: None if written else enc.span(server)),
        "encode_client": bounded(lambda: None if written else enc.span(client)),
    }


def child(piece: str, calls: int) -> None:
    """Under callgrind: `calls` calls of `piece` after 50 warm ones."""
    f = pieces()[piece]
    for _ in range(50):
        f()
    for _ in range(calls):
        f()


def count(piece: str, calls: int, gateway_dir: Path, out: Path) -> int:
    dump = out / f"cg.{piece}.{calls}"
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": f"{gateway_dir}{os.pathsep}{BENCH.parent}"}
    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={dump}", sys.executable, __file__]
    subprocess.run([*cmd, "--child", piece, "--calls", str(calls)], env=env, check=True, capture_output=True)
    m = _TOTAL.search(dump.read_bytes())
    if m is None:
        raise RuntimeError(f"{piece}: no instruction count in {dump}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--only", default="", help=f"comma list of: {', '.join(PIECES[1:])}")
    ap.add_argument("--gateway-dir", default=str(BENCH.parent), help="the checkout whose llm_gateway runs")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        child(a.child, a.calls)
        return
    if shutil.which("valgrind") is None:
        sys.exit("bench: valgrind missing (apt-get install valgrind)")
    chosen = ["noop", *(p for p in (a.only.split(",") if a.only else PIECES[1:]) if p)]
    for p in chosen:
        if p not in PIECES:
            ap.error(f"unknown piece {p!r}: one of {', '.join(PIECES[1:])}")
    gw = Path(a.gateway_dir).resolve()
    with tempfile.TemporaryDirectory(prefix="trace-hooks-") as tmp:
        out = Path(tmp)
        per = {p: (count(p, a.calls, gw, out) - count(p, 0, gw, out)) / a.calls for p in chosen}
    loop = per.pop("noop")
    print(f"**Instructions per call (callgrind), {a.calls} calls each, the harness loop's {loop:,.0f} taken off;")
    print(f"gateway from {a.gateway_dir}**\n\n| piece | instructions / call |\n|---|---|")
    for p, n in per.items():
        print(f"| {p} | {n - loop:,.0f} |")


if __name__ == "__main__":
    main()
