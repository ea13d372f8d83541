"""The gateway's one error hierarchy.

Every error the gateway produces itself is a `GatewayError`: it knows its HTTP status and renders
once, as the OpenAI envelope `{"error": {"message", "type", "param", "code"}}`. Foreign exceptions
(aiohttp, httpx, redis, engine error bodies) are translated into these where they enter.
Messages never carry secrets: callers pass names (key name, backend name), never key material.

The tree says what each error means, so that callers branch on classes, never on message text:

    GatewayError                      answered to the client in the OpenAI envelope
    ├── InvalidRequest                the client's request is at fault (400)
    │   └── InvalidJSON
    ├── AuthenticationFailed (401), PermissionDenied (403), ModelNotFound, RouteNotFound (404),
    │   MethodNotAllowed (405), RequestTimeout (408), PayloadTooLarge (413),
    │   UnsupportedMediaType (415), RateLimited (429)
    │                                 the rest of the client's faults (or its limits)
    ├── Overloaded (429), NoHealthyBackend (503)
    │                                 the gateway cannot take the request now
    ├── ServiceUnavailable (503)      likewise, for a reason it names (draining, a store down)
    │   └── DatabaseUnavailable
    ├── Conflict, NotFound            the admin API's (llm_gateway/admin/errors.py)
    └── UpstreamError                 anything that went wrong on a backend's side of the call
        ├── EngineErrorAnswer         the engine answered with an error (status, busy; retryable
        │   │                         when busy or by status, as the adapter decides)
        │   └── ChargedError          one that ended a generation which spent tokens, with its usage
        │                             (llm_gateway/adapters/relay_base.py: it carries `types.Usage`)
        └── BackendFailure            the backend's fault: another backend may succeed (retryable)
            ├── UpstreamUnreachable   no answer: the connection closed before one, bad URL
            │   └── ConnectFailed     the TCP connection could not be made: the backend is down
            ├── UpstreamTimeout
            ├── UpstreamProtocolError
            ├── StreamInterrupted
            └── AdapterLoadFailed     the engine would not load a LoRA adapter (routing/lora.py)

`retryable` (another backend could succeed where this one failed) is a class attribute where it is
constant, and an instance attribute on `EngineErrorAnswer`, where the adapter decides it per answer.
`DONE`, the SSE end-of-stream event, lives here beside `GatewayError.sse_event` because every
error event in a stream is followed by it.
"""

from __future__ import annotations

from typing import Any

import orjson

DONE = b"data: [DONE]\n\n"


class GatewayError(Exception):
    """Base: an error answered to the client in the OpenAI envelope."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    #: True when another backend could succeed where this one failed (the backend's fault)
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        status: int | None = None,
        type_: str | None = None,
        headers: dict[str, str] | None = None,
        backend: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if type_ is not None:
            self.type = type_
        self.headers: dict[str, str] = headers or {}
        self.backend = backend

    def envelope(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.envelope())

    def sse_event(self) -> bytes:
        """The error as one SSE event, for errors after the first byte of a stream."""
        return b"data: " + self.body() + b"\n\n"


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class InvalidJSON(InvalidRequest):
    code = "invalid_json"


class AuthenticationFailed(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class ModelNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(GatewayError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class RateLimited(GatewayError):
    """429 from a key's limits; `type` is "requests" or "tokens" as OpenAI sends it."""

    status = 429
    type = "requests"
    code = "rate_limit_exceeded"


class Overloaded(GatewayError):
    """429: every candidate deployment is at max_concurrency and its wait queue is full."""

    status = 429
    type = "server_overloaded"
    code = "queue_full"


class NoHealthyBackend(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "no_healthy_backend"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "service_unavailable"
    code = "service_unavailable"


class DatabaseUnavailable(ServiceUnavailable):
    """The gateway's own database (stored responses) cannot be reached, or did not answer in time."""

    code = "database_unavailable"


class UpstreamError(GatewayError):
    """Anything that went wrong on a backend's side of the call: its answer, or getting one."""

    type = "upstream_error"


class EngineErrorAnswer(UpstreamError):
    """An engine answered with an error; status and message come from its (normalised) body."""

    def __init__(self, message: str, *, retryable: bool = False, busy: bool = False, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retryable = retryable
        #: the engine is alive but saturated (queue full): retry elsewhere, not a breaker failure
        self.busy = busy


class BackendFailure(UpstreamError):
    """The backend failed to give a proper answer: its fault, so another backend may succeed."""

    status = 502
    retryable = True


class UpstreamUnreachable(BackendFailure):
    """No answer came: the connection closed before one, or the engine URL is unusable."""

    code = "upstream_unreachable"


class ConnectFailed(UpstreamUnreachable):
    """The TCP connection to the engine could not be made (refused, no route): the backend is down."""


class UpstreamProtocolError(BackendFailure):
    """The engine sent something that is not what its protocol promises (HTML, truncated JSON)."""

    code = "upstream_bad_response"


class UpstreamTimeout(BackendFailure):
    status = 504
    code = "upstream_timeout"


class StreamInterrupted(BackendFailure):
    """The upstream stream ended abnormally after the first byte reached the client."""

    code = "stream_interrupted"


class AdapterLoadFailed(BackendFailure):
    """The engine refused or failed to load the LoRA adapter a request asked for (another replica may load it)."""

    code = "adapter_load_failed"
