"""The OpenAPI description of OpenAI's Responses API as the gateway serves it (merged into openapi.py's
document): `POST /v1/responses`, `GET` and `DELETE /v1/responses/{response_id}`,
`GET /v1/responses/{response_id}/input_items`, `POST /v1/responses/input_tokens`.

It says exactly what `ingress/responses_request.py` accepts, so that a request valid by the document
is one the gateway takes and an invalid one is refused with a 400 (tests/reliability/test_schemathesis.py):
an explicit null counts as an absent optional field (an unknown top-level field too, but only when null:
any other value of one is refused), the fields the gateway cannot honour (`background: true`,
`conversation`, `prompt`, `context_management`, `max_tool_calls`, built-in tools, `item_reference`
and file inputs) are documented as refused, and the gateway's own limits are stated (`temperature`
0..2, `top_logprobs` at most 20, 16 metadata pairs, images in user messages only, an input that
leaves the model nothing to answer). The answers: the Response object (`ingress/responses_response.py`),
the typed event stream (`ingress/responses_stream.py`), a page of input items, the deletion, and
errors in the OpenAI envelope (`http/responses.py`). It owns these schemas only; the document itself,
and its security schemes, are openapi.py's.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.ingress.field_checks import Hint
from llm_gateway.ingress.responses_request import _EFFORTS, _INCLUDES, _UNSUPPORTED, HINTS

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]
INT64_MAX = 2**63 - 1  # a longer JSON integer is refused


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _hint(hint: Hint) -> dict[str, Any]:
    """A hint the gateway checks for its type (or values), then ignores; null is allowed."""
    return _nullable({"enum": list(hint)} if isinstance(hint, tuple) else {"type": hint})


def _obj(required: list[str], properties: dict[str, Any], *, closed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "required": required, "properties": properties}
    if closed:
        out["additionalProperties"] = False
    return out


def _int(minimum: int, maximum: int = INT64_MAX) -> dict[str, Any]:
    return {"type": "integer", "format": "int64", "minimum": minimum, "maximum": maximum}


STRING = {"type": "string"}
N_STRING = _nullable(STRING)
N_BOOL = _nullable({"type": "boolean"})
MODEL = {"type": "string", "minLength": 1, "description": "a model name or alias (GET /v1/models)"}
RESPONSE_ID = {"type": "string", "pattern": "^resp_", "maxLength": 128}

# -- input items -------------------------------------------------------------------------------------
# Items and content parts may carry keys of their own (an item's `id` and `status`, say): they are
# kept in the stored input items, not checked.
TEXT_PART = _obj(["type", "text"], {"type": {"enum": ["input_text", "output_text"]}, "text": STRING})
REFUSAL_PART = _obj(["type", "refusal"], {"type": {"const": "refusal"}, "refusal": STRING})
IMAGE_PART = _obj(
    ["type", "image_url"],
    {
        "type": {"const": "input_image"},
        "image_url": {"type": "string", "description": "a URL or a data URL (file ids are refused)"},
        "detail": _hint(("auto", "low", "high", "original")),
    },
)


def _message(roles: list[str], parts: list[dict[str, Any]]) -> dict[str, Any]:
    return _obj(
        ["role", "content"],
        {
            "type": {"const": "message"},
            "role": {"enum": roles},
            "content": {"anyOf": [STRING, {"type": "array", "items": {"anyOf": parts}}]},
        },
    )


USER_MESSAGE = _message(["user"], [TEXT_PART, REFUSAL_PART, IMAGE_PART])
OTHER_MESSAGE = _message(["assistant", "system", "developer"], [TEXT_PART, REFUSAL_PART])  # no images
FUNCTION_CALL = _obj(
    ["type", "call_id", "name", "arguments"],
    {"type": {"const": "function_call"}, "call_id": STRING, "name": STRING, "arguments": STRING},
)
FUNCTION_CALL_OUTPUT = _obj(
    ["type", "call_id", "output"],
    {
        "type": {"const": "function_call_output"},
        "call_id": STRING,
        "output": {"anyOf": [STRING, {"type": "array", "items": {"anyOf": [TEXT_PART, IMAGE_PART]}}]},
    },
)


def _reasoning_parts(kind: str) -> dict[str, Any]:
    """Parts of a reasoning item: those of `kind` carry text; others are ignored."""
    return _nullable(
        {
            "type": "array",
            "items": {
                "anyOf": [
                    _obj(["type", "text"], {"type": {"const": kind}, "text": STRING}),
                    {"type": "object", "properties": {"type": {"not": {"const": kind}}}},
                ]
            },
        }
    )


REASONING_ITEM = _obj(
    ["type"],
    {
        "type": {"const": "reasoning"},
        "content": _reasoning_parts("reasoning_text"),
        "summary": _reasoning_parts("summary_text"),
    },
)
# what becomes a chat message (a reasoning item only rides on the next assistant turn)
CONVERSATIONAL = [USER_MESSAGE, OTHER_MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT]
INPUT = {
    "anyOf": [
        {"type": "string", "description": "one user message"},
        {"type": "array", "items": {"anyOf": [*CONVERSATIONAL, REASONING_ITEM]}},
    ],
    "description": (
        "items: messages (`type` may be left out), function calls and their outputs, reasoning; "
        "`item_reference`, file inputs and the built-in tools' items are refused"
    ),
}

# -- the request ---------------------------------------------------------------------------------------
FUNCTION_TOOL = _obj(
    ["type", "name"],
    {
        "type": {"const": "function", "description": "function tools only: built-in tools are refused"},
        "name": STRING,
        "description": N_STRING,
        "parameters": _nullable({"type": "object"}),
        "strict": N_BOOL,
        "defer_loading": {"description": "accepted, not used"},
    },
    closed=True,
)
TOOL_CHOICE = _nullable(
    {
        "anyOf": [
            {"enum": ["auto", "none", "required"]},
            _obj(["type", "name"], {"type": {"const": "function"}, "name": STRING}),
        ]
    }
)
JSON_SCHEMA_FORMAT = _obj(
    ["type", "name", "schema"],
    {
        "type": {"const": "json_schema"},
        "name": STRING,
        "schema": {"type": "object"},
        "strict": N_BOOL,
        "description": N_STRING,
    },
    closed=True,
)
TEXT = _nullable(
    _obj(
        [],
        {
            "format": _nullable(
                {
                    "anyOf": [
                        _obj(["type"], {"type": {"enum": ["text", "json_object"]}}),
                        JSON_SCHEMA_FORMAT,
                    ]
                }
            ),
            "verbosity": _hint(("low", "medium", "high")),
        },
        closed=True,
    )
)
SUMMARY = _hint(("auto", "concise", "detailed"))
REASONING = _nullable(
    _obj(
        [],
        {"effort": _hint(_EFFORTS), "summary": SUMMARY, "generate_summary": {**SUMMARY, "description": "deprecated"}},
        closed=True,
    )
)
METADATA = _nullable(
    {
        "type": "object",
        "maxProperties": 16,
        "propertyNames": {"maxLength": 64},
        "additionalProperties": {"type": "string", "maxLength": 512},
    }
)
REFUSED = {k: {"type": "null", "description": f"refused unless null: {why}"} for k, why in _UNSUPPORTED.items()} | {
    "background": {"enum": [False, None], "description": f"refused when true: {_UNSUPPORTED['background']}"}
}

REQUEST_PROPERTIES: dict[str, Any] = {
    "model": MODEL,
    "input": INPUT,
    "instructions": {**N_STRING, "description": "a first system message (not carried over by chaining)"},
    "previous_response_id": {
        **_nullable({"type": "string", "pattern": "^resp_"}),
        "description": "a stored response of this key, whose conversation goes before this input (404 if none)",
    },
    "store": {**N_BOOL, "description": "keep the response for GET and chaining (default true)"},
    "stream": N_BOOL,
    "max_output_tokens": _nullable(_int(1)),
    "temperature": _nullable({"type": "number", "minimum": 0, "maximum": 2}),
    "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
    "top_logprobs": _nullable(_int(0, 20)),
    "include": _nullable({"type": "array", "items": {"enum": sorted(_INCLUDES)}}),
    "tools": _nullable({"type": "array", "items": FUNCTION_TOOL}),
    "tool_choice": TOOL_CHOICE,
    "parallel_tool_calls": N_BOOL,
    "text": TEXT,
    "reasoning": REASONING,
    "metadata": METADATA,
    "truncation": _hint(("auto", "disabled")),
    "user": N_STRING,
    "safety_identifier": N_STRING,
    # hints: checked for their type, then ignored
    **{k: _hint(h) for k, h in HINTS.items()},
    **REFUSED,
}
REQUEST = {
    "type": "object",
    "required": ["model", "input"],
    "properties": REQUEST_PROPERTIES,
    "additionalProperties": {"type": "null", "description": "an unknown field is refused unless null"},
    # the chat conversation must not come out empty: instructions, a previous response, or an input
    # with something other than reasoning in it
    "anyOf": [
        {"properties": {"input": {"anyOf": [STRING, {"contains": {"anyOf": CONVERSATIONAL}}]}}},
        {"required": ["instructions"], "properties": {"instructions": {"type": "string", "minLength": 1}}},
        {"required": ["previous_response_id"], "properties": {"previous_response_id": STRING}},
    ],
}
EXAMPLE = {"model": "my-model", "input": "Hello!", "store": False}

# -- answers -------------------------------------------------------------------------------------------
LOGPROB = _obj(
    ["token", "logprob", "bytes"],
    {"token": STRING, "logprob": {"type": "number"}, "bytes": {"type": "array", "items": {"type": "integer"}}},
)
OUTPUT_TEXT = _obj(
    ["type", "text", "annotations", "logprobs"],
    {
        "type": {"const": "output_text"},
        "text": STRING,
        "annotations": {"type": "array"},
        "logprobs": {
            "type": "array",
            "items": {**LOGPROB, "properties": {**LOGPROB["properties"], "top_logprobs": {"type": "array"}}},
        },
    },
)
ITEM_STATUS = {"enum": ["in_progress", "completed", "incomplete"]}
OUTPUT_MESSAGE = _obj(
    ["id", "type", "status", "role", "content"],
    {
        "id": STRING,
        "type": {"const": "message"},
        "status": ITEM_STATUS,
        "role": {"const": "assistant"},
        "content": {"type": "array", "items": {"anyOf": [OUTPUT_TEXT, REFUSAL_PART]}},
    },
)
OUTPUT_REASONING = _obj(
    ["id", "type", "summary", "content", "status"],
    {
        "id": STRING,
        "type": {"const": "reasoning"},
        "summary": {"type": "array"},
        "content": {
            "type": "array",
            "items": _obj(["type", "text"], {"type": {"const": "reasoning_text"}, "text": STRING}),
        },
        "status": ITEM_STATUS,
    },
)
OUTPUT_CALL = _obj(
    ["id", "type", "status", "call_id", "name", "arguments"],
    {**FUNCTION_CALL["properties"], "id": STRING, "status": ITEM_STATUS},
)
OUTPUT_ITEM = {"anyOf": [OUTPUT_MESSAGE, OUTPUT_REASONING, OUTPUT_CALL]}
USAGE = _obj(
    ["input_tokens", "input_tokens_details", "output_tokens", "output_tokens_details", "total_tokens"],
    {
        "input_tokens": {"type": "integer"},
        "input_tokens_details": _obj(["cached_tokens"], {"cached_tokens": {"type": "integer"}}),
        "output_tokens": {"type": "integer"},
        "output_tokens_details": _obj(["reasoning_tokens"], {"reasoning_tokens": {"type": "integer"}}),
        "total_tokens": {"type": "integer"},
    },
)
RESPONSE = _obj(
    ["id", "object", "created_at", "status", "error", "incomplete_details", "model", "output", "usage"],
    {
        "id": RESPONSE_ID,
        "object": {"const": "response"},
        "created_at": {"type": "integer"},
        "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
        "background": {"const": False},
        "error": _nullable(_obj(["code", "message"], {"code": STRING, "message": STRING})),
        "incomplete_details": _nullable(
            _obj(["reason"], {"reason": {"enum": ["max_output_tokens", "content_filter"]}})
        ),
        "model": STRING,
        "output": {"type": "array", "items": OUTPUT_ITEM},
        "previous_response_id": _nullable(RESPONSE_ID),
        "usage": _nullable(USAGE),
        # the request's fields, echoed
        "instructions": N_STRING,
        "store": {"type": "boolean"},
        "max_output_tokens": _nullable({"type": "integer"}),
        "temperature": {"type": "number"},
        "top_p": {"type": "number"},
        "top_logprobs": {"type": "integer"},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_choice": {"anyOf": [STRING, {"type": "object"}]},
        "parallel_tool_calls": {"type": "boolean"},
        "text": {"type": "object"},
        "reasoning": {"type": "object"},
        "metadata": {"type": "object", "additionalProperties": STRING},
        "truncation": {"enum": ["auto", "disabled"]},
        "user": STRING,
        "safety_identifier": STRING,
        "service_tier": STRING,
    },
)
EVENT_TYPES = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.output_text.delta",
    "response.output_text.done",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
    "response.incomplete",
    "response.failed",
]
# one server-sent event (`schema` describes each event before OpenAPI 3.2's `itemSchema`)
EVENT = _obj(
    ["event", "data"],
    {
        "event": {"enum": EVENT_TYPES},
        "data": {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": _obj(
                ["type", "sequence_number"],
                {
                    "type": {"enum": EVENT_TYPES},
                    "sequence_number": {"type": "integer", "minimum": 0},
                    "response": RESPONSE,
                    "item": OUTPUT_ITEM,
                    "output_index": {"type": "integer", "minimum": 0},
                },
            ),
        },
    },
)
INPUT_ITEM = _obj(["id", "type"], {"id": STRING, "type": STRING})  # as sent, with an id (and a message's type)
ITEMS_PAGE = _obj(
    ["object", "data", "first_id", "last_id", "has_more"],
    {
        "object": {"const": "list"},
        "data": {"type": "array", "items": INPUT_ITEM},
        "first_id": N_STRING,
        "last_id": N_STRING,
        "has_more": {"type": "boolean"},
    },
)
DELETED = _obj(
    ["id", "object", "deleted"],
    {"id": RESPONSE_ID, "object": {"const": "response.deleted"}, "deleted": {"const": True}},
)
COUNT = _obj(
    ["object", "input_tokens"],
    {"object": {"const": "response.input_tokens"}, "input_tokens": {"type": "integer", "minimum": 0}},
)
ERROR = _obj(
    ["error"],
    {
        "error": _obj(
            ["message", "type", "param", "code"],
            {"message": STRING, "type": STRING, "param": N_STRING, "code": N_STRING},
        )
    },
)


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": "the request is invalid, or asks for what the gateway does not support",
    "401": "no valid API key",
    "404": "no such response (of this key), or no such model",
    "429": "a rate limit, or the gateway is overloaded",
    "503": "the database of stored responses cannot be reached, or no backend can serve the model",
}


def _errors(*codes: str) -> dict[str, Any]:
    return {code: _json(f"{ERRORS[code]} (the OpenAI error envelope)", ERROR) for code in codes}


ID_PARAMETER = {"name": "response_id", "in": "path", "required": True, "schema": RESPONSE_ID}
# from an answer carrying a response's id to the operations on it (schemathesis's stateful runs follow them)
LINKS = {
    "GetResponse": {"operationId": "getResponse", "parameters": {"response_id": "$response.body#/id"}},
    "ListInputItems": {"operationId": "listInputItems", "parameters": {"response_id": "$response.body#/id"}},
    "DeleteResponse": {"operationId": "deleteResponse", "parameters": {"response_id": "$response.body#/id"}},
}


def responses_paths() -> dict[str, Any]:
    create = {
        "operationId": "createResponse",
        "summary": "OpenAI Responses: a response, whole or (with stream: true) as typed events",
        "security": SECURITY,
        "parameters": [
            {"name": "x-request-id", "in": "header", "required": False, "schema": STRING},
            {"name": "x-session-id", "in": "header", "required": False, "schema": STRING},
        ],
        "requestBody": {"required": True, "content": {"application/json": {"schema": REQUEST, "example": EXAMPLE}}},
        "responses": {
            "200": {
                "description": "the Response object, or its server-sent events (`event: TYPE`, `data: JSON`)",
                "headers": {
                    "x-gateway-stored": {
                        "description": "`false` when the response was asked to be stored and could not be",
                        "schema": {"const": "false"},
                    }
                },
                "content": {"application/json": {"schema": RESPONSE}, "text/event-stream": {"schema": EVENT}},
                "links": LINKS,
            },
            **_errors("400", "401", "404", "429", "503"),
            "default": _json("another error (the engine's own, a body too large or too slow): the envelope", ERROR),
        },
    }
    retrieve = {
        "operationId": "getResponse",
        "summary": "A stored response",
        "security": SECURITY,
        "parameters": [ID_PARAMETER],
        "responses": {
            "200": {**_json("the Response object", RESPONSE), "links": LINKS},
            **_errors("401", "404", "503"),
        },
    }
    delete = {
        "operationId": "deleteResponse",
        "summary": "Delete a stored response",
        "security": SECURITY,
        "parameters": [ID_PARAMETER],
        "responses": {
            "200": {
                **_json("deleted", DELETED),
                "links": {"GetResponse": LINKS["GetResponse"]},
            },
            **_errors("401", "404", "503"),
        },
    }
    items = {
        "operationId": "listInputItems",
        "summary": "The input items of a stored response, a page at a time",
        "security": SECURITY,
        "parameters": [
            ID_PARAMETER,
            {"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"], "default": "desc"}},
            {"name": "limit", "in": "query", "required": False, "schema": {**_int(1, 100), "default": 20}},
            {"name": "after", "in": "query", "required": False, "schema": {**STRING, "description": "an item id"}},
        ],
        "responses": {"200": _json("a page of input items", ITEMS_PAGE), **_errors("400", "401", "404", "503")},
    }
    count = {
        "operationId": "countResponseInputTokens",
        "summary": "The input tokens of a Responses request (x-gateway-token-count: engine or estimate); not charged",
        "security": SECURITY,
        "parameters": create["parameters"],
        "requestBody": create["requestBody"],
        "responses": {
            "200": {
                **_json("the count", COUNT),
                "headers": {"x-gateway-token-count": {"required": True, "schema": {"enum": ["engine", "estimate"]}}},
            },
            **_errors("400", "401", "404", "429", "503"),
        },
    }
    return {
        "/v1/responses": {"post": create},
        "/v1/responses/input_tokens": {"post": count},
        "/v1/responses/{response_id}": {"get": retrieve, "delete": delete},
        "/v1/responses/{response_id}/input_items": {"get": items},
    }
