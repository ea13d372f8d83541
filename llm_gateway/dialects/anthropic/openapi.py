"""The OpenAPI description of Anthropic's Messages API as the gateway serves it (merged into
openapi.py's document): `POST /v1/messages` and `POST /v1/messages/count_tokens`.

It says exactly what `ingress/anthropic_request.py` accepts, so that a request valid by the document
is one the gateway takes and an invalid one is refused (tests/reliability/test_schemathesis.py):
unknown top-level fields are refused (`additionalProperties: false`, as Anthropic does), an explicit
null counts as an absent optional field, content blocks are told apart by `type` and may carry extra
keys. Errors are Anthropic's envelope.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.dialects.anthropic.options import EFFORTS, THINKING_DISPLAYS, TOOL_HINTS
from llm_gateway.dialects.anthropic.request import HINTS
from llm_gateway.dialects.field_checks import Hint

INT64 = {"type": "integer", "format": "int64"}
SECURITY: list[dict[str, list[str]]] = [{"apiKey": []}, {"bearer": []}]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _hint(hint: Hint) -> dict[str, Any]:
    """A hint the gateway checks for its type (or values), then ignores; null is allowed."""
    return _nullable({"enum": list(hint)} if isinstance(hint, tuple) else {"type": hint})


BOOL = _nullable({"type": "boolean"})


def _obj(required: list[str], properties: dict[str, Any], *, closed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "required": required, "properties": properties}
    if closed:
        out["additionalProperties"] = False
    return out


MODEL = {"type": "string", "minLength": 1, "description": "a model name or alias (GET /v1/models)"}
TEXT_BLOCK = _obj(["type", "text"], {"type": {"const": "text"}, "text": {"type": "string"}})
IMAGE_SOURCE = {
    "anyOf": [
        _obj(
            ["type", "media_type", "data"],
            {"type": {"const": "base64"}, "media_type": {"type": "string"}, "data": {"type": "string"}},
        ),
        _obj(["type", "url"], {"type": {"const": "url"}, "url": {"type": "string"}}),
    ]
}
IMAGE_BLOCK = _obj(["type", "source"], {"type": {"const": "image"}, "source": IMAGE_SOURCE})
DOCUMENT_BLOCK = _obj(
    ["type", "source"],
    {
        "type": {"const": "document"},
        "source": {
            "anyOf": [
                _obj(["type", "data"], {"type": {"const": "text"}, "data": {"type": "string"}}),
                _obj(
                    ["type", "content"],
                    {"type": {"const": "content"}, "content": {"type": "array", "items": TEXT_BLOCK}},
                ),
            ]
        },
    },
)
TOOL_RESULT_BLOCK = _obj(
    ["type", "tool_use_id"],
    {
        "type": {"const": "tool_result"},
        "tool_use_id": {"type": "string"},
        "content": _nullable(
            {
                "anyOf": [
                    {"type": "string"},
                    {"type": "array", "items": {"anyOf": [TEXT_BLOCK, IMAGE_BLOCK, DOCUMENT_BLOCK]}},
                ]
            }
        ),
        "is_error": BOOL,
    },
)
TOOL_USE_BLOCK = _obj(
    ["type", "id", "name", "input"],
    {"type": {"const": "tool_use"}, "id": {"type": "string"}, "name": {"type": "string"}, "input": {"type": "object"}},
)
THINKING_BLOCK = _obj(["type"], {"type": {"enum": ["thinking", "redacted_thinking"]}})


def _message(role: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    content = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"anyOf": blocks}}]}
    return _obj(["role", "content"], {"role": {"const": role}, "content": content})


MESSAGE = {
    "anyOf": [
        _message("user", [TEXT_BLOCK, IMAGE_BLOCK, DOCUMENT_BLOCK, TOOL_RESULT_BLOCK]),
        _message("assistant", [TEXT_BLOCK, TOOL_USE_BLOCK, THINKING_BLOCK]),
        _message("system", [TEXT_BLOCK]),
    ]
}
SYSTEM = _nullable({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_BLOCK}]})
TOOL = _obj(
    ["name", "input_schema"],
    {
        "type": _nullable({"const": "custom"}),
        "name": {"type": "string", "minLength": 1},
        "description": _nullable({"type": "string"}),
        "input_schema": {"type": "object"},
        "strict": BOOL,
        **{k: _hint(h) for k, h in TOOL_HINTS.items()},
    },
    closed=True,
)
TOOL_CHOICE = _nullable(
    {
        "anyOf": [
            _obj(["type"], {"type": {"enum": ["auto", "any"]}, "disable_parallel_tool_use": BOOL}, closed=True),
            _obj(["type"], {"type": {"const": "none"}}, closed=True),
            _obj(
                ["type", "name"],
                {"type": {"const": "tool"}, "name": {"type": "string"}, "disable_parallel_tool_use": BOOL},
                closed=True,
            ),
        ]
    }
)
THINKING = _nullable(
    {
        "anyOf": [
            _obj(
                ["type", "budget_tokens"],
                {
                    "type": {"const": "enabled"},
                    "budget_tokens": {**INT64, "minimum": 1024, "description": "checked, not enforced"},
                    "display": _hint(THINKING_DISPLAYS),
                },
                closed=True,
            ),
            _obj(["type"], {"type": {"const": "adaptive"}, "display": _hint(THINKING_DISPLAYS)}, closed=True),
            _obj(["type"], {"type": {"const": "disabled"}}, closed=True),
        ]
    }
)
OUTPUT_CONFIG = _nullable(
    _obj(
        [],
        {
            "effort": _hint(EFFORTS),
            "format": _nullable(
                _obj(["type", "schema"], {"type": {"const": "json_schema"}, "schema": {"type": "object"}})
            ),
        },
        closed=True,
    )
)
COMMON = {
    "model": MODEL,
    "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
    "system": SYSTEM,
    "tools": _nullable({"type": "array", "items": TOOL}),
    "tool_choice": TOOL_CHOICE,
    "thinking": THINKING,
    "output_config": OUTPUT_CONFIG,
    # hints and account attribution: checked for their type, then ignored
    **{k: _hint(h) for k, h in HINTS.items()},
}
SAMPLING = {
    "max_tokens": {**INT64, "minimum": 1},
    "stream": _nullable({"type": "boolean"}),
    "stop_sequences": _nullable({"type": "array", "items": {"type": "string"}}),
    "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    "top_k": _nullable({**INT64, "minimum": 0}),
    "metadata": _nullable(_obj([], {"user_id": _nullable({"type": "string"})}, closed=True)),
}
MESSAGES_REQUEST = {
    "type": "object",
    "required": ["model", "messages", "max_tokens"],
    "properties": {**COMMON, **SAMPLING},
    "additionalProperties": False,
}
COUNT_REQUEST = {
    "type": "object",
    "required": ["model", "messages"],
    # the sampling fields cannot change a count: checked as in a message, then unused
    "properties": {**COMMON, **SAMPLING, "max_tokens": _nullable(SAMPLING["max_tokens"])},
    "additionalProperties": False,
}

USAGE = _obj(
    ["input_tokens", "output_tokens"],
    {
        "input_tokens": {"type": "integer"},
        "output_tokens": {"type": "integer"},
        "cache_creation_input_tokens": {"type": "integer"},
        "cache_read_input_tokens": {"type": "integer"},
    },
)
MESSAGE_ANSWER = _obj(
    ["id", "type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"],
    {
        "id": {"type": "string"},
        "type": {"const": "message"},
        "role": {"const": "assistant"},
        "model": {"type": "string"},
        "content": {
            "type": "array",
            "items": {
                "anyOf": [
                    TEXT_BLOCK,
                    _obj(["type", "thinking"], {"type": {"const": "thinking"}, "thinking": {"type": "string"}}),
                    TOOL_USE_BLOCK,
                ]
            },
        },
        "stop_reason": {"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"]},
        "stop_sequence": {"type": ["string", "null"]},
        "usage": USAGE,
    },
)
ERROR = _obj(
    ["type", "error"],
    {
        "type": {"const": "error"},
        "error": _obj(["type", "message"], {"type": {"type": "string"}, "message": {"type": "string"}}),
        "request_id": {"type": "string"},
    },
)
EVENT = _obj(
    ["event", "data"],
    {
        "event": {
            "enum": [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
                "error",
            ]
        },
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": _obj(["type"], {"type": {"type": "string"}}),
        },
    },
)
HEADERS = [
    {"name": "anthropic-version", "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": "anthropic-beta", "in": "header", "required": False, "schema": {"type": "string"}},
    {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string"}},
]
EXAMPLE = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]}


def _error() -> dict[str, Any]:
    return {"description": "an error, in Anthropic's envelope", "content": {"application/json": {"schema": ERROR}}}


def anthropic_paths() -> dict[str, Any]:
    messages = {
        "post": {
            "operationId": "createMessage",
            "summary": "Anthropic Messages: a message, whole or (with stream: true) as Anthropic's events",
            "security": SECURITY,
            "parameters": HEADERS,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": MESSAGES_REQUEST, "example": EXAMPLE}},
            },
            "responses": {
                "200": {
                    "description": "the message, or its server-sent events",
                    "content": {
                        "application/json": {"schema": MESSAGE_ANSWER},
                        "text/event-stream": {"schema": EVENT},
                    },
                },
                "default": _error(),
            },
        }
    }
    count = {
        "post": {
            "operationId": "countMessageTokens",
            "summary": "Anthropic Messages: the input tokens of a message (x-gateway-token-count: engine or estimate)",
            "security": SECURITY,
            "parameters": HEADERS,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": COUNT_REQUEST,
                        "example": {"model": "m", "messages": EXAMPLE["messages"]},
                    }
                },
            },
            "responses": {
                "200": {
                    "description": "the count",
                    "content": {
                        "application/json": {
                            "schema": _obj(["input_tokens"], {"input_tokens": {"type": "integer", "minimum": 0}})
                        }
                    },
                },
                "default": _error(),
            },
        }
    }
    return {"/v1/messages": messages, "/v1/messages/count_tokens": count}
