"""The OpenAPI document and the routes agree (in-process, over ASGI): a 405 names the methods its path
serves in `Allow` (RFC 9110), those are the methods the document lists, and what the document calls
valid the gateway's own request reading takes (`model` non-empty, `messages` non-empty, integers in
their JSON spelling 16.0 as well as 16). tests/reliability/test_schemathesis.py checks the same
against a live process with schemathesis."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
import schemathesis

from llm_gateway.access.keys import digest_of
from llm_gateway.app import create_app
from llm_gateway.dialects.openapi import openapi_document
from llm_gateway.dialects.routes import ROUTES
from llm_gateway.errors import InvalidRequest
from llm_gateway.routing.request_info import read_request
from llm_gateway.settings.loader import parse_config

KEY = "sk-unit-openapi-0123456789"
CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys: [{name: unit, sha256: "${KEY_SHA}"}]
backends:
  - {name: engine-a, engine: vllm, url: "http://engine-a.test"}
models:
  - name: public-model
    deployments: [{backend: engine-a, model: up, format: safetensors, capabilities: [chat, completions, embeddings]}]
"""
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
# the paths with an id in them: served by prefix, not in ROUTES (the methods each serves)
BY_PREFIX = {
    "/v1/models/{model}": set(ROUTES.prefix_route("/v1/models/m").methods),  # type: ignore[union-attr]
    "/v1/responses/{response_id}": set(ROUTES.prefix_route("/v1/responses/r").methods),  # type: ignore[union-attr]
    "/v1/responses/{response_id}/input_items": set(
        ROUTES.prefix_route("/v1/responses/r/input_items").methods  # type: ignore[union-attr]
    ),
    "/v1/files/{file_id}": set(ROUTES.prefix_route("/v1/files/f").methods),  # type: ignore[union-attr]
    "/v1/files/{file_id}/content": set(ROUTES.prefix_route("/v1/files/f/content").methods),  # type: ignore[union-attr]
    "/v1/batches/{batch_id}": set(ROUTES.prefix_route("/v1/batches/b").methods),  # type: ignore[union-attr]
    "/v1/batches/{batch_id}/cancel": set(
        ROUTES.prefix_route("/v1/batches/b/cancel").methods  # type: ignore[union-attr]
    ),
}


@asynccontextmanager
async def client() -> AsyncIterator[httpx.AsyncClient]:
    config = parse_config(textwrap.dedent(CONFIG), "test.yaml", {"KEY_SHA": digest_of(KEY)})
    app = create_app(config, probes=False)
    transport = httpx.ASGITransport(app=app)
    headers = {"authorization": f"Bearer {KEY}"}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test", headers=headers) as c:
            yield c
    finally:
        await app.gw.aclose()


def document() -> dict[str, Any]:
    doc: dict[str, Any] = orjson.loads(openapi_document())
    return doc


def documented_methods(path: str) -> set[str]:
    return {m.upper() for m in document()["paths"][path] if m in HTTP_METHODS}


def body_schema(path: str) -> dict[str, Any]:
    schema: dict[str, Any] = document()["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return schema


def assert_405(r: httpx.Response, allow: str) -> None:
    assert r.status_code == 405, r.text
    assert r.headers["allow"] == allow
    if r.request.method != "HEAD":  # an answer to HEAD has no body
        if r.request.url.path.startswith("/v1/messages"):  # Anthropic's routes answer in Anthropic's envelope
            assert r.json()["error"]["type"] == "invalid_request_error"
        else:
            assert r.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/chat/completions", "POST"),
        ("GET", "/v1/completions", "POST"),
        ("DELETE", "/v1/embeddings", "POST"),
        ("POST", "/v1/models", "GET"),
        ("TRACE", "/models", "GET"),
        ("POST", "/v1/models/public-model", "GET"),
        ("PATCH", "/models/anything/at/all", "GET"),
        ("OPTIONS", "/healthz", "GET"),
        ("POST", "/readyz", "GET"),
        ("HEAD", "/metrics", "GET"),
        ("DELETE", "/openapi.json", "GET"),
    ],
)
async def test_a_405_carries_allow_with_the_methods_its_path_serves(method: str, path: str, allow: str) -> None:
    async with client() as c:
        r = await c.request(method, path)
    assert_405(r, allow)


