"""OpenAI-compatible adapters: build()/translate(), response_body(), error()/classify(), stream frames."""

from __future__ import annotations

import copy

import orjson
import pytest

from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.adapters.openai_generic import GenericOpenAIAdapter
from llm_gateway.adapters.registry import ADAPTERS, adapter_for, formats_for, unsupported_capabilities
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.errors import EngineErrorAnswer, InvalidRequest, UpstreamProtocolError
from llm_gateway.types import BackendInfo, CallContext, Usage

COMPAT = [LlamaServerAdapter, VLLMAdapter, SGLangAdapter, TabbyAPIAdapter, LMDeployAdapter, GenericOpenAIAdapter]
HI = [{"role": "user", "content": "hi"}]


def make(cls: type[OpenAICompatAdapter], key: str | None = "engine-secret") -> OpenAICompatAdapter:
    return cls(BackendInfo("gpu-1", "http://gpu-1.test", key))


def ctx(endpoint: str = "chat", stream: bool = False, reasoning_field: str = "reasoning_content") -> CallContext:
    return CallContext(endpoint, "public-model", "upstream-model", stream, False, "req-42", reasoning_field)


def sent(a: OpenAICompatAdapter, body: dict, endpoint: str = "chat", stream: bool = False) -> dict:
    req = a.build(endpoint, body, ctx(endpoint, stream))
    assert req.body is not None
    return orjson.loads(req.body)


# -- registry ----------------------------------------------------------------------------------------


def test_registry_knows_every_engine_kind():
    assert set(ADAPTERS) == {"llama-server", "vllm", "sglang", "ollama", "tabbyapi", "lmdeploy", "openai"} | {
        "aphrodite",
        "trtllm",
        "mlx",
        "mlc",
        "tgi",
        "dynamo",
        "lmstudio",
    }
    assert isinstance(adapter_for("ollama", BackendInfo("o", "http://o")), OllamaAdapter)
    assert isinstance(adapter_for("openai", BackendInfo("o", "http://o")), GenericOpenAIAdapter)


def test_registry_formats_and_capabilities():
    assert formats_for("llama-server") == frozenset({"gguf"})
    assert formats_for("tabbyapi") == frozenset({"exl2", "exl3"})
    assert formats_for("openai") is None
    # routes outside a generation: /tokenize (vLLM, llama-server), rerank (both), /score and /v1/audio (vLLM)
    assert unsupported_capabilities("lmdeploy") == frozenset({"embeddings", "tokenize", "rerank", "score", "audio"})
    assert unsupported_capabilities("vllm") == frozenset()
    assert unsupported_capabilities("llama-server") == frozenset({"score", "audio"})


def test_engines_that_report_load_are_flagged():
    assert {k for k, cls in ADAPTERS.items() if cls.reports_load} == {"llama-server", "vllm", "sglang", "lmdeploy"} | {
        "aphrodite",
        "tgi",
        "dynamo",
    }


def test_api_key_never_appears_in_the_backend_repr():
    assert "engine-secret" not in repr(BackendInfo("b", "http://b", "engine-secret"))


# -- build: shared behaviour -------------------------------------------------------------------------


@pytest.mark.parametrize("cls", COMPAT)
@pytest.mark.parametrize(
    ("endpoint", "path"),
    [("chat", "/v1/chat/completions"), ("completions", "/v1/completions"), ("embeddings", "/v1/embeddings")],
)
def test_build_posts_to_the_openai_path_with_the_upstream_model(cls, endpoint: str, path: str):
    req = make(cls).build(endpoint, {"model": "public-model", "input": "x", "prompt": "x"}, ctx(endpoint))
    assert (req.method, req.path) == ("POST", path)
    assert orjson.loads(req.body)["model"] == "upstream-model"
    assert req.headers["X-Request-Id"] == "req-42"
    assert req.headers["Content-Type"] == "application/json"


