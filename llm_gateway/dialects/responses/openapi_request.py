"""The request half of the Responses API's OpenAPI description: the schema building blocks
(`_nullable`, `_obj`, `_int`, `_hint`, ...), the input items, and the `POST /v1/responses` body
(`REQUEST`, `REQUEST_PROPERTIES`, `EXAMPLE`).

It says exactly what `ingress/responses_request.py` accepts, so that a request valid by the document
is one the gateway takes and an invalid one is refused with a 400 (tests/reliability/test_schemathesis.py):
an explicit null counts as an absent optional field (an unknown top-level field too, but only when null:
any other value of one is refused), the fields the gateway cannot honour (`background: true`,
`conversation`, `prompt`, `context_management`, `max_tool_calls`, built-in tools and file inputs)
are documented as refused, an `item_reference` as the stored item it names (404 when the key has none
such), and the gateway's own limits are stated (`temperature` 0..2, `top_logprobs` at most 20, 16
metadata pairs, images in user messages only, an input that leaves the model nothing to answer). Kept
apart from the answers (openapi_responses_answers.py) and the paths (openapi_responses.py) because it
is the part that must track the ingress parser.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.dialects.field_checks import Hint
from llm_gateway.dialects.responses.request import _EFFORTS, _INCLUDES, _UNSUPPORTED, HINTS

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
ITEM_REFERENCE = {
    **_obj(["type", "id"], {"type": {"const": "item_reference"}, "id": STRING}),
    "description": "an item stored for this key (an input or output item of a stored response): 404 if none",
}
# what becomes a chat message (a reasoning item only rides on the next assistant turn)
CONVERSATIONAL = [USER_MESSAGE, OTHER_MESSAGE, FUNCTION_CALL, FUNCTION_CALL_OUTPUT]
INPUT = {
    "anyOf": [
        {"type": "string", "description": "one user message"},
        {"type": "array", "items": {"anyOf": [*CONVERSATIONAL, REASONING_ITEM, ITEM_REFERENCE]}},
    ],
    "description": (
        "items: messages (`type` may be left out), function calls and their outputs, reasoning, references to "
        "stored items; file inputs and the built-in tools' items are refused"
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
        "description": (
            "a stored response of this key, whose conversation goes before this input "
            "(400 previous_response_not_found if none)"
        ),
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
