"""Engine error bodies of every shape, and the status mapping into the OpenAI envelope."""

from __future__ import annotations

import orjson
import pytest

from llm_gateway.adapters.error_bodies import EngineError, parse_error_body, upstream_error

# -- parse_error_body --------------------------------------------------------------------------------


def test_nested_openai_error_keeps_message_type_code_and_param():
    body = (
        b'{"error":{"message":"temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",'
        b'"type":"BadRequestError","param":"temperature","code":400}}'
    )
    assert parse_error_body(body, "application/json") == EngineError(
        "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",
        "BadRequestError",
        "400",
        "temperature",
    )


def test_nested_llama_server_error_with_integer_code():
    body = b'{"error":{"code":400,"message":"Expected \'messages\' to be an array","type":"invalid_request_error"}}'
    assert parse_error_body(body) == EngineError(
        "Expected 'messages' to be an array", "invalid_request_error", "400", None
    )


def test_nested_error_without_a_message_gets_a_generic_one():
    assert parse_error_body(b'{"error":{"type":"x"}}') == EngineError("engine error", "x", None, None)


def test_nested_error_with_a_non_string_message_is_serialised():
    assert parse_error_body(b'{"error":{"message":{"why":"nope"}}}').message == '{"why":"nope"}'


def test_boolean_codes_are_dropped():
    assert parse_error_body(b'{"error":{"message":"m","code":false}}').code is None


def test_string_error_like_vllm_and_sglang_auth():
    assert parse_error_body(b'{"error":"Unauthorized"}') == EngineError("Unauthorized", None, None, None)


def test_ollama_native_string_error():
    body = b'{"error":"model \\"nope\\" not found, try pulling it first"}'
    assert parse_error_body(body).message == 'model "nope" not found, try pulling it first'


def test_empty_string_error_gets_a_generic_message():
    assert parse_error_body(b'{"error":""}').message == "engine error"


def test_tgi_error_with_error_type():
    body = b'{"error":"Input validation error: `inputs` must have less than 4096 tokens","error_type":"validation"}'
    assert parse_error_body(body) == EngineError(
        "Input validation error: `inputs` must have less than 4096 tokens", "validation", None, None
    )


def test_flat_object_error_from_sglang_lmdeploy_and_old_vllm():
    body = (
        b'{"object":"error","message":"The model \'x\' does not exist.","type":"invalid_request_error",'
        b'"param":null,"code":404}'
    )
    assert parse_error_body(body) == EngineError("The model 'x' does not exist.", "invalid_request_error", "404", None)


def test_fastapi_detail_string():
    assert parse_error_body(b'{"detail":"Invalid API key"}') == EngineError("Invalid API key")


def test_fastapi_validation_list_is_summarised_without_the_body_prefix():
    body = orjson.dumps(
        {
            "detail": [
                {"type": "missing", "loc": ["body", "messages"], "msg": "Field required", "input": {}},
                {"type": "float_parsing", "loc": ["body", "temperature"], "msg": "Input should be a valid number"},
                {"type": "x", "loc": ["body", "messages", 0, "role"], "msg": "Input should be 'user'"},
            ]
        }
    )
    assert parse_error_body(body).message == (
        "messages: Field required; temperature: Input should be a valid number; messages.0.role: Input should be 'user'"
    )


def test_validation_list_item_whose_location_is_only_the_body_gives_the_bare_message():
    body = b'{"detail":[{"loc":["body"],"msg":"JSON decode error"}]}'
    assert parse_error_body(body).message == "JSON decode error"


def test_validation_list_is_capped_at_five_items():
    body = orjson.dumps({"detail": [{"loc": ["body", f"f{i}"], "msg": "bad"} for i in range(8)]})
    assert parse_error_body(body).message == "; ".join(f"f{i}: bad" for i in range(5))


def test_empty_or_odd_validation_list_says_invalid_request():
    assert parse_error_body(b'{"detail":[]}').message == "invalid request"
    assert parse_error_body(b'{"detail":["just a string"]}').message == "invalid request"


def test_detail_that_is_an_object_is_serialised():
    assert parse_error_body(b'{"detail":{"reason":"x"}}').message == '{"reason":"x"}'


def test_json_object_of_an_unknown_shape_is_quoted():
    assert parse_error_body(b'{"status":"failed","why":42}').message == 'engine error: {"status":"failed","why":42}'


def test_html_page_is_named_not_quoted():
    html = b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>"
    assert parse_error_body(html, "text/html").message == "the engine answered with an HTML page instead of JSON"
    assert parse_error_body(b"  \n" + html).message == "the engine answered with an HTML page instead of JSON"


def test_html_content_type_wins_even_without_a_leading_angle_bracket():
    assert parse_error_body(b"Loading model", "text/html; charset=utf-8").message == (
        "the engine answered with an HTML page instead of JSON"
    )


@pytest.mark.parametrize("body", [b"", b"   ", b"\r\n"])
def test_empty_body(body: bytes):
    assert parse_error_body(body) == EngineError("the engine answered with an empty body")