@pytest.mark.parametrize("cls", [c for c in COMPAT if c is not TabbyAPIAdapter])
def test_engine_key_is_sent_as_bearer(cls):
    headers = make(cls).build("chat", {"messages": HI}, ctx()).headers
    assert headers["Authorization"] == "Bearer engine-secret"
    assert "x-api-key" not in headers


def test_tabbyapi_key_is_sent_as_x_api_key():
    headers = make(TabbyAPIAdapter).build("chat", {"messages": HI}, ctx()).headers
    assert headers["x-api-key"] == "engine-secret"
    assert "Authorization" not in headers


@pytest.mark.parametrize("cls", COMPAT)
def test_no_engine_key_means_no_auth_header(cls):
    headers = make(cls, key=None).build("chat", {"messages": HI}, ctx()).headers
    assert set(headers) == {"Content-Type", "X-Request-Id"}


@pytest.mark.parametrize("cls", COMPAT)
def test_streams_always_ask_the_engine_for_usage(cls):
    assert sent(make(cls), {"messages": HI, "stream": True}, stream=True)["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("cls", COMPAT)
def test_include_usage_is_forced_on_while_other_stream_options_are_kept(cls):
    body = {"messages": HI, "stream": True, "stream_options": {"include_usage": False, "continuous_usage_stats": True}}
    assert sent(make(cls), body, stream=True)["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


@pytest.mark.parametrize("cls", [c for c in COMPAT if c is not TabbyAPIAdapter])
def test_non_streamed_requests_get_no_stream_options(cls):
    assert "stream_options" not in sent(make(cls), {"messages": HI})


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_tabbyapi_whole_answers_ask_for_usage_too(endpoint: str):
    out = sent(make(TabbyAPIAdapter), {"messages": HI, "prompt": "x"}, endpoint)
    assert out["stream_options"] == {"include_usage": True}


def test_tabbyapi_embeddings_get_no_stream_options():
    assert "stream_options" not in sent(make(TabbyAPIAdapter), {"input": "x"}, "embeddings")


@pytest.mark.parametrize("cls", COMPAT)
@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_chat_sends_both_token_limit_fields(cls, field: str):
    out = sent(make(cls), {"messages": HI, field: 77})
    assert (out["max_tokens"], out["max_completion_tokens"]) == (77, 77)


@pytest.mark.parametrize("cls", COMPAT)
def test_max_completion_tokens_wins_when_both_are_given(cls):
    out = sent(make(cls), {"messages": HI, "max_tokens": 10, "max_completion_tokens": 20})
    assert (out["max_tokens"], out["max_completion_tokens"]) == (20, 20)


@pytest.mark.parametrize("cls", COMPAT)
def test_completions_keep_only_max_tokens(cls):
    out = sent(make(cls), {"prompt": "x", "max_tokens": 5}, "completions")
    assert out["max_tokens"] == 5
    assert "max_completion_tokens" not in out


@pytest.mark.parametrize("cls", COMPAT)
def test_build_never_mutates_the_callers_body(cls):
    body = {
        "model": "public-model",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": False},
        "max_tokens": 9,
        "repeat_penalty": 1.1,
        "repetition_penalty": 1.2,
        "guided_json": {"type": "object"},
        "structured_outputs": {"regex": "a+"},
        "response_format": {"type": "json_object"},
    }
    before = copy.deepcopy(body)
    sent(make(cls), body, stream=True)
    assert body == before


@pytest.mark.parametrize("cls", COMPAT)
def test_unknown_fields_pass_through(cls):
    assert sent(make(cls), {"messages": HI, "chat_template_kwargs": {"enable_thinking": False}})[
        "chat_template_kwargs"
    ] == {"enable_thinking": False}


# -- build: per-engine translations ------------------------------------------------------------------


def test_llama_server_renames_repetition_penalty_to_repeat_penalty():
    out = sent(make(LlamaServerAdapter), {"messages": HI, "repetition_penalty": 1.3})
    assert out["repeat_penalty"] == 1.3 and "repetition_penalty" not in out


def test_llama_server_keeps_an_explicit_repeat_penalty():
    out = sent(make(LlamaServerAdapter), {"messages": HI, "repeat_penalty": 1.1, "repetition_penalty": 1.3})
    assert (out["repeat_penalty"], out["repetition_penalty"]) == (1.1, 1.3)


def test_llama_server_drops_harmless_completion_fields_it_would_refuse():
    out = sent(make(LlamaServerAdapter), {"prompt": "x", "echo": False, "best_of": 1, "suffix": ""}, "completions")
    assert not {"echo", "best_of", "suffix"} & set(out)


@pytest.mark.parametrize(("field", "value"), [("echo", True), ("best_of", 3), ("suffix", "end")])
def test_llama_server_refuses_completion_fields_it_cannot_honour(field: str, value):
    with pytest.raises(InvalidRequest) as ei:
        sent(make(LlamaServerAdapter), {"prompt": "x", field: value}, "completions")
    assert (ei.value.status, ei.value.param, ei.value.code) == (400, field, "unsupported_parameter")


def test_llama_server_leaves_echo_alone_on_chat():
    assert sent(make(LlamaServerAdapter), {"messages": HI, "echo": True})["echo"] is True


@pytest.mark.parametrize("cls", [VLLMAdapter, SGLangAdapter, TabbyAPIAdapter, LMDeployAdapter])
def test_repeat_penalty_becomes_repetition_penalty(cls):
    out = sent(make(cls), {"messages": HI, "repeat_penalty": 1.15})
    assert out["repetition_penalty"] == 1.15 and "repeat_penalty" not in out


@pytest.mark.parametrize(
    ("field", "key", "value"),
    [
        ("guided_json", "json", {"type": "object"}),
        ("guided_regex", "regex", "[a-z]+"),
        ("guided_choice", "choice", ["yes", "no"]),
        ("guided_grammar", "grammar", "root ::= 'a'"),
    ],
)
def test_vllm_legacy_guided_fields_become_structured_outputs(field: str, key: str, value):
    out = sent(make(VLLMAdapter), {"messages": HI, field: value})
    assert out["structured_outputs"] == {key: value}
    assert field not in out


def test_vllm_explicit_structured_outputs_win_over_legacy_fields():
    out = sent(
        make(VLLMAdapter),
        {
            "messages": HI,
            "guided_json": {"legacy": True},
            "guided_regex": "a",
            "structured_outputs": {"json": {"new": 1}},
        },
    )
    assert out["structured_outputs"] == {"json": {"new": 1}, "regex": "a"}


def test_tabbyapi_json_object_becomes_tabbys_json_type():
    assert sent(make(TabbyAPIAdapter), {"messages": HI, "response_format": {"type": "json_object"}})[
        "response_format"
    ] == {"type": "json"}


def test_tabbyapi_json_schema_is_left_alone():
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert sent(make(TabbyAPIAdapter), {"messages": HI, "response_format": rf})["response_format"] == rf


def test_generic_openai_adapter_translates_nothing():
    body = {"messages": HI, "repeat_penalty": 1.1, "guided_json": {}, "response_format": {"type": "json_object"}}
    out = sent(make(GenericOpenAIAdapter), body)
    assert {k: out[k] for k in ("repeat_penalty", "guided_json", "response_format")} == {
        "repeat_penalty": 1.1,
        "guided_json": {},
        "response_format": {"type": "json_object"},
    }


# -- response_body -----------------------------------------------------------------------------------

LLAMA_CHAT = (
    b'{"choices":[{"finish_reason":"length","index":0,"message":{"role":"assistant","content":" wherei55"}}],'
    b'"created":1796008468,"model":"tiny-llama","system_fingerprint":"b0-unknown","object":"chat.completion",'
    b'"usage":{"completion_tokens":4,"prompt_tokens":25,"total_tokens":29,"prompt_tokens_details":{"cached_tokens":24}},'
    b'"id":"chatcmpl-sjIUpLYgulcK98FMvk2ZPOon2WMVwbuP","timings":{"cache_n":24,"prompt_n":1}}'
)


def test_response_body_swaps_in_the_public_model_and_reports_usage():
    body, usage = make(LlamaServerAdapter).response_body(LLAMA_CHAT, ctx())
    obj = orjson.loads(body)
    assert obj["model"] == "public-model"
    assert usage == Usage(25, 4)
    assert obj["choices"] == orjson.loads(LLAMA_CHAT)["choices"]
    assert obj["timings"] == {"cache_n": 24, "prompt_n": 1}


def test_vllm_reasoning_is_renamed_to_the_configured_field():
    raw = (
        b'{"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"4","reasoning":"2+2"},'
        b'"finish_reason":"stop"}]}'
    )
    msg = orjson.loads(make(VLLMAdapter).response_body(raw, ctx())[0])["choices"][0]["message"]
    assert msg == {"role": "assistant", "content": "4", "reasoning_content": "2+2"}


def test_reasoning_content_is_renamed_when_the_gateway_is_configured_for_reasoning():
    raw = b'{"choices":[{"index":0,"message":{"content":"4","reasoning_content":"2+2"},"finish_reason":"stop"}]}'
    msg = orjson.loads(make(SGLangAdapter).response_body(raw, ctx(reasoning_field="reasoning"))[0])["choices"][0][
        "message"
    ]
    assert msg == {"content": "4", "reasoning": "2+2"}


def test_response_without_usage_reports_none():
    assert make(VLLMAdapter).response_body(b'{"choices":[]}', ctx())[1] is None


def test_sglang_abort_finish_reason_is_a_failed_generation():
    raw = b'{"model":"m","choices":[{"index":0,"message":{"content":""},"finish_reason":"abort"}]}'
    with pytest.raises(EngineErrorAnswer) as ei:
        make(SGLangAdapter).response_body(raw, ctx())
    assert (ei.value.status, ei.value.code) == (502, "generation_failed")


def test_lmdeploy_parse_error_finish_reason_becomes_stop():
    raw = b'{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"parse_error"}]}'
    obj = orjson.loads(make(LMDeployAdapter).response_body(raw, ctx())[0])
    assert obj["choices"][0]["finish_reason"] == "stop"


def test_lmdeploy_error_finish_reason_fails():
    raw = b'{"choices":[{"index":0,"message":{"content":"x"},"finish_reason":"error"}]}'
    with pytest.raises(EngineErrorAnswer):
        make(LMDeployAdapter).response_body(raw, ctx())


def test_an_error_object_in_a_2xx_body_is_raised():
    raw = b'{"error":{"message":"out of memory","type":"InternalServerError","param":null,"code":500}}'
    with pytest.raises(EngineErrorAnswer) as ei:
        make(VLLMAdapter).response_body(raw, ctx())
    assert (ei.value.status, ei.value.code) == (502, "upstream_stream_error")
    raw2 = b'{"error":{"message":"bad","code":400}}'
    with pytest.raises(EngineErrorAnswer) as ei2:
        make(VLLMAdapter).response_body(raw2, ctx())
    assert ei2.value.status == 400


def test_embeddings_body_with_data_is_not_mistaken_for_an_error():
    raw = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1]}],"model":"e","error":null}'
    obj = orjson.loads(make(VLLMAdapter).response_body(raw, ctx("embeddings"))[0])
    assert obj["data"][0]["embedding"] == [0.1]


