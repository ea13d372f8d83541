"""Anthropic's Messages API on the wire, written once for the translation (dialects/anthropic/) and the
pass-through of an engine that serves it natively (adapters/anthropic_native.py): its error types and
envelope, its message ids, its usage object, its SSE frames.

Errors: `{"type": "error", "error": {"type", "message"}, "request_id"}` with Anthropic's statuses: 400
invalid_request_error, 401 authentication_error, 403 permission_error, 404 not_found_error, 413
request_too_large, 429 rate_limit_error, 529 overloaded_error for the gateway's "cannot take it now"
errors (queue full, no healthy backend, unavailable, an engine that is busy), 504 timeout_error, and
api_error for the other server-side failures (their status kept: 500, 502). One table, `_type_of_status`,
read three ways: a gateway error before the answer started (`error_status`: the HTTP status and type),
the same error after it (`error_frame`: an `event: error`, translated or native), and the error object of
an OpenAI error event (`error_type_of`: what the service writes when a queued stream's wait fails), whose
code finds its status in the gateway's own error tree (errors.py), where each code is defined once.

Ids: a message id is `msg_` + the engine's id without OpenAI's `chatcmpl-` (kept as it is when it is a
`msg_` id already; a fresh one when the engine gave none); a tool use without an id gets `toolu_` + random.

Usage: Anthropic counts the prompt in three parts: `input_tokens` without the cached prompt tokens, which
are `cache_read_input_tokens` (and `cache_creation_input_tokens`, which the engines never report). The
gateway bills the whole prompt, so `anthropic_usage` of an OpenAI usage object and `usage_of` of an
Anthropic one are each other's inverse on what is billed.
"""

from __future__ import annotations

import os
from typing import Any, Final

import orjson

from llm_gateway.errors import EngineErrorAnswer, GatewayError, NoHealthyBackend, Overloaded, ServiceUnavailable
from llm_gateway.types import Usage

OVERLOADED: Final = 529
PING: Final = b'event: ping\ndata: {"type":"ping"}\n\n'
STOP: Final = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def frame(name: bytes, obj: dict[str, Any]) -> bytes:
    """One event of Anthropic's stream: `event: NAME` and its data."""
    return b"event: " + name + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


# -- errors ----------------------------------------------------------------------------------------------


def _type_of_status(status: int) -> tuple[int, str]:
    """Anthropic's (status, error type) for an HTTP status of the gateway's."""
    if status == 401:
        return status, "authentication_error"
    if status == 403:
        return status, "permission_error"
    if status == 404:
        return status, "not_found_error"
    if status == 413:
        return status, "request_too_large"
    if status == 429:
        return status, "rate_limit_error"
    if status == 503:
        return OVERLOADED, "overloaded_error"
    if status == 504:
        return status, "timeout_error"
    if 400 <= status < 500:
        return status, "invalid_request_error"
    return status, "api_error"


def error_status(e: GatewayError) -> tuple[int, str]:
    """The HTTP status and Anthropic error type for a gateway error."""
    if isinstance(e, (Overloaded, NoHealthyBackend, ServiceUnavailable)) or (
        isinstance(e, EngineErrorAnswer) and e.busy
    ):
        return OVERLOADED, "overloaded_error"
    return _type_of_status(e.status)


def envelope(etype: str, message: str, rid: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "error", "error": {"type": etype, "message": message}}
    if rid is not None:
        out["request_id"] = rid
    return out


def error_answer(e: GatewayError, rid: str) -> tuple[int, bytes]:
    """(status, body) of the Anthropic answer to a gateway error."""
    status, etype = error_status(e)
    return status, orjson.dumps(envelope(etype, e.message, rid))


def error_frame(e: GatewayError) -> bytes:
    """A failure after the stream's first byte as Anthropic's `event: error` (nothing follows it)."""
    return frame(b"error", envelope(error_status(e)[1], e.message))


def _codes() -> dict[str, int]:
    """Each code of the gateway's error tree (errors.py) with its status: where a code is defined."""
    out: dict[str, int] = {}
    todo = [GatewayError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__module__ == GatewayError.__module__ and cls.code is not None:
            out.setdefault(cls.code, cls.status)
    return out


_STATUS_OF_CODE: Final = _codes()
#: the `type`s of OpenAI's envelope that say a status where the code does not (a rate limit's
#: `requests`/`tokens`, an engine's own code under `invalid_request_error`)
_STATUS_OF_TYPE: Final = {"invalid_request_error": 400, "permission_error": 403, "requests": 429, "tokens": 429}
_OVERLOADED_TYPES: Final = frozenset({"server_overloaded", "service_unavailable"})
_OVERLOADED_CODES: Final = frozenset(
    c for c, s in _STATUS_OF_CODE.items() if s == 503 or c == Overloaded.code
)  # the codes `error_status` calls overloaded by their class


def error_type_of(err: dict[str, Any]) -> str:
    """The Anthropic error type for the `error` object of an OpenAI envelope (the service's own error event
    in a stream, where no status is left to go by): the type `error_status` gives the error it came from."""
    code, etype = err.get("code"), err.get("type")
    if code in _OVERLOADED_CODES or etype in _OVERLOADED_TYPES:
        return "overloaded_error"
    status = _STATUS_OF_CODE.get(code) if isinstance(code, str) else None
    if status is None:
        status = _STATUS_OF_TYPE.get(etype) if isinstance(etype, str) else None
    return _type_of_status(status)[1] if status is not None else "api_error"


# -- ids -------------------------------------------------------------------------------------------------


def message_id(engine_id: Any) -> str:
    """Anthropic's `msg_` id for the engine's completion or message id."""
    if isinstance(engine_id, str) and engine_id:
        return engine_id if engine_id.startswith("msg_") else "msg_" + engine_id.removeprefix("chatcmpl-")
    return "msg_" + os.urandom(12).hex()


def tool_use_id() -> str:
    """A `toolu_` id for a tool call the engine gave none."""
    return "toolu_" + os.urandom(12).hex()


# -- usage -----------------------------------------------------------------------------------------------


def anthropic_usage(u: Any) -> dict[str, int]:
    """Anthropic's usage for an OpenAI usage object: the cached prompt tokens are cache reads."""
    prompt = completion = cached = 0
    if isinstance(u, dict):
        p, c = u.get("prompt_tokens"), u.get("completion_tokens")
        prompt = p if isinstance(p, int) else 0
        completion = c if isinstance(c, int) else 0
        details = u.get("prompt_tokens_details")
        if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
            cached = min(details["cached_tokens"], prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": completion,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def usage_of(u: Any) -> Usage | None:
    """What an Anthropic usage object bills: the prompt is `input_tokens` and the cached parts Anthropic
    counts apart; None without `output_tokens`."""
    if not isinstance(u, dict):
        return None
    out = u.get("output_tokens")
    if not isinstance(out, int):
        return None
    parts = [u.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")]
    return Usage(sum(p for p in parts if isinstance(p, int)), out)
