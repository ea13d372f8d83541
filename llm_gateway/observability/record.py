"""One record per request, filled along the way and turned into metrics and an access-log line at
the end: the single place where a request's outcome is counted, so nothing is counted twice.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from llm_gateway.observability.logs import AccessLog
from llm_gateway.observability.metrics import Metrics, inc, observe

if TYPE_CHECKING:
    from llm_gateway.observability.tracing import RequestTrace

UNKNOWN = "unknown"
NONE = "none"


@dataclass(slots=True)
class RequestRecord:
    rid: str
    t0: float  # perf_counter at arrival
    method: str
    path: str
    endpoint: str = "other"
    key: str = NONE  # the key's name (a label)
    key_id: str = NONE  # the key's id (its identity)
    model: str = UNKNOWN
    backend: str = NONE
    engine: str = NONE
    upstream_model: str | None = None
    stream: bool = False
    status: int = 0
    outcome: str = "success"
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    usage_estimated: bool = False
    ttft_s: float | None = None
    attempts: int = 0
    waited_s: float = 0.0
    upstream_s: float = 0.0
    overhead_s: float | None = None
    error: str | None = None
    #: while a stream is relayed: its (prompt, completion) tokens so far, estimated (the ledger's crash checkpoint)
    live: Callable[[], tuple[int, int]] | None = None
    #: counted against the key's limits already (admitted by the limiter): a refusal after that is not
    #: metered again (http/asgi.py meters the ones before it)
    metered: bool = False
    #: its OpenTelemetry span and its attempts' (observability/tracing.py); None: tracing is off or not this request
    trace: RequestTrace | None = None


def outcome_of(status: int, error_code: str | None) -> str:
    if status < 400:
        return "success"
    if status in (401, 403):
        return "auth_error"
    if status == 429:
        return "overloaded" if error_code == "queue_full" else "rate_limited"
    if status == 499:
        return "cancelled"
    if status == 504:
        return "timeout"
    if status == 503:
        return "unavailable"
    if status >= 500:
        return "upstream_error" if error_code and error_code.startswith(("upstream", "stream")) else "error"
    return "client_error"


class UsageSink(Protocol):
    """The usage ledger and recent activity (observability/ledger.py): one non-blocking call per request
    (every request, "other" endpoints too: it tracks the requests in flight)."""

    def record(self, rec: RequestRecord, duration_s: float) -> None: ...


def finish_record(metrics: Metrics, access: AccessLog, rec: RequestRecord, usage: UsageSink | None = None) -> None:
    duration = time.perf_counter() - rec.t0
    trace = rec.trace
    if trace is not None:
        trace.end(rec)
    if usage is not None:
        usage.record(rec, duration)
    if rec.endpoint == "other":  # health, metrics, models listing: not counted as traffic
        return
    sc = f"{rec.status // 100}xx" if rec.status else "none"
    child = metrics.child
    inc(child(metrics.requests, rec.model, rec.backend, rec.engine, rec.endpoint, sc, rec.outcome))
    if rec.backend != NONE:
        observe(child(metrics.duration, rec.model, rec.backend, rec.endpoint), duration)
        if rec.prompt_tokens is not None and rec.prompt_tokens > 0:
            inc(child(metrics.prompt_tokens, rec.model, rec.backend), rec.prompt_tokens)
        if rec.completion_tokens is not None and rec.completion_tokens > 0:
            inc(child(metrics.completion_tokens, rec.model, rec.backend), rec.completion_tokens)
    overhead = rec.overhead_s
    if overhead is None:
        overhead = max(0.0, duration - rec.upstream_s - rec.waited_s)
    observe(child(metrics.overhead, rec.endpoint), overhead)
    if access.enabled:
        fields: dict[str, Any] = {
            "request_id": rec.rid,
            "method": rec.method,
            "path": rec.path,
            "key": rec.key,
            "model": rec.model,
            "backend": rec.backend,
            "engine": rec.engine,
            "stream": rec.stream,
            "status": rec.status,
            "outcome": rec.outcome,
            "prompt_tokens": rec.prompt_tokens,
            "completion_tokens": rec.completion_tokens,
            "ttft_ms": None if rec.ttft_s is None else round(rec.ttft_s * 1000, 2),
            "duration_ms": round(duration * 1000, 2),
            "overhead_ms": round(overhead * 1000, 3),
            "attempts": rec.attempts,
        }
        if trace is not None:  # the trace beside the request id (observability/tracing.py)
            fields["trace_id"], fields["span_id"] = trace.ids
        if rec.usage_estimated:
            fields["usage_estimated"] = True
        if rec.error:
            fields["error"] = rec.error
        access.emit(fields)