@pytest.mark.parametrize("raw", [b"<html>502</html>", b"", b'"just a string"'])
def test_a_2xx_body_that_is_not_a_json_object_is_a_protocol_error(raw: bytes):
    with pytest.raises(UpstreamProtocolError) as ei:
        make(VLLMAdapter).response_body(raw, ctx())
    assert (ei.value.status, ei.value.retryable) == (502, True)


# -- error / classify --------------------------------------------------------------------------------


def err(cls, status: int, body: bytes, ct: str = "application/json") -> EngineErrorAnswer:
    return make(cls).error(status, body, ct)


def test_llama_server_500_about_the_request_is_a_400():
    body = (
        b'{"error":{"code":500,"message":"[json.exception.type_error.302] type must be string, but is number",'
        b'"type":"server_error"}}'
    )
    e = err(LlamaServerAdapter, 500, body)
    assert (e.status, e.type, e.retryable) == (400, "invalid_request_error", False)


@pytest.mark.parametrize(
    "message",
    [
        "Only one completion choice is allowed",
        "tools param requires --jinja flag",
        "Unsupported response_format type",
        "top_logprobs requires logprobs to be set to true",
    ],
)
def test_llama_server_500_with_a_request_field_message_is_a_client_error(message: str):
    body = orjson.dumps({"error": {"code": 500, "message": message, "type": "server_error"}})
    assert err(LlamaServerAdapter, 500, body).status == 400


