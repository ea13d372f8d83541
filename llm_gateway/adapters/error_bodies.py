"""Reading engine error bodies of every shape, and turning them into the OpenAI envelope.

Shapes seen in the engines' sources and captures: nested `{"error": {message, type, code}}`
(llama-server, vLLM, OpenAI), `{"error": "Unauthorized"}` (vLLM, SGLang auth), `{"error": "..."}`
(Ollama native, MLX), `{"error": ..., "error_type": ...}` (TGI), flat `{"object": "error", "message",
...}` (SGLang, LMDeploy, TRT-LLM, old vLLM), FastAPI `{"detail": "..."}` or a validation list
(TabbyAPI), and bodies that are not JSON at all (HTML pages, empty 403s).

A body of none of these shapes (`EngineError.well_formed` False: an HTML page from a proxy in front of
the engine, an empty body, a crashed server's text, JSON of an unknown shape) says the engine is broken,
not what went wrong: with a 5xx it is the documented 502 (README: "502 engine unreachable or broken"),
whatever the 5xx was, and no adapter reads a hint about the request into its made-up message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from llm_gateway.errors import EngineErrorAnswer, UpstreamProtocolError

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_exceeded",
}


@dataclass(slots=True)
class EngineError:
    message: str
    type: str | None = None
    code: str | None = None
    param: str | None = None
    #: the body was an error of a known shape; False: the message is the gateway's description of the body
    well_formed: bool = field(default=True, compare=False)


def parse_error_body(body: bytes, content_type: str = "") -> EngineError:
    text = body[:65536]
    try:
        data: Any = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        return _from_mapping(data)
    if not body.strip():
        return EngineError("the engine answered with an empty body", well_formed=False)
    if "html" in content_type or body.lstrip()[:1] == b"<":
        return EngineError("the engine answered with an HTML page instead of JSON", well_formed=False)
    snippet = body[:200].decode("utf-8", "replace").strip().replace("\n", " ")
    return EngineError(snippet, well_formed=False)


def _from_mapping(data: dict[str, Any]) -> EngineError:
    err = data.get("error")
    if isinstance(err, dict):
        return EngineError(
            _text(err.get("message")) or "engine error",
            _str_or_none(err.get("type")),
            _str_or_none(err.get("code")),
            _str_or_none(err.get("param")),
        )
    if isinstance(err, str):
        return EngineError(err or "engine error", _str_or_none(data.get("error_type")))
    if "detail" in data:
        return EngineError(_detail(data["detail"]))
    if "message" in data:
        return EngineError(
            _text(data.get("message")) or "engine error",
            _str_or_none(data.get("type")),
            _str_or_none(data.get("code")),
            _str_or_none(data.get("param")),
        )
    return EngineError("engine error: " + orjson.dumps(data)[:200].decode("utf-8", "replace"), well_formed=False)


def _detail(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):  # FastAPI validation errors
        parts = []
        for item in detail[:5]:
            if isinstance(item, dict):
                loc = ".".join(str(x) for x in item.get("loc", ()) if x != "body")
                parts.append(f"{loc}: {item.get('msg', '')}" if loc else str(item.get("msg", "")))
        return "; ".join(parts) or "invalid request"
    return _text(detail) or "engine error"


def _text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if v is None:
        return ""
    return orjson.dumps(v)[:500].decode("utf-8", "replace")


def _str_or_none(v: Any) -> str | None:
    if v is None or isinstance(v, bool):
        return None
    return str(v)


def upstream_error(
    backend: str,
    kind: str,
    status: int,
    err: EngineError,
    *,
    retryable: bool | None = None,
    client_error: bool | None = None,
    busy: bool = False,
) -> EngineErrorAnswer:
    """The envelope for an engine's error. 401/403 from an engine mean *the gateway's* engine key is
    wrong, so the client gets 502, not an auth error about its own key. A 5xx keeps its status when the
    engine said what failed in an error body, and is a 502 when it did not (`EngineError.well_formed`);
    either way it is retried as its own status says (`retryable`)."""
    where = f"backend '{backend}' ({kind})"
    if status in (401, 403):
        return EngineErrorAnswer(
            f"{where} rejected the gateway's credentials (check backends[].api_key): {err.message}",
            status=502,
            code="upstream_auth_failed",
            retryable=True,
            backend=backend,
        )
    if client_error or (client_error is None and 400 <= status < 500):
        out_status = 400 if status in (422, 500) else status
        return EngineErrorAnswer(
            f"{err.message} ({where})",
            busy=status == 429,
            status=out_status,
            type_=_TYPE_BY_STATUS.get(out_status, "invalid_request_error"),
            code=None if err.code is None or err.code.isdigit() else err.code,
            param=err.param,
            retryable=bool(retryable),
            backend=backend,
        )
    if retryable is None:
        retryable = status in (502, 503, 504)
    return EngineErrorAnswer(
        f"{where} failed: {err.message}",
        busy=busy,
        status=status if 500 <= status < 600 and err.well_formed else 502,
        type_="upstream_error",
        code=err.code if err.code and not err.code.isdigit() else "upstream_error",
        retryable=retryable,
        backend=backend,
    )


def json_object(body: bytes, backend: str, kind: str) -> dict[str, Any]:
    """A 2xx engine body that must be a JSON object (an HTML page or a cut body is a protocol error)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError(
            f"backend '{backend}' ({kind}) answered 2xx with a body that is not JSON", backend=backend
        ) from None
    if not isinstance(obj, dict):
        raise UpstreamProtocolError(
            f"backend '{backend}' ({kind}) answered 2xx with JSON that is not an object", backend=backend
        )
    return obj
