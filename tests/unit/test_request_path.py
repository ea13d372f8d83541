"""The request path end to end in-process: client -> gateway (ASGI) -> engine played by a FakeUpstream
at the gateway's own upstream seam (the UpstreamClient protocol both real clients implement)."""

from __future__ import annotations

import httpx
import orjson
import pytest

from tests.conftest import ONE_BACKEND, OTHER_KEY, TEST_KEY, gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream, Reply, Stall, cut, refused, timed_out

ENGINE = "http://engine-a.test"
ENGINE_CHAT = f"{ENGINE}/v1/chat/completions"
CHAT = {"model": "public-model", "messages": [{"role": "user", "content": "hello"}]}


def engine_chat_json(model: str = "upstream-model") -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi there"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
    }


def sse(*events: dict | str) -> bytes:
    out = b""
    for e in events:
        out += b"data: " + (e.encode() if isinstance(e, str) else orjson.dumps(e)) + b"\n\n"
    return out


def chunk(content: str | None = None, finish: str | None = None, model: str = "upstream-model") -> dict:
    delta = {} if content is None else {"content": content}
    return {
        "id": "c1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


USAGE_CHUNK = {
    "id": "c1",
    "object": "chat.completion.chunk",
    "created": 1,
    "model": "upstream-model",
    "choices": [],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def events_of(body: bytes) -> list[str]:
    return [e[len("data: ") :] for e in body.decode().split("\n\n") if e.startswith("data: ")]


TWO_BACKENDS = ONE_BACKEND.replace(
    "models:\n",
    """  - name: engine-b
    engine: sglang
    url: http://engine-b.test
models:
  - name: twin
    deployments:
      - {backend: engine-a, model: upstream-model, format: safetensors}
      - {backend: engine-b, model: upstream-model, format: safetensors}
""",
)


@pytest.fixture
def cfg():
    return make_config(ONE_BACKEND)


def engine(url: str = ENGINE_CHAT, answer: Reply | None = None) -> FakeUpstream:
    """An engine answering POSTs to `url` (by default: a chat completion)."""
    return FakeUpstream({("POST", url): answer if answer is not None else FakeAnswer.json(engine_chat_json())})


# -- the happy path ---------------------------------------------------------------------------------


async def test_chat_is_forwarded_with_model_rewritten_unknown_fields_kept_and_engine_key_not_client_key(cfg):
    up = engine()
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post(
            "/v1/chat/completions",
            json={**CHAT, "top_k": 7, "my_extension": {"a": 1}},
            headers={"x-api-key": "should-not-leak"},
        )
    assert r.status_code == 200, r.text
    sent = up.calls_to(ENGINE_CHAT)[-1]
    assert sent.body is not None
    body = sent.json()
    assert body["model"] == "upstream-model"
    assert body["top_k"] == 7 and body["my_extension"] == {"a": 1}
    assert sent.headers["authorization"] == "Bearer engine-secret-a"
    assert "x-api-key" not in sent.headers
    assert TEST_KEY not in sent.body.decode() and TEST_KEY not in str(sent.headers)
    out = r.json()
    assert out["model"] == "public-model"
    assert out["choices"][0]["message"]["content"] == "hi there"
    assert r.headers["x-gateway-backend"] == "engine-a"
    assert r.headers["x-gateway-engine"] == "vllm"
    assert float(r.headers["x-gateway-overhead-ms"]) >= 0


async def test_alias_resolves_to_the_public_model(cfg):
    async with gateway_client(cfg, upstream=engine()) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "pm"})
    assert r.status_code == 200
    assert r.json()["model"] == "public-model"
    assert r.headers["x-gateway-model"] == "public-model"


async def test_request_id_is_echoed_from_the_client_or_minted(cfg):
    up = engine()
    async with gateway_client(cfg, upstream=up) as (client, _):
        given = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "trace-42"})
        minted = await client.post("/v1/chat/completions", json=CHAT)
        bad = await client.post("/v1/chat/completions", json=CHAT, headers={"x-request-id": "bad id\twith spaces"})
    assert given.headers["x-request-id"] == "trace-42"
    assert len(minted.headers["x-request-id"]) == 24
    assert bad.headers["x-request-id"] != "bad id\twith spaces"
    assert up.calls[0].headers["x-request-id"] == "trace-42"