def test_llama_server_500_about_the_server_stays_500():
    body = b'{"error":{"code":500,"message":"failed to decode the batch","type":"server_error"}}'
    e = err(LlamaServerAdapter, 500, body)
    assert (e.status, e.type, e.code, e.retryable) == (500, "upstream_error", "upstream_error", False)


def test_llama_server_exceeded_context_is_context_length_exceeded():
    body = (
        b'{"error":{"code":400,"message":"request (10022 tokens) exceeds the available context size (2048 tokens), '
        b'try increasing it","type":"exceed_context_size_error","n_prompt_tokens":10022,"n_ctx":2048}}'
    )
    e = err(LlamaServerAdapter, 400, body)
    assert (e.status, e.type, e.code) == (400, "invalid_request_error", "context_length_exceeded")
    assert e.message.startswith("request (10022 tokens) exceeds the available context size")


def test_llama_server_501_not_supported_is_retryable_elsewhere():
    body = b'{"error":{"code":501,"message":"This server does not support embeddings.","type":"not_supported_error"}}'
    e = err(LlamaServerAdapter, 501, body)
    assert (e.status, e.code, e.retryable) == (502, "upstream_not_supported", True)


def test_llama_server_503_loading_is_retryable():
    body = b'{"error":{"message":"Loading model","type":"unavailable_error","code":503}}'
    e = err(LlamaServerAdapter, 503, body)
    assert (e.status, e.retryable, e.busy) == (503, True, False)


