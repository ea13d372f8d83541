"""CORS for browser clients (`server.cors`), in-process: preflight answers on the API routes, the
allow-origin header on answers (successes, errors and streams), refusals for other origins, and none of
it while CORS is off (OPTIONS stays 405, no Access-Control-* header anywhere)."""

from __future__ import annotations

import pytest

from tests.conftest import ONE_BACKEND, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.unit.test_request_path import ENGINE_CHAT, USAGE_CHUNK, chunk, engine_chat_json, sse

APP = "https://app.example.com"
CORS_ON = ONE_BACKEND.replace(
    "server: {access_log: false}",
    'server: {access_log: false, cors: {allow_origins: ["https://App.example.com/", "http://localhost:5173"], '
    "max_age_s: 120}}",
)
CHAT = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}]}
MESSAGES = {"model": "public-model", "max_tokens": 16, "messages": [{"role": "user", "content": "hello"}]}
PREFLIGHT = {"origin": APP, "access-control-request-method": "POST", "access-control-request-headers": "authorization"}


def engine() -> FakeUpstream:
    return FakeUpstream({("POST", ENGINE_CHAT): lambda *_: FakeAnswer.json(engine_chat_json())})


def cors_headers(headers: object) -> dict[str, str]:
    return {k: v for k, v in dict(headers).items() if k.lower().startswith("access-control-")}  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("path", "methods"),
    [
        ("/v1/chat/completions", "POST"),
        ("/v1/messages", "POST"),
        ("/v1/responses", "POST"),
        ("/v1/models", "GET"),
        ("/v1/models/public-model", "GET"),
        ("/v1/responses/resp_123", "DELETE, GET"),
    ],
)
async def test_a_preflight_on_an_api_route_is_answered_with_the_allowed_methods_and_headers(path, methods):
    async with gateway_client(make_config(CORS_ON), upstream=engine(), key=None) as (client, _):
        r = await client.options(path, headers=PREFLIGHT)
    assert r.status_code == 204, r.text
    assert r.content == b""
    assert r.headers["access-control-allow-origin"] == APP
    assert r.headers["access-control-allow-methods"] == methods
    assert "authorization" in r.headers["access-control-allow-headers"].split(", ")
    assert "x-api-key" in r.headers["access-control-allow-headers"].split(", ")
    assert r.headers["access-control-max-age"] == "120"
    assert r.headers["vary"] == "origin"
    assert "access-control-allow-credentials" not in r.headers  # keys travel in headers, never cookies


async def test_answers_carry_the_allowed_origin_on_success_error_and_stream():
    stream_body = sse(chunk("hi"), chunk(finish="stop"), USAGE_CHUNK, "[DONE]")

    def answer(method, url, headers, body):  # type: ignore[no-untyped-def]
        if b'"stream":true' in body:
            return FakeAnswer.sse(stream_body)
        return FakeAnswer.json(engine_chat_json())

    up = FakeUpstream({("POST", ENGINE_CHAT): answer})
    async with gateway_client(make_config(CORS_ON), upstream=up) as (client, _):
        ok = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": APP})
        denied = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"origin": APP, "authorization": "Bearer sk-wrong"}
        )
        anthropic_error = await client.post(
            "/v1/messages", json=MESSAGES, headers={"origin": APP, "authorization": "Bearer sk-wrong"}
        )
        missing = await client.post("/v1/nothing", json=CHAT, headers={"origin": APP})
        async with client.stream(
            "POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers={"origin": "http://localhost:5173"}
        ) as streamed:
            body = await streamed.aread()
    assert ok.status_code == 200 and denied.status_code == 401 and anthropic_error.status_code == 401
    assert missing.status_code == 404
    for r in (ok, denied, anthropic_error, missing):
        assert r.headers["access-control-allow-origin"] == APP, r.status_code
        assert "x-request-id" in r.headers["access-control-expose-headers"]
        assert "x-ratelimit-remaining-requests" in r.headers["access-control-expose-headers"]
    assert anthropic_error.json()["type"] == "error"  # still Anthropic's envelope
    assert streamed.status_code == 200 and b"[DONE]" in body
    assert streamed.headers["access-control-allow-origin"] == "http://localhost:5173"


async def test_another_origin_gets_no_cors_headers_and_its_preflight_is_refused():
    async with gateway_client(make_config(CORS_ON), upstream=engine()) as (client, _):
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"})
        pre = await client.options("/v1/chat/completions", headers={**PREFLIGHT, "origin": "https://evil.example"})
        plain = await client.post("/v1/chat/completions", json=CHAT)  # no Origin: not a browser
    assert r.status_code == 200 and cors_headers(r.headers) == {}
    assert pre.status_code == 403 and cors_headers(pre.headers) == {}
    assert pre.json()["error"]["code"] == "cors_origin_not_allowed"
    assert plain.status_code == 200 and cors_headers(plain.headers) == {}


async def test_any_origin_is_answered_with_a_star_and_no_vary():
    cfg = make_config(
        ONE_BACKEND.replace("server: {access_log: false}", 'server: {access_log: false, cors: {allow_origins: ["*"]}}')
    )
    async with gateway_client(cfg, upstream=engine()) as (client, _):
        pre = await client.options("/v1/chat/completions", headers={**PREFLIGHT, "origin": "https://any.example"})
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": "https://any.example"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "*"
    assert r.headers["access-control-allow-origin"] == "*" and "vary" not in r.headers


async def test_a_preflight_on_an_unknown_path_or_a_bare_options_is_not_answered_as_cors():
    async with gateway_client(make_config(CORS_ON), upstream=engine()) as (client, _):
        unknown = await client.options("/v1/nothing", headers=PREFLIGHT)
        bare = await client.options("/v1/chat/completions", headers={"origin": APP})  # no request method: no preflight
    assert unknown.status_code == 404
    assert bare.status_code == 405 and bare.headers["allow"] == "POST"
    assert bare.headers["access-control-allow-origin"] == APP  # an answer to an allowed origin all the same


async def test_with_cors_off_options_is_405_and_no_answer_has_cors_headers():
    async with gateway_client(make_config(ONE_BACKEND), upstream=engine()) as (client, app):
        assert app.cors is None
        for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses"):
            pre = await client.options(path, headers=PREFLIGHT)
            assert pre.status_code == 405, path
            assert cors_headers(pre.headers) == {}
        r = await client.post("/v1/chat/completions", json=CHAT, headers={"origin": APP})
        assert r.status_code == 200 and cors_headers(r.headers) == {}


def test_an_origin_with_a_path_is_refused_by_the_config():
    from llm_gateway.settings.loader import ConfigError

    bad = ONE_BACKEND.replace(
        "server: {access_log: false}", 'server: {access_log: false, cors: {allow_origins: ["https://a.example/app"]}}'
    )
    with pytest.raises(ConfigError, match="is not an origin"):
        make_config(bad)