async def test_an_unknown_path_is_a_404_without_allow() -> None:
    async with client() as c:
        r = await c.post("/v1/nothing")
    assert r.status_code == 404 and "allow" not in r.headers


async def test_every_documented_path_answers_a_wrong_method_with_the_documented_methods() -> None:
    doc = document()
    served = {(m, p) for m, p in ROUTES.exact}
    async with client() as c:
        for path in doc["paths"]:
            methods = documented_methods(path)
            concrete = path.replace("{model}", "public-model").replace("{response_id}", "resp_unit")
            concrete = concrete.replace("{file_id}", "file-unit").replace("{batch_id}", "batch_unit")
            for m in methods:
                assert (m, concrete) in served or m in BY_PREFIX.get(path, ()), f"{m} {path} is documented, not served"
            wrong = "TRACE" if "TRACE" not in methods else "PATCH"
            assert_405(await c.request(wrong, concrete), ", ".join(sorted(methods)))


def test_every_served_route_is_documented() -> None:
    """Each exact route of ROUTES is in the document under its own path or its /v1 twin (the document says the
    OpenAI routes are also served without the prefix; rerank's /v2 path is vLLM's alias of /v1/rerank)."""
    paths = document()["paths"]
    for method, path in ROUTES.exact:
        twins = (path, "/v1" + path, path.replace("/v2/", "/v1/"))
        documented = next((p for p in twins if p in paths), None)
        assert documented is not None, f"{method} {path} is served, not documented"
        assert method.lower() in paths[documented], f"{method} {path}"


def test_the_document_is_valid_openapi() -> None:
    schema = schemathesis.openapi.from_dict(document())
    schema.validate()
    assert document()["openapi"].startswith("3.1")


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
def test_the_document_says_model_must_be_a_non_empty_string(path: str) -> None:
    schema = body_schema(path)
    assert "model" in schema["required"]
    assert schema["properties"]["model"]["type"] == "string"
    assert schema["properties"]["model"]["minLength"] == 1


def test_the_document_says_what_else_the_gateway_refuses() -> None:
    chat = body_schema("/v1/chat/completions")["properties"]
    assert chat["messages"]["minItems"] == 1
    assert chat["max_tokens"]["minimum"] == 0 and chat["max_completion_tokens"]["minimum"] == 0
    assert body_schema("/v1/embeddings")["properties"]["stream"] == {
        "const": False,
        "description": "embeddings cannot be streamed",
    }


@pytest.mark.parametrize(
    ("endpoint", "path", "body"),
    [
        ("chat", "/v1/chat/completions", {"model": "", "messages": [{"role": "user", "content": "hi"}]}),
        ("completions", "/v1/completions", {"model": "", "prompt": "hi"}),
        ("embeddings", "/v1/embeddings", {"model": "", "input": "hi"}),
    ],
)
async def test_an_empty_model_is_refused_as_the_document_says(endpoint: str, path: str, body: dict[str, Any]) -> None:
    async with client() as c:
        r = await c.post(path, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"
    with pytest.raises(InvalidRequest):
        read_request(endpoint, dict(body))


def test_an_integral_float_max_tokens_is_the_integer_and_reaches_the_engine_as_one() -> None:
    body: dict[str, Any] = {"model": "m", "prompt": "hi", "max_tokens": 16.0, "max_completion_tokens": 8.0}
    info = read_request("completions", body)
    assert info.max_tokens == 8
    assert body["max_tokens"] == 16 and type(body["max_tokens"]) is int and type(body["max_completion_tokens"]) is int
    for bad in (16.5, -1.0, 1e30, True, "16"):
        with pytest.raises(InvalidRequest):
            read_request("completions", {"model": "m", "prompt": "hi", "max_tokens": bad})
