"""The gateway's OpenAPI document (served at /openapi.json, used by the fuzz and schemathesis tests).

Written out rather than generated: the hot path deliberately has no framework models, and this
document only needs to describe the wire contract. Request bodies allow additional properties:
unknown fields pass through to the engine. Where the gateway itself refuses a value (request_info.py:
an empty `model`, an empty `messages`, a streamed embedding, a negative `max_tokens`, an integer past
64 bits), the document says so, so that a request valid by the document is one the gateway takes.
tests/reliability/test_schemathesis.py holds the gateway to it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

from llm_gateway.dialects.anthropic.openapi import anthropic_paths
from llm_gateway.dialects.openapi_surface import surface_paths
from llm_gateway.dialects.responses.openapi import responses_paths

ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

MODEL = {
    "type": "string",
    "minLength": 1,
    "description": "a model name or alias (GET /v1/models), optionally with a weight-format suffix: name@gguf",
}

MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {
            "oneOf": [
                {"type": "string"},
                {
                    "type": "array",
                    "items": {"type": "object", "properties": {"type": {"type": "string"}, "text": {"type": "string"}}},
                },
                {"type": "null"},
            ]
        },
        "name": {"type": "string"},
        "tool_call_id": {"type": "string"},
    },
}

# JSON integers the gateway reads: 64-bit (a longer one is not parsed); 287.0 counts as 287
INT64 = {"type": "integer", "format": "int64"}
INT64_NON_NEGATIVE = {**INT64, "minimum": 0}

SAMPLING = {
    "model": MODEL,
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": INT64_NON_NEGATIVE,
    "max_completion_tokens": INT64_NON_NEGATIVE,
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "n": INT64,
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "seed": INT64,
    "user": {"type": "string"},
}

TEXTS = {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]

# one server-sent event (what a `text/event-stream` schema describes before OpenAPI 3.2's `itemSchema`):
# `data:` is a chunk's JSON or the closing `[DONE]`
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "properties": {
        "data": {"type": "string"},
        "event": {"type": "string"},
        "id": {"type": "string"},
        "retry": {"type": "integer"},
    },
}

MODEL_CARD = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by"],
    "properties": {
        "id": {"type": "string"},
        "object": {"const": "model"},
        "created": {"type": "integer"},
        "owned_by": {"type": "string"},
        "root": {"type": "string", "description": "the canonical name, when `id` is an alias"},
        "context_length": {
            "type": "integer",
            "description": "the smallest context window (tokens) known of the model's deployments; absent: none known",
        },
        "ready": {"type": "boolean", "description": "a deployment's backend is live and serves the model"},
        "resident": {
            "type": "boolean",
            "description": "a deployment has the model loaded (false: the next request loads it cold); absent: no"
            " engine of the model can tell",
        },
    },
}

READINESS = {
    "type": "object",
    "required": ["status", "backends"],
    "properties": {
        "status": {"type": "string", "enum": ["ready", "not_ready"]},
        "backends": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "required": ["engine", "state", "in_flight"],
                "properties": {
                    "engine": {"type": "string"},
                    "state": {"type": "string"},
                    "in_flight": {"type": "integer"},
                    "prefix_cache": {  # a backend with `kv_events` (routing/kv_events.py)
                        "type": "object",
                        "required": ["source"],
                        "properties": {
                            "source": {"type": "string", "enum": ["kv_events", "approximate"]},
                            "endpoints": {"type": "array", "items": {"type": "string"}},
                            "batches": {"type": "integer"},
                            "cached_tokens": {"type": "integer"},
                            "block_size": {"type": "integer"},
                        },
                    },
                },
            },
        },
    },
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _error() -> dict[str, Any]:
    return _json("an error, in the OpenAI envelope", ERROR)


def _post(operation_id: str, summary: str, schema: dict[str, Any], example: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "operationId": operation_id,
            "summary": summary,
            "security": SECURITY,
            "parameters": [
                {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string"}},
                {"name": "x-gateway-format", "in": "header", "required": False, "schema": {"type": "string"}},
                {"name": "x-session-id", "in": "header", "required": False, "schema": {"type": "string"}},
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema, "example": example}}},
            "responses": {
                "200": {
                    "description": "the answer, as JSON or (with stream: true) as server-sent events",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": SSE_EVENT},
                    },
                },
                "default": _error(),
            },
        }
    }


def _get(operation_id: str, summary: str, ok: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "get": {
            "operationId": operation_id,
            "summary": summary,
            **extra,
            "responses": {"200": ok, "default": _error()},
        }
    }


@cache
def openapi_document() -> bytes:
    models_ok = _json(
        "the models this key may use",
        {
            "type": "object",
            "required": ["object", "data"],
            "properties": {"object": {"const": "list"}, "data": {"type": "array", "items": MODEL_CARD}},
        },
    )
    models_ok["links"] = {
        "GetModel": {"operationId": "getModel", "parameters": {"model": "$response.body#/data/0/id"}},
    }
    ready = _get("readyz", "At least one backend is ready (or busy)", _json("ready", READINESS))
    ready["get"]["responses"]["503"] = _json("no backend is ready", READINESS)
    doc = {
        "openapi": "3.1.0",
        "info": {
            "title": "llm-gateway",
            "version": "0.1.0",
            "description": (
                "One OpenAI-compatible endpoint in front of local LLM engines. The OpenAI routes are also "
                "served without the /v1 prefix."
            ),
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            }
        },
        "paths": {
            "/v1/chat/completions": _post(
                "createChatCompletion",
                "Chat completion",
                {
                    "type": "object",
                    "required": ["model", "messages"],
                    "properties": {
                        **SAMPLING,
                        "messages": {"type": "array", "minItems": 1, "items": MESSAGE},
                        "tools": {"type": "array", "items": {"type": "object"}},
                        "response_format": {"type": "object"},
                    },
                },
                {"model": "my-model", "messages": [{"role": "user", "content": "Hello!"}]},
            ),
            "/v1/completions": _post(
                "createCompletion",
                "Text completion",
                {
                    "type": "object",
                    "required": ["model", "prompt"],
                    "properties": {**SAMPLING, "prompt": TEXTS},
                },
                {"model": "my-model", "prompt": "Once upon a time", "max_tokens": 16},
            ),
            "/v1/embeddings": _post(
                "createEmbedding",
                "Embeddings",
                {
                    "type": "object",
                    "required": ["model", "input"],
                    "properties": {
                        "model": MODEL,
                        "input": TEXTS,
                        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                        "stream": {"const": False, "description": "embeddings cannot be streamed"},
                    },
                },
                {"model": "my-embedder", "input": ["some text"]},
            ),
            "/v1/models": _get("listModels", "Models this key may use", models_ok, security=SECURITY),
            "/v1/models/{model}": _get(
                "getModel",
                "One model",
                _json("the model", MODEL_CARD),
                security=SECURITY,
                parameters=[{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
            ),
            "/healthz": _get(
                "healthz",
                "The process is alive",
                _json("alive", {"type": "object", "required": ["status"], "properties": {"status": {"const": "ok"}}}),
            ),
            "/readyz": ready,
            "/metrics": _get(
                "metrics",
                "Prometheus metrics (404 where they are served on a port of their own)",
                {"description": "the metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
            ),
            "/openapi.json": _get("openapi", "This document", _json("the document", {"type": "object"})),
            **responses_paths(),  # OpenAI's Responses API (openapi_responses.py)
            **anthropic_paths(),  # Anthropic's Messages API (openapi_anthropic.py)
            **surface_paths(),  # files, batches, tokenize, rerank, score, audio (openapi_surface.py)
        },
    }
    return orjson.dumps(doc)
