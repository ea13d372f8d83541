"""LMDeployAdapter across LMDeploy releases: every release's 401 becomes the same gateway error, and the
bare 200 of older releases' /health counts as ready.

Bodies as the releases send them (InternLM/lmdeploy): v0.12.1 @e5df4e8336cd `check_api_key` raises
FastAPI's HTTPException; v0.12.2 to v0.15.x `AuthenticationMiddleware` answers `{"error":"Unauthorized"}`;
HEAD @1263d5cd8 (v0.16.0 on) answers the flat protocol error. /health is `Response(status_code=200)`
before v0.14.0 and the health monitor's JSON from v0.14.0."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
import pytest

from llm_gateway.adapters.lmdeploy import LMDeployAdapter, unwrap_http_exception
from llm_gateway.types import BackendInfo, ProbeResult

KEY = "lm-engine-secret"
HEAD_401 = b'{"message":"Unauthorized.","type":"authentication_error","code":401,"param":null,"object":"error"}'
MIDDLEWARE_401 = b'{"error":"Unauthorized"}'
LEGACY_401 = (
    b'{"detail":{"error":{"message":"Please request with valid api key!","type":"invalid_request_error",'
    b'"param":null,"code":"invalid_api_key"}}}'
)
JSON = "application/json"


def adapter() -> LMDeployAdapter:
    return LMDeployAdapter(BackendInfo("lm-1", "http://lm-1.test:23333", KEY))


def answer(body: bytes, status: int = 401) -> dict[str, object]:
    err = adapter().error(status, body, JSON)
    return {
        "class": type(err).__name__,
        "status": err.status,
        "type": err.type,
        "code": err.code,
        "param": err.param,
        "retryable": err.retryable,
        "busy": err.busy,
        "backend": err.backend,
    }


@pytest.mark.parametrize("body", [LEGACY_401, MIDDLEWARE_401], ids=["v0.12.1-http-exception", "v0.12.2-middleware"])
def test_older_401_bodies_become_the_same_gateway_error_as_the_newer_one(body: bytes) -> None:
    assert (
        answer(body)
        == answer(HEAD_401)
        == {
            "class": "EngineErrorAnswer",
            "status": 502,  # the gateway's own engine key is wrong: not the client's problem
            "type": "upstream_error",
            "code": "upstream_auth_failed",
            "param": None,
            "retryable": True,
            "busy": False,
            "backend": "lm-1",
        }
    )


@pytest.mark.parametrize(
    ("body", "engine_says"),
    [
        (HEAD_401, "Unauthorized."),
        (MIDDLEWARE_401, "Unauthorized"),
        (LEGACY_401, "Please request with valid api key!"),
    ],
)
def test_the_message_names_the_backend_and_quotes_the_engine_in_words(body: bytes, engine_says: str) -> None:
    msg = adapter().error(401, body, JSON).message
    assert msg == (
        f"backend 'lm-1' (lmdeploy) rejected the gateway's credentials (check backends[].api_key): {engine_says}"
    )
    assert "{" not in msg and KEY not in msg


def test_the_envelope_of_an_old_401_is_the_openai_one() -> None:
    old = orjson.loads(adapter().error(401, LEGACY_401, JSON).body())["error"]
    new = orjson.loads(adapter().error(401, HEAD_401, JSON).body())["error"]
    assert set(old) == set(new) == {"message", "type", "param", "code"}
    assert {k: v for k, v in old.items() if k != "message"} == {k: v for k, v in new.items() if k != "message"}


@pytest.mark.parametrize(
    "body",
    [b'{"detail":"Not Found"}', b'{"detail":[{"loc":["body","messages"],"msg":"Field required"}]}', b"<html>", b""],
)
def test_other_bodies_are_left_as_they_are(body: bytes) -> None:
    assert unwrap_http_exception(body) == body


def test_an_http_exception_body_is_unwrapped_to_its_openai_error() -> None:
    inner = orjson.loads(LEGACY_401)["detail"]
    assert orjson.loads(unwrap_http_exception(LEGACY_401)) == inner
    assert unwrap_http_exception(b'{"detail":{"error":{"message":"x"}},"more":1}').startswith(b'{"detail"')


def test_a_legacy_404_for_a_model_is_still_model_not_found() -> None:
    body = (
        b'{"message":"The model \'nope\' does not exist.","type":"invalid_request_error","code":404,'
        b'"param":null,"object":"error"}'
    )
    err = adapter().error(404, body, JSON)
    assert (err.status, err.code) == (502, "upstream_model_not_found")


# -- /health ---------------------------------------------------------------------------------------------


class Client:
    def __init__(self, routes: Mapping[str, tuple[int, bytes]]) -> None:
        self.routes = dict(routes)
        self.paths: list[str] = []

    async def get(self, path: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
        self.paths.append(path)
        return self.routes.get(path, (404, b'{"detail":"Not Found"}'))

    def now(self) -> float:
        return 1000.0


MODELS = (200, b'{"object":"list","data":[{"id":"internlm3","object":"model","owned_by":"lmdeploy"}]}')
METRICS = (
    200,
    b"# TYPE lmdeploy:num_requests_running gauge\n"
    b'lmdeploy:num_requests_running{engine="0",model_name="internlm3"} 1.0\n',
)


@pytest.mark.parametrize(
    "health",
    [(200, b""), (200, b'{"status":"healthy","message":"Engine is healthy."}')],
    ids=["before-v0.14-bare-200", "v0.14-healthy"],
)
async def test_an_empty_200_health_counts_as_ready_like_a_healthy_one(health: tuple[int, bytes]) -> None:
    client = Client({"/health": health, "/v1/models": MODELS, "/metrics": METRICS})
    res = await adapter().probe(client)
    assert (res.state, res.detail, res.models) == ("ready", "", frozenset({"internlm3"}))
    assert client.paths[0] == "/health" and "/v1/models" in client.paths


@pytest.mark.parametrize(
    ("health", "want"),
    [
        ((503, b""), ProbeResult("loading", detail="/health answered 503")),
        (
            (200, b'{"status":"sleeping","message":"Engine is sleeping."}'),
            ProbeResult("loading", detail="/health says sleeping"),
        ),
        ((503, b'{"status":"unhealthy","message":"x"}'), ProbeResult("down", detail="/health says unhealthy")),
    ],
)
async def test_non_ready_health_answers(health: tuple[int, bytes], want: ProbeResult) -> None:
    res = await adapter().probe(Client({"/health": health, "/v1/models": MODELS}))
    assert (res.state, res.detail) == (want.state, want.detail)
