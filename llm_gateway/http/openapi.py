"""The gateway's OpenAPI document (served at /openapi.json, used by the fuzz tests).

Written out rather than generated: the hot path deliberately has no framework models, and this
document only needs to describe the wire contract. Request bodies allow additional properties:
unknown fields pass through to the engine.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import orjson

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

SAMPLING = {
    "model": {"type": "string"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 0},
    "max_completion_tokens": {"type": "integer", "minimum": 0},
    "temperature": {"type": "number"},
    "top_p": {"type": "number"},
    "n": {"type": "integer"},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "seed": {"type": "integer"},
    "user": {"type": "string"},
}


def _post(summary: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"bearer": []}, {"apiKey": []}],
            "parameters": [
                {"name": "x-request-id", "in": "header", "required": False, "schema": {"type": "string"}},
                {"name": "x-gateway-format", "in": "header", "required": False, "schema": {"type": "string"}},
                {"name": "x-session-id", "in": "header", "required": False, "schema": {"type": "string"}},
            ],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": {
                "200": {
                    "description": "the answer, as JSON or (with stream: true) as server-sent events",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                "default": {"description": "an error", "content": {"application/json": {"schema": ERROR}}},
            },
        }
    }


def _get(summary: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {
                "200": {"description": "ok", "content": {"application/json": {"schema": {"type": "object"}}}},
                "default": {"description": "an error", "content": {"application/json": {"schema": ERROR}}},
            },
        }
    }


@cache
def openapi_document() -> bytes:
    doc = {
        "openapi": "3.0.3",
        "info": {
            "title": "llm-gateway",
            "version": "0.1.0",
            "description": "One OpenAI-compatible endpoint in front of local LLM engines.",
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            }
        },
        "paths": {
            "/v1/chat/completions": _post(
                "Chat completion",
                {
                    "type": "object",
                    "required": ["model", "messages"],
                    "properties": {
                        **SAMPLING,
                        "messages": {"type": "array", "items": MESSAGE},
                        "tools": {"type": "array", "items": {"type": "object"}},
                        "response_format": {"type": "object"},
                    },
                },
            ),
            "/v1/completions": _post(
                "Text completion",
                {
                    "type": "object",
                    "required": ["model", "prompt"],
                    "properties": {
                        **SAMPLING,
                        "prompt": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                    },
                },
            ),
            "/v1/embeddings": _post(
                "Embeddings",
                {
                    "type": "object",
                    "required": ["model", "input"],
                    "properties": {
                        "model": {"type": "string"},
                        "input": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                        "encoding_format": {"type": "string", "enum": ["float", "base64"]},
                    },
                },
            ),
            "/v1/models": _get("Models this key may use"),
            "/v1/models/{model}": {
                "get": {
                    **_get("One model")["get"],
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                }
            },
            "/healthz": _get("The process is alive"),
            "/readyz": _get("At least one backend is ready"),
        },
    }
    return orjson.dumps(doc)