def test_llama_server_invalid_key_is_the_gateways_credentials_problem():
    e = err(
        LlamaServerAdapter, 401, b'{"error":{"message":"Invalid API Key","type":"authentication_error","code":401}}'
    )
    assert (e.status, e.code) == (502, "upstream_auth_failed")


@pytest.mark.parametrize("cls", COMPAT)
def test_404_means_this_backend_lacks_the_model_and_another_may_have_it(cls):
    e = err(cls, 404, b'{"error":{"message":"The model `nope` does not exist.","type":"NotFoundError","code":404}}')
    assert (e.status, e.code, e.retryable) == (502, "upstream_model_not_found", True)
    assert "does not exist" in e.message


def test_vllm_400_keeps_param_and_message():
    body = (
        b'{"error":{"message":"temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0)",'
        b'"type":"BadRequestError","param":"temperature","code":400}}'
    )
    e = err(VLLMAdapter, 400, body)
    assert (e.status, e.param, e.retryable) == (400, "temperature", False)
    assert e.message == (
        "temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0) (backend 'gpu-1' (vllm))"
    )


def test_vllm_unauthorized_is_the_gateways_credentials_problem():
    e = err(VLLMAdapter, 401, b'{"error":"Unauthorized"}')
    assert (e.status, e.code, e.retryable) == (502, "upstream_auth_failed", True)