def test_plain_text_body_is_quoted_on_one_line_and_truncated():
    assert parse_error_body(b"404 page not found\n", "text/plain").message == "404 page not found"
    assert parse_error_body(b"line one\nline two").message == "line one line two"
    assert parse_error_body(b"x" * 1000).message == "x" * 200


def test_invalid_utf8_is_replaced_not_raised():
    assert parse_error_body(b"bad \xff byte").message == "bad \ufffd byte"


def test_json_that_is_not_an_object_is_quoted_as_text():
    assert parse_error_body(b'["a", "b"]').message == '["a", "b"]'


def test_a_long_json_error_body_still_yields_its_message():
    long_msg = "prompt contains invalid tokens: " + "tok " * 1500
    body = orjson.dumps({"error": {"message": long_msg, "type": "BadRequestError", "code": 400}})
    assert parse_error_body(body).message == long_msg


# -- upstream_error ----------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [401, 403])
def test_engine_auth_failures_are_the_gateways_problem_502(status: int):
    e = upstream_error("gpu-1", "vllm", status, EngineError("Unauthorized"))
    assert (e.status, e.type, e.code, e.retryable, e.backend) == (
        502,
        "upstream_error",
        "upstream_auth_failed",
        True,
        "gpu-1",
    )
    assert e.message == (
        "backend 'gpu-1' (vllm) rejected the gateway's credentials (check backends[].api_key): Unauthorized"
    )


def test_400_is_passed_on_as_a_client_error():
    err = EngineError("max_tokens is too large", "BadRequestError", "context_length_exceeded", "max_tokens")
    e = upstream_error("gpu-1", "vllm", 400, err)
    assert (e.status, e.type, e.code, e.param, e.retryable, e.busy) == (
        400,
        "invalid_request_error",
        "context_length_exceeded",
        "max_tokens",
        False,
        False,
    )
    assert e.message == "max_tokens is too large (backend 'gpu-1' (vllm))"
    assert e.envelope() == {
        "error": {
            "message": "max_tokens is too large (backend 'gpu-1' (vllm))",
            "type": "invalid_request_error",
            "param": "max_tokens",
            "code": "context_length_exceeded",
        }
    }


def test_422_validation_error_becomes_400():
    e = upstream_error("tb", "tabbyapi", 422, EngineError("messages: Field required"))
    assert (e.status, e.type) == (400, "invalid_request_error")


def test_404_and_409_keep_their_status_as_client_errors():
    assert upstream_error("b", "k", 404, EngineError("x")).status == 404
    assert upstream_error("b", "k", 409, EngineError("x")).status == 409


def test_429_is_busy_with_rate_limit_type_and_retryable_only_when_asked():
    e = upstream_error("b", "k", 429, EngineError("slow down"))
    assert (e.status, e.type, e.busy, e.retryable) == (429, "rate_limit_exceeded", True, False)
    assert upstream_error("b", "k", 429, EngineError("slow down"), retryable=True).retryable is True


def test_a_500_forced_to_client_error_becomes_400():
    e = upstream_error("b", "llama-server", 500, EngineError("Failed to parse json"), client_error=True)
    assert (e.status, e.type) == (400, "invalid_request_error")


def test_a_4xx_forced_to_server_error_becomes_502():
    e = upstream_error("b", "k", 400, EngineError("x"), client_error=False)
    assert (e.status, e.type, e.code) == (502, "upstream_error", "upstream_error")


@pytest.mark.parametrize(("status", "retryable"), [(500, False), (501, False), (502, True), (503, True), (504, True)])
def test_5xx_keeps_its_status_and_retries_gateway_type_failures_by_default(status: int, retryable: bool):
    e = upstream_error("gpu-1", "vllm", status, EngineError("EngineCore encountered an issue.", code="500"))
    assert (e.status, e.type, e.retryable) == (status, "upstream_error", retryable)
    assert e.message == "backend 'gpu-1' (vllm) failed: EngineCore encountered an issue."


def test_5xx_numeric_codes_are_replaced_but_named_codes_kept():
    assert upstream_error("b", "k", 500, EngineError("x", code="500")).code == "upstream_error"
    assert upstream_error("b", "k", 500, EngineError("x")).code == "upstream_error"
    assert upstream_error("b", "k", 503, EngineError("x", code="engine_unavailable")).code == "engine_unavailable"


def test_explicit_retryable_and_busy_override_the_defaults_for_5xx():
    e = upstream_error("b", "k", 503, EngineError("x"), retryable=False, busy=True)
    assert (e.retryable, e.busy) == (False, True)


@pytest.mark.parametrize("status", [200, 302, 600, 0])
def test_statuses_outside_4xx_5xx_become_502(status: int):
    assert upstream_error("b", "k", status, EngineError("x")).status == 502


def test_client_error_does_not_echo_a_numeric_status_as_its_code():
    err = parse_error_body(b'{"error":{"message":"bad","type":"BadRequestError","param":null,"code":400}}')
    assert upstream_error("gpu-1", "vllm", 400, err).code is None