async def test_completions_and_embeddings_are_proxied(cfg):
    up = FakeUpstream()
    up.route(
        "POST",
        f"{ENGINE}/v1/completions",
        FakeAnswer.json(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "model": "upstream-model",
                "choices": [{"index": 0, "text": "abc", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4},
            }
        ),
    )
    up.route(
        "POST",
        f"{ENGINE}/v1/embeddings",
        FakeAnswer.json(
            {
                "object": "list",
                "model": "upstream-model",
                "data": [{"object": "embedding", "index": 0, "embedding": [0.1]}],
                "usage": {"prompt_tokens": 1, "total_tokens": 1},
            }
        ),
    )
    async with gateway_client(cfg, upstream=up) as (client, _):
        c = await client.post("/v1/completions", json={"model": "public-model", "prompt": "x", "max_tokens": 3})
        e = await client.post("/v1/embeddings", json={"model": "public-model", "input": "x"})
    assert c.status_code == 200 and c.json()["choices"][0]["text"] == "abc" and c.json()["model"] == "public-model"
    assert e.status_code == 200 and e.json()["data"][0]["embedding"] == [0.1]


async def test_stream_asks_engine_for_usage_and_strips_it_when_the_client_did_not(cfg):
    body = sse(chunk("Hel"), chunk("lo"), chunk(finish="stop"), USAGE_CHUNK, "[DONE]")
    up = engine(answer=FakeAnswer.sse(body))
    async with gateway_client(cfg, upstream=up) as (client, app):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    sent = up.calls_to(ENGINE_CHAT)[-1].json()
    assert sent["stream_options"] == {"include_usage": True}
    ev = events_of(r.content)
    assert ev[-1] == "[DONE]"
    assert all('"usage"' not in e for e in ev)
    assert [orjson.loads(e)["choices"][0]["delta"].get("content") for e in ev[:-1]] == ["Hel", "lo", None]
    assert all(orjson.loads(e)["model"] == "public-model" for e in ev[:-1])
    metrics = app.gw.metrics.render().decode()
    assert 'gateway_completion_tokens_total{backend="engine-a",model="public-model"} 2.0' in metrics


async def test_stream_keeps_the_usage_chunk_when_the_client_asked(cfg):
    body = sse(chunk("Hi"), chunk(finish="stop"), USAGE_CHUNK, "[DONE]")
    async with gateway_client(cfg, upstream=engine(answer=FakeAnswer.sse(body))) as (client, _):
        r = await client.post(
            "/v1/chat/completions", json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        )
    ev = events_of(r.content)
    usage = orjson.loads(ev[-2])
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 7


# -- errors the gateway produces ------------------------------------------------------------------------


def assert_envelope(r: httpx.Response, status: int, code: str | None = None, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if code is not None:
        assert err["code"] == code
    if param is not None:
        assert err["param"] == param
    assert r.headers.get("x-request-id")
    return err


async def test_invalid_json_missing_fields_and_wrong_types_are_400(cfg):
    async with gateway_client(cfg) as (client, _):
        bad_json = await client.post(
            "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
        )
        not_object = await client.post("/v1/chat/completions", json=[1, 2])
        no_messages = await client.post("/v1/chat/completions", json={"model": "public-model"})
        no_model = await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
        bad_stream = await client.post("/v1/chat/completions", json={**CHAT, "stream": "yes"})
        bad_utf8 = await client.post(
            "/v1/chat/completions", content=b'{"model": "\xff\xfe"}', headers={"content-type": "application/json"}
        )
        form = await client.post(
            "/v1/chat/completions", content=b"a=b", headers={"content-type": "application/x-www-form-urlencoded"}
        )
    assert_envelope(bad_json, 400, "invalid_json")
    assert_envelope(not_object, 400)
    assert_envelope(no_messages, 400, param="messages")
    assert_envelope(no_model, 400, param="model")
    assert_envelope(bad_stream, 400, param="stream")
    assert_envelope(bad_utf8, 400, "invalid_json")
    assert_envelope(form, 415, "unsupported_media_type")


async def test_unknown_model_is_404_model_not_found(cfg):
    async with gateway_client(cfg) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "no-such-model"})
    err = assert_envelope(r, 404, "model_not_found", "model")
    assert "no-such-model" not in err["message"]  # never echoed (a pasted key would be mirrored)


async def test_body_over_the_limit_is_413():
    cfg = make_config(
        ONE_BACKEND.replace("server: {access_log: false}", "server: {access_log: false, max_body_bytes: 2048}")
    )
    async with gateway_client(cfg) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "pad": "x" * 5000})
    assert_envelope(r, 413, "request_too_large")


async def test_unreachable_engine_is_502_and_timeout_is_504(cfg):
    async with gateway_client(cfg, upstream=engine(answer=refused())) as (client, _):
        r = await client.post("/v1/chat/completions", json=CHAT)
    err = assert_envelope(r, 502, "upstream_unreachable")
    assert "refused" in err["message"] or "connect" in err["message"]
    async with gateway_client(cfg, upstream=engine(answer=timed_out())) as (client, _):
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert_envelope(r, 504, "upstream_timeout")