def test_vllm_engine_dead_500_is_not_retried():
    body = (
        b'{"error":{"message":"EngineCore encountered an issue.","type":"InternalServerError","param":null,"code":500}}'
    )
    e = err(VLLMAdapter, 500, body)
    assert (e.status, e.retryable, e.code) == (500, False, "upstream_error")


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_type_5xx_are_retried_elsewhere(status: int):
    assert err(VLLMAdapter, status, b"<html>bad gateway</html>", "text/html").retryable is True


def test_429_from_an_engine_is_busy_and_retryable():
    e = err(GenericOpenAIAdapter, 429, b'{"error":{"message":"Too many requests","type":"rate_limit"}}')
    assert (e.status, e.busy, e.retryable, e.type) == (429, True, True, "rate_limit_exceeded")


def test_tabbyapi_422_validation_error_is_a_400_with_the_field_named():
    body = b'{"detail":[{"type":"missing","loc":["body","messages"],"msg":"Field required","input":{}}]}'
    e = err(TabbyAPIAdapter, 422, body)
    assert (e.status, e.type) == (400, "invalid_request_error")
    assert e.message == "messages: Field required (backend 'gpu-1' (tabbyapi))"


def test_tabbyapi_invalid_key_is_the_gateways_credentials_problem():
    e = err(TabbyAPIAdapter, 401, b'{"detail":"Invalid API key"}')
    assert (e.status, e.code) == (502, "upstream_auth_failed")


def test_tabbyapi_no_model_loaded_is_a_retryable_503():
    e = err(TabbyAPIAdapter, 503, b'{"detail":"No models are currently loaded."}')
    assert (e.status, e.retryable) == (503, True)


def test_sglang_flat_400_is_a_client_error():
    body = (
        b'{"object":"error","message":"max_tokens must be positive","type":"BadRequestError","param":null,"code":400}'
    )
    e = err(SGLangAdapter, 400, body)
    assert (e.status, e.message) == (400, "max_tokens must be positive (backend 'gpu-1' (sglang))")


def test_lmdeploy_409_conflict_stays_409():
    body = b'{"object":"error","message":"session busy","type":"invalid_request_error","param":null,"code":409}'
    assert err(LMDeployAdapter, 409, body).status == 409


def test_lmdeploy_sleeping_503_is_retryable():
    body = b'{"object":"error","message":"engine is sleeping","type":"engine_unavailable","param":null,"code":503}'
    e = err(LMDeployAdapter, 503, body)
    assert (e.status, e.retryable) == (503, True)


# -- error_from_frame --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "status", "code"),
    [
        ({"error": {"message": "boom", "code": 500}}, 502, "upstream_stream_error"),
        ({"error": {"message": "boom"}}, 502, "upstream_stream_error"),
        ({"error": {"message": "too long", "code": 400}}, 400, None),
        ({"error": {"message": "slow", "code": "429"}}, 429, None),
        ({"error": {"message": "auth", "code": 401}}, 502, "upstream_stream_error"),
        ({"error": {"message": "gone", "code": 404}}, 502, "upstream_stream_error"),
        ({"error": {"message": "ctx", "code": "context_length_exceeded"}}, 502, "upstream_stream_error"),
    ],
)
def test_error_frames_map_client_codes_to_client_errors_and_the_rest_to_502(frame, status, code):
    e = make(VLLMAdapter).error_from_frame(frame)
    assert e.status == status
    if code is not None:
        assert e.code == code


def test_error_frame_message_names_the_backend():
    e = make(TabbyAPIAdapter).error_from_frame(
        {"error": {"message": "Chat completion aborted. Please check the server console.", "trace": None}}
    )
    assert e.message == (
        "backend 'gpu-1' (tabbyapi) failed mid-stream: Chat completion aborted. Please check the server console."
    )
    assert e.retryable is False
