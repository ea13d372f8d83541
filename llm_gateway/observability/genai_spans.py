"""What tracing.py's spans say and read, apart from how they are made: the GenAI semantic conventions' operation
names, the attribute keys whose values recur from request to request (otlp.Span's fixed keys, encoded once per
values), those each span has of its own (by position), those whose values are each span's alone (never kept), the
finish reasons found in an answer's bytes (and an answer's one told reason as a span's, kept),
what `capture_content` puts on a span, and the two Protocols by which a trace reads a request's record and an
attempt (which sit above this layer).
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import orjson

#: GenAI operation names (gen_ai.operation.name) of the gateway's endpoints
OPERATIONS = {
    "chat": "chat",
    "messages": "chat",
    "responses": "chat",
    "completions": "text_completion",
    "embeddings": "embeddings",
}
#: an answer's or a stream event's finish reason: OpenAI's finish_reason, Anthropic's stop_reason, a Response's
#: incomplete_details.reason, or a Responses stream's last event (response.completed / response.failed)
FINISH_REASON = re.compile(
    rb'"(?:finish_reason|stop_reason)"\s*:\s*"([a-z_]{1,32})"'
    rb'|"incomplete_details"\s*:\s*\{\s*"reason"\s*:\s*"([a-z_]{1,32})"'
    rb'|"type"\s*:\s*"response\.(completed|failed)"'
)
#: FINISH_REASON's first alternative, begun only where a match can begin: at the `re` of `reason"` (a literal
#: prefix: the engine skips to it, where FINISH_REASON tries a match at every `"` of the JSON). Its second
#: alternative matches, as the empty string, a `"reason"` or a `"response.completed"`/`"response.failed"` that
#: FINISH_REASON's other alternatives begin around: where one is found, FINISH_REASON reads the bytes instead.
_FINISH_FAST = re.compile(
    rb're(?:ason"(?:(?<="finish_reason")|(?<="stop_reason"))\s*:\s*"([a-z_]{1,32})"'
    rb'|(?<="re)(?:ason"|sponse\.(?:completed|failed)"))'
)


def finish_reasons(data: bytes) -> list[bytes]:
    """The finish reasons in `data`, in order: what FINISH_REASON finds, at ~2.4x fewer instructions on an answer or
    a chat, messages or Responses delta event (one that FINISH_REASON's rarer alternatives may match: ~1.4x more)."""
    found: list[bytes] = _FINISH_FAST.findall(data)
    if b"" in found:
        return [a or b or c for a, b, c in FINISH_REASON.findall(data)]
    return found


#: a finish reason FINISH_REASON would find: what a reason told by an adapter must look like to be on a span too
_REASON_TEXT = re.compile(r"[a-z_]{1,32}")
_REASONS_SEEN: dict[str, bool] = {}  # a told reason -> does it look like one (they recur: at most 256 kept)


def is_reason(r: str) -> bool:
    """Would FINISH_REASON have found `r` as a finish reason (1-32 of a-z and _)? An adapter's reading of an answer
    tells the span its reasons (CallContext.finish_reasons), the same ones as FINISH_REASON in its bytes."""
    ok = _REASONS_SEEN.get(r)
    if ok is None:
        if len(_REASONS_SEEN) >= 256:
            _REASONS_SEEN.clear()
        ok = _REASONS_SEEN[r] = _REASON_TEXT.fullmatch(r) is not None
    return ok


#: a told reason -> the span's reasons when it is an answer's only one: (r,), or () where it does not look like one
#: (one_reason; at most 256 kept)
ONE_REASON: dict[str, tuple[str, ...]] = {}


def one_reason(r: str) -> tuple[str, ...]:
    """An answer's only told reason as its span's reasons: (r,) where it looks like one (is_reason), else ()."""
    if len(ONE_REASON) >= 256:
        ONE_REASON.clear()
    one = ONE_REASON[r] = (r,) if is_reason(r) else ()
    return one


#: the attributes whose values recur from request to request, as otlp.Span's fixed keys (encoded once per values)
SERVER_KEYS = (
    "http.request.method",
    "url.path",
    "gen_ai.operation.name",
    "gen_ai.request.model",
    "gen_ai.response.model",
    "gateway.deployment",
    "gateway.engine",
    "gateway.key.name",  # the name: never the key itself
    "gateway.priority_class",
    "gateway.stream",
    "gateway.attempts",
    "gateway.retries",
    "gateway.outcome",
    "gateway.cancelled",
    "http.response.status_code",
    "error.type",
)
CLIENT_KEYS = (
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "server.address",
    "server.port",
    "gateway.deployment",
    "gateway.engine",
    "gateway.model",
    "gateway.routing.strategy",
    "gateway.attempt",
    "gateway.priority_class",
)
QUEUE_KEYS = ("gateway.priority_class",)
#: the attributes whose values are each span's own (otlp.Span's own keys, by position): the request's span's (in
#: this order after its fixed ones, as RequestTrace.end writes them), a failed attempt's, a queue wait's
SERVER_OWN_KEYS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.response.finish_reasons",
    "gateway.request_id",
    "gateway.queue_wait_s",
    "gateway.ttft_s",
    "gateway.usage_estimated",
)
FAILURE_KEYS = ("error.type", "http.response.status_code", "gateway.retryable")
QUEUE_OWN_KEYS = ("gateway.queue_wait_s",)
#: the attributes whose values differ from span to span (otlp.Encoder's `unique`: written as they come, never kept)
UNIQUE_KEYS = (
    "gateway.request_id",
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
)
CONTENT_LIMIT = 64 * 1024  # characters of a prompt or an answer put on a span (capture_content)


class RequestRecord(Protocol):
    """What a trace reads of a request's record (record.py's `RequestRecord`, which holds the trace)."""

    rid: str
    t0: float
    method: str
    path: str
    endpoint: str
    key: str
    model: str
    backend: str
    engine: str
    upstream_model: str | None
    stream: bool
    status: int
    outcome: str
    prompt_tokens: int | None
    completion_tokens: int | None
    usage_estimated: bool
    ttft_s: float | None
    attempts: int
    waited_s: float
    error: str | None


class TracedAttempt(Protocol):
    """What a trace reads of an attempt (routing/attempt.py's `Attempt`, which sits above this layer)."""

    @property
    def deployment(self) -> Any: ...

    @property
    def route(self) -> Any: ...

    @property
    def ticket(self) -> Any: ...


def capture_input(attrs: dict[str, Any], body: dict[str, Any]) -> None:
    for field in ("messages", "input", "prompt"):
        value = body.get(field)
        if value is not None:
            attrs["gen_ai.input.messages"] = orjson.dumps(value).decode()[:CONTENT_LIMIT]
            system = body.get("system") or body.get("instructions")
            if isinstance(system, str):
                attrs["gen_ai.system_instructions"] = system[:CONTENT_LIMIT]
            return