async def test_no_healthy_backend_is_503_with_retry_after(cfg):
    async with gateway_client(cfg) as (client, app):
        app.gw.runtime.table.backends["engine-a"].state = "down"
        r = await client.post("/v1/chat/completions", json=CHAT)
    assert_envelope(r, 503, "no_healthy_backend")
    assert r.headers["retry-after"]


async def test_engine_errors_are_normalised_and_name_the_backend(cfg):
    answers = [
        FakeAnswer.json({"error": "Unauthorized"}, 401),
        FakeAnswer.json(
            {
                "object": "error",
                "message": "max_tokens too big",
                "type": "BadRequestError",
                "param": "max_tokens",
                "code": 400,
            },
            400,
        ),
        FakeAnswer.text("<html>boom</html>", 500, "text/html"),
    ]
    async with gateway_client(cfg, upstream=engine(answer=answers)) as (client, _):
        auth = await client.post("/v1/chat/completions", json=CHAT)
        bad = await client.post("/v1/chat/completions", json=CHAT)
        boom = await client.post("/v1/chat/completions", json=CHAT)
    err = assert_envelope(auth, 502, "upstream_auth_failed")
    assert "engine-a" in err["message"] and "engine-secret-a" not in err["message"]
    err = assert_envelope(bad, 400, param="max_tokens")
    assert "max_tokens too big" in err["message"] and "engine-a" in err["message"]
    err = assert_envelope(boom, 502)  # an HTML page is no error body: a broken engine (README), not its 500
    assert "HTML" in err["message"] and boom.headers["x-gateway-backend"] == "engine-a"


async def test_error_after_the_first_byte_is_one_sse_error_event_then_the_stream_ends(cfg):
    up = engine(answer=FakeAnswer.sse(sse(chunk("Hel")), cut()))  # the engine drops the connection
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    ev = events_of(r.content)
    assert orjson.loads(ev[0])["choices"][0]["delta"]["content"] == "Hel"
    errors = [orjson.loads(e) for e in ev if e.startswith('{"error"')]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "stream_interrupted"
    assert ev[-1] == "[DONE]"


async def test_an_engine_silent_mid_stream_past_idle_s_ends_the_stream_with_one_timeout_event():
    cfg = make_config(ONE_BACKEND.replace("idle_s: 2,", "idle_s: 0.2,"))
    up = engine(answer=FakeAnswer.sse(sse(chunk("Hel")), Stall(5), sse(chunk("lo"))))
    async with gateway_client(cfg, upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    ev = events_of(r.content)
    assert orjson.loads(ev[0])["choices"][0]["delta"]["content"] == "Hel"
    errors = [orjson.loads(e) for e in ev if e.startswith('{"error"')]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "upstream_timeout"
    assert "lo" not in r.text and ev[-1] == "[DONE]"
    assert up.responses[0].dropped  # the engine's connection was dropped, not left open


async def test_in_band_engine_error_frame_becomes_an_openai_error_event(cfg):
    body = sse(chunk("a"), {"error": {"message": "engine exploded", "type": "InternalServerError", "code": 500}})
    async with gateway_client(cfg, upstream=engine(answer=FakeAnswer.sse(body))) as (client, _):
        r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    ev = events_of(r.content)
    err = orjson.loads(ev[1])["error"]
    assert set(err) == {"message", "type", "param", "code"} and "engine exploded" in err["message"]
    assert ev[-1] == "[DONE]" and len(ev) == 3


async def test_unknown_route_and_wrong_method_get_envelopes(cfg):
    async with gateway_client(cfg) as (client, _):
        assert_envelope(await client.get("/v2/nothing"), 404, "not_found")
        assert_envelope(await client.get("/v1/chat/completions"), 405, "method_not_allowed")


async def test_missing_or_wrong_key_is_401_and_x_api_key_works(cfg):
    async with gateway_client(cfg, key=None) as (client, _):
        missing = await client.post("/v1/chat/completions", json=CHAT)
        wrong = await client.post("/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {OTHER_KEY}"})
        models = await client.get("/v1/models", headers={"x-api-key": TEST_KEY})
    assert_envelope(missing, 401, "missing_api_key")
    assert_envelope(wrong, 401, "invalid_api_key")
    assert OTHER_KEY not in wrong.text
    assert models.status_code == 200


async def test_models_lists_public_names_and_aliases(cfg):
    async with gateway_client(cfg) as (client, _):
        r = await client.get("/v1/models")
        one = await client.get("/v1/models/pm")
        none = await client.get("/v1/models/upstream-model")
    assert [m["id"] for m in r.json()["data"]] == ["public-model", "pm"]
    assert one.json()["id"] == "pm" and one.json()["root"] == "public-model"
    assert_envelope(none, 404, "model_not_found")


