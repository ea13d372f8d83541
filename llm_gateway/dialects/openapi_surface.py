"""The OpenAPI description of the routes outside a generation (merged into openapi.py's document): OpenAI's Files
and Batch APIs (dialects/files.py, dialects/batches.py), `/tokenize` and `/detokenize` (dialects/tokenize.py),
rerank and score (dialects/scoring.py) and speech to text (dialects/audio.py).

Only what the gateway itself checks is stated as a constraint (an engine's own limits are configuration);
answers are described by the fields the gateway writes or every engine's answer has. The `/v1` routes are also
served without the prefix (and rerank on `/v2/rerank`), as the document's description says.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.dialects.responses.openapi_answers import ERROR
from llm_gateway.service.batch_runner import ENDPOINTS

SECURITY: list[dict[str, list[str]]] = [{"bearer": []}, {"apiKey": []}]
STRING = {"type": "string"}
MODEL = {"type": "string", "minLength": 1, "description": "a model name or alias (GET /v1/models)"}
TEXTS = {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {"type": "string"}}]}
ID = {"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[A-Za-z0-9_-]+$"}


def _obj(required: list[str], properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _op(operation_id: str, summary: str, ok: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "operationId": operation_id,
        "summary": summary,
        "security": SECURITY,
        **extra,
        "responses": {"200": ok, "default": _json("an error, in the OpenAI envelope", ERROR)},
    }


def _json_body(schema: dict[str, Any], example: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema, "example": example}}}


def _form_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "required": True,
        "content": {"multipart/form-data": {"schema": schema, "encoding": {"file": {"contentType": "*/*"}}}},
    }


def _path_id(name: str) -> list[dict[str, Any]]:
    return [{"name": name, "in": "path", "required": True, "schema": ID}]


FILE = _obj(
    ["id", "object", "bytes", "created_at", "filename", "purpose"],
    {
        "id": STRING,
        "object": {"const": "file"},
        "bytes": {"type": "integer"},
        "created_at": {"type": "integer"},
        "expires_at": {"type": ["integer", "null"]},
        "filename": STRING,
        "purpose": STRING,
        "status": STRING,
    },
)
BATCH = _obj(
    ["id", "object", "endpoint", "input_file_id", "completion_window", "status", "created_at"],
    {
        "id": STRING,
        "object": {"const": "batch"},
        "endpoint": STRING,
        "input_file_id": STRING,
        "completion_window": STRING,
        "status": STRING,
        "created_at": {"type": "integer"},
        "output_file_id": {"type": ["string", "null"]},
        "error_file_id": {"type": ["string", "null"]},
        "request_counts": {"type": "object"},
    },
)


def _page(item: dict[str, Any]) -> dict[str, Any]:
    return _obj(
        ["object", "data", "has_more"],
        {"object": {"const": "list"}, "data": {"type": "array", "items": item}, "has_more": {"type": "boolean"}},
    )


def _limit(most: int) -> dict[str, Any]:
    return {
        "name": "limit",
        "in": "query",
        "required": False,
        "schema": {"type": "integer", "minimum": 1, "maximum": most},
    }


def files_paths() -> dict[str, Any]:
    upload = _obj(
        ["file", "purpose"],
        {
            "file": {"type": "string", "format": "binary", "description": "a JSONL of batch requests"},
            "purpose": {"const": "batch"},
            "expires_after[anchor]": {"const": "created_at"},
            "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 30 * 24 * 3600},
        },
    )
    file_link = {"GetFile": {"operationId": "getFile", "parameters": {"file_id": "$response.body#/id"}}}
    ok = _json("the file", FILE)
    return {
        "/v1/files": {
            "post": _op(
                "createFile",
                "Upload a JSONL for the Batch API",
                {**ok, "links": file_link},
                requestBody=_form_body(upload),
            ),
            "get": _op(
                "listFiles",
                "This key's files",
                _json("a page of files", _page(FILE)),
                parameters=[
                    _limit(10_000),
                    {"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]}},
                    {"name": "after", "in": "query", "required": False, "schema": STRING},
                    {"name": "purpose", "in": "query", "required": False, "schema": STRING},
                ],
            ),
        },
        "/v1/files/{file_id}": {
            "get": _op("getFile", "One file", ok, parameters=_path_id("file_id")),
            "delete": _op(
                "deleteFile",
                "Delete a file",
                _json(
                    "deleted",
                    _obj(
                        ["id", "object", "deleted"],
                        {"id": STRING, "object": {"const": "file"}, "deleted": {"type": "boolean"}},
                    ),
                ),
                parameters=_path_id("file_id"),
            ),
        },
        "/v1/files/{file_id}/content": {
            "get": _op(
                "getFileContent",
                "A file's content",
                {"description": "the JSONL", "content": {"application/jsonl": {"schema": STRING}}},
                parameters=_path_id("file_id"),
            )
        },
    }


def batches_paths() -> dict[str, Any]:
    create = _obj(
        ["input_file_id", "endpoint", "completion_window"],
        {
            "input_file_id": ID,
            "endpoint": {"enum": list(ENDPOINTS)},
            "completion_window": {"type": "string", "pattern": "^[0-9]+[smhd]$", "description": "e.g. 24h"},
            "metadata": {"type": ["object", "null"]},
        },
    )
    example = {"input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    ok = _json("the batch", BATCH)
    link = {"GetBatch": {"operationId": "getBatch", "parameters": {"batch_id": "$response.body#/id"}}}
    return {
        "/v1/batches": {
            "post": _op(
                "createBatch",
                "Run a file's requests as a batch",
                {**ok, "links": link},
                requestBody=_json_body(create, example),
            ),
            "get": _op(
                "listBatches",
                "This key's batches",
                _json("a page of batches", _page(BATCH)),
                parameters=[_limit(100), {"name": "after", "in": "query", "required": False, "schema": STRING}],
            ),
        },
        "/v1/batches/{batch_id}": {"get": _op("getBatch", "One batch", ok, parameters=_path_id("batch_id"))},
        "/v1/batches/{batch_id}/cancel": {
            "post": _op("cancelBatch", "Cancel a batch", ok, parameters=_path_id("batch_id"))
        },
    }


def utility_paths() -> dict[str, Any]:
    tokenize = {
        "oneOf": [
            _obj(["model", "prompt"], {"model": MODEL, "prompt": STRING, "add_special_tokens": {"type": "boolean"}}),
            _obj(["model", "messages"], {"model": MODEL, "messages": {"type": "array", "items": {"type": "object"}}}),
        ]
    }
    tokens = _obj(["count", "tokens"], {"count": {"type": "integer"}, "tokens": {"type": "array"}})
    rerank = _obj(
        ["model", "query", "documents"],
        {"model": MODEL, "query": STRING, "documents": TEXTS, "top_n": {"type": "integer", "minimum": 0}},
    )
    score = _obj(["model", "queries", "documents"], {"model": MODEL, "queries": TEXTS, "documents": TEXTS})
    ranked = _obj(["model", "results"], {"model": STRING, "results": {"type": "array", "items": {"type": "object"}}})
    scored = _obj(["model", "data"], {"model": STRING, "data": {"type": "array", "items": {"type": "object"}}})
    speech = _obj(
        ["file", "model"],
        {
            "file": {"type": "string", "format": "binary"},
            "model": MODEL,
            "language": STRING,
            "prompt": STRING,
            "response_format": STRING,
            "temperature": {"type": "number"},
        },
    )
    heard = _json("the text", _obj(["text"], {"text": STRING}))
    return {
        "/tokenize": {
            "post": _op(
                "tokenize",
                "A prompt's tokens by the model's own tokenizer (capability tokenize)",
                _json("the tokens", tokens),
                requestBody=_json_body(tokenize, {"model": "my-model", "prompt": "Hello"}),
            )
        },
        "/detokenize": {
            "post": _op(
                "detokenize",
                "Token ids back to text (capability tokenize)",
                _json("the text", _obj(["prompt"], {"prompt": STRING})),
                requestBody=_json_body(
                    _obj(
                        ["model", "tokens"], {"model": MODEL, "tokens": {"type": "array", "items": {"type": "integer"}}}
                    ),
                    {"model": "my-model", "tokens": [1, 2]},
                ),
            )
        },
        "/v1/rerank": {
            "post": _op(
                "rerank",
                "Documents ranked by relevance to a query (capability rerank; also /rerank, /v2/rerank)",
                _json("the ranking", ranked),
                requestBody=_json_body(rerank, {"model": "my-reranker", "query": "q", "documents": ["a", "b"]}),
            )
        },
        "/v1/score": {
            "post": _op(
                "score",
                "Relevance scores of pairs (capability score; also /score)",
                _json("the scores", scored),
                requestBody=_json_body(score, {"model": "my-reranker", "queries": "q", "documents": ["a", "b"]}),
            )
        },
        "/v1/audio/transcriptions": {
            "post": _op(
                "createTranscription", "Speech to text (capability audio)", heard, requestBody=_form_body(speech)
            )
        },
        "/v1/audio/translations": {
            "post": _op(
                "createTranslation", "Speech to English text (capability audio)", heard, requestBody=_form_body(speech)
            )
        },
    }


def surface_paths() -> dict[str, Any]:
    return {**files_paths(), **batches_paths(), **utility_paths()}
