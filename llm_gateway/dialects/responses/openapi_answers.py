"""The answer half of the Responses API's OpenAPI description: the Response object
(`ingress/responses_response.py`), the typed server-sent event stream (`ingress/responses_stream.py`),
a page of input items, the deletion, the input-token count, and the OpenAI error envelope
(`http/responses.py`). Kept apart from the request schema (openapi_responses_request.py, whose
building blocks and input-item shapes it reuses) because it tracks what the gateway sends, not what it accepts.
"""

from __future__ import annotations

from llm_gateway.dialects.responses.openapi_request import (
    FUNCTION_CALL,
    N_STRING,
    REFUSAL_PART,
    RESPONSE_ID,
    STRING,
    _nullable,
    _obj,
)

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