async def test_connection_refused_fails_over_to_the_other_deployment():
    # least_load, named: the rotation sends the first request to engine-a, the refused one (the default for two
    # deployments, cache_aware, may place these identical requests on engine-b and never try engine-a)
    cfg = make_config(TWO_BACKENDS.replace("  - name: twin\n", "  - name: twin\n    strategy: least_load\n"))
    up = FakeUpstream(
        {
            ("POST", ENGINE_CHAT): refused(),
            ("POST", "http://engine-b.test/v1/chat/completions"): FakeAnswer.json(engine_chat_json()),
        }
    )
    async with gateway_client(cfg, upstream=up) as (client, app):
        results = [await client.post("/v1/chat/completions", json={**CHAT, "model": "twin"}) for _ in range(4)]
        assert app.gw.runtime.table.backends["engine-a"].state == "down"
    assert all(r.status_code == 200 and r.headers["x-gateway-backend"] == "engine-b" for r in results)
    assert len(up.calls_to(ENGINE_CHAT)) == 1  # refused once, then taken out until a probe sees it again
    assert len(up.calls_to("http://engine-b.test/v1/chat/completions")) == 4


async def test_healthz_and_readyz(cfg):
    async with gateway_client(cfg, key=None) as (client, app):
        assert (await client.get("/healthz")).json() == {"status": "ok"}
        not_ready = await client.get("/readyz")
        app.gw.runtime.table.backends["engine-a"].state = "ready"
        ready = await client.get("/readyz")
    assert not_ready.status_code == 503 and not_ready.json()["backends"]["engine-a"]["state"] == "unknown"
    assert ready.status_code == 200 and ready.json()["status"] == "ready"


async def test_when_every_deployment_is_unavailable_the_configured_fallback_model_serves():
    cfg = make_config(
        TWO_BACKENDS.replace(
            "  - name: twin\n",
            "  - name: primary\n    fallbacks: [twin]\n    deployments:\n"
            "      - {backend: engine-a, model: upstream-model, format: safetensors}\n  - name: twin\n",
        ).replace(
            "      - {backend: engine-a, model: upstream-model, format: safetensors}\n      - {backend: engine-b",
            "      - {backend: engine-b",
        )
    )
    up = FakeUpstream(
        {
            ("POST", ENGINE_CHAT): refused(),
            ("POST", "http://engine-b.test/v1/chat/completions"): FakeAnswer.json(engine_chat_json()),
        }
    )
    async with gateway_client(cfg, upstream=up) as (client, app):
        r = await client.post("/v1/chat/completions", json={**CHAT, "model": "primary"})
        metrics = app.gw.metrics.render().decode()
    assert r.status_code == 200, r.text
    assert r.headers["x-gateway-model"] == "twin" and r.headers["x-gateway-backend"] == "engine-b"
    assert r.json()["model"] == "twin"
    assert 'gateway_model_fallbacks_total{fallback="twin",model="primary"} 1.0' in metrics


async def test_a_request_that_fails_before_any_output_gives_its_reserved_tokens_back():
    cfg = make_config(
        ONE_BACKEND.replace(
            '{name: alice, sha256: "${ALICE_SHA}"}', '{name: alice, sha256: "${ALICE_SHA}", limits: {tpm: 1000}}'
        )
    )
    up = engine(answer=[refused(), FakeAnswer.json(engine_chat_json())])
    async with gateway_client(cfg, upstream=up) as (client, app):
        failed = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 100})
        app.gw.runtime.table.backends["engine-a"].state = "ready"  # as the next probe would see it
        app.gw.runtime.table.models[0].deployments[0].breaker.success()
        ok = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 100})
    assert failed.status_code == 502 and ok.status_code == 200
    # each reserves 106 tokens (a 6-token prompt estimate + max_tokens 100); the failed one gave its back
    assert int(failed.headers["x-ratelimit-remaining-tokens"]) == 1000 - 106  # quota headers on errors too
    assert int(ok.headers["x-ratelimit-remaining-tokens"]) == 1000 - 106


async def test_an_engine_lacking_one_endpoint_does_not_open_the_breaker_for_the_others(cfg):
    up = engine()
    up.route("POST", f"{ENGINE}/v1/embeddings", FakeAnswer.json({"detail": "Not Found"}, 404))
    async with gateway_client(cfg, upstream=up) as (client, app):
        for _ in range(8):  # more than breaker_failures (5)
            r = await client.post("/v1/embeddings", json={"model": "public-model", "input": "x"})
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_model_not_found"
        chat = await client.post("/v1/chat/completions", json=CHAT)
        assert app.gw.runtime.table.models[0].deployments[0].breaker.state == "closed"
    assert chat.status_code == 200
