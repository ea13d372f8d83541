"""The OpenAPI description of OpenAI's Responses API as the gateway serves it (merged into openapi.py's
document): `POST /v1/responses`, `GET` and `DELETE /v1/responses/{response_id}`,
`GET /v1/responses/{response_id}/input_items`, `POST /v1/responses/input_tokens`.

This module owns the paths: the operations, their parameters, links and error answers. The schemas they
refer to live in openapi_responses_request.py (what the gateway accepts) and openapi_responses_answers.py
(what it sends); `REQUEST_PROPERTIES` is re-exported here for the tests that compare it with the ingress
parser. The document itself, and its security schemes, are openapi.py's.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.dialects.responses.openapi_answers import COUNT, DELETED, ERROR, EVENT, ITEMS_PAGE, RESPONSE
from llm_gateway.dialects.responses.openapi_request import (
    EXAMPLE,
    REQUEST,
    REQUEST_PROPERTIES,
    RESPONSE_ID,
    STRING,
    _int,
)

__all__ = ["REQUEST", "REQUEST_PROPERTIES", "RESPONSE", "SECURITY", "responses_paths"]

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


ERRORS = {
    "400": "the request is invalid, or asks for what the gateway does not support",
    "401": "no valid API key",
    "404": "no such response (of this key), no such stored item (an `item_reference`), or no such model",
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
