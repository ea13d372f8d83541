"""No OpenAI field silently dropped by the OpenAI-speaking engines (llama-server, vLLM, SGLang, TabbyAPI,
LMDeploy): every field of the installed openai SDK's chat and completions requests is in each adapter's
`field_table`; every field the table passes reaches the engine's body; every refused one, at a value that
asks something, is a 400 `unsupported_parameter` naming the field and the engine, raised by `build()`
(before any engine is called); the values that ask nothing (`n: 1`, `logit_bias: {}`) stay accepted.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from llm_gateway.adapters.aphrodite import AphroditeAdapter
from llm_gateway.adapters.field_table import GATEWAY, HINT, HOWS, PASSED, REFUSED, TRANSLATED, FieldTable
from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.lmstudio import LMStudioAdapter
from llm_gateway.adapters.mlc import MLCAdapter
from llm_gateway.adapters.mlx import MLXAdapter
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.tgi import TGIAdapter
from llm_gateway.adapters.trtllm import TRTLLMAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.errors import InvalidRequest
from llm_gateway.types import BackendInfo, CallContext

FIRST: list[type[OpenAICompatAdapter]] = [
    LlamaServerAdapter,
    VLLMAdapter,
    SGLangAdapter,
    TabbyAPIAdapter,
    LMDeployAdapter,
]
#: the engines of issue 39 with a field table (Dynamo's frontend refuses per worker itself: no table)
PROFILES: list[type[OpenAICompatAdapter]] = [
    AphroditeAdapter,
    TRTLLMAdapter,
    MLXAdapter,
    MLCAdapter,
    TGIAdapter,
    LMStudioAdapter,
]
ADAPTERS = FIRST + PROFILES
ENGINE_NAMES = {
    "llama-server": "llama-server",
    "vllm": "vLLM",
    "sglang": "SGLang",
    "tabbyapi": "TabbyAPI",
    "lmdeploy": "LMDeploy",
    "aphrodite": "Aphrodite",
    "trtllm": "TensorRT-LLM",
    "mlx": "MLX-LM",
    "mlc": "MLC LLM",
    "tgi": "TGI",
    "lmstudio": "LM Studio",
}
ENDPOINTS = {"chat": chat_create_params, "completions": completion_create_params}
HI = [{"role": "user", "content": "hi"}]
BASE: dict[str, dict[str, Any]] = {"chat": {"messages": HI}, "completions": {"prompt": "Hello"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

#: for every SDK field, a value that asks something of the engine (not its default)
VALUES: dict[str, dict[str, Any]] = {
    "chat": {
        "model": "other-model",
        "messages": [{"role": "user", "content": "other"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 7,
        "max_completion_tokens": 7,
        "temperature": 0.3,
        "top_p": 0.5,
        "seed": 3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "stop": "END",
        "n": 2,
        "logit_bias": {"5": -100},  # a token id every vocabulary has (the tiny models: 271)
        "logprobs": True,
        "top_logprobs": 2,
        "response_format": {"type": "json_object"},
        "reasoning_effort": "low",
        "tools": [TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "verbosity": "low",
        "modalities": ["text", "audio"],
        "audio": {"voice": "alloy", "format": "mp3"},
        "functions": [TOOL["function"]],
        "function_call": {"name": "f"},
        "web_search_options": {"search_context_size": "low"},
        "moderation": {"mode": "block"},
        "user": "u-1",
        "safety_identifier": "s-1",
        "metadata": {"a": "b"},
        "store": True,
        "service_tier": "flex",
        "prompt_cache_key": "k",
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {"mode": "explicit"},
        "prediction": {"type": "content", "content": "x"},
    },
    "completions": {
        "model": "other-model",
        "prompt": "Once upon",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 7,
        "temperature": 0.3,
        "top_p": 0.5,
        "seed": 3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
        "stop": ["END"],
        "n": 2,
        "logit_bias": {"1": 5},
        "logprobs": 2,
        "echo": True,
        "best_of": 2,
        "suffix": " the end.",
        "user": "u-1",
    },
}
#: values that ask nothing of any engine: accepted wherever the field is refused
HARMLESS: dict[str, dict[str, Any]] = {
    "chat": {
        "n": 1,
        "parallel_tool_calls": True,
        "modalities": ["text"],
        "verbosity": "medium",
        "function_call": "auto",
        "functions": [],
    },
    "completions": {"n": 1, "echo": False, "best_of": 1, "suffix": "", "logit_bias": {}},
}


def sdk_fields(module: Any) -> set[str]:
    """The request fields the openai SDK sends: `CompletionCreateParamsBase` and the `stream` flag."""
    return set(module.CompletionCreateParamsBase.__annotations__) | set(
        module.CompletionCreateParamsStreaming.__annotations__
    )


def make(cls: type[OpenAICompatAdapter]) -> OpenAICompatAdapter:
    return cls(BackendInfo("b", "http://b.test", "k"))


def table(cls: type[OpenAICompatAdapter]) -> FieldTable:
    assert cls.field_table is not None, f"{cls.kind} has no field table"
    return cls.field_table


def sent(a: OpenAICompatAdapter, endpoint: str, body: dict[str, Any]) -> dict[str, Any]:
    c = CallContext(endpoint, "public-model", "upstream-model", body.get("stream") is True, False, "req-1")  # type: ignore[arg-type]
    req = a.build(endpoint, body, c)  # type: ignore[arg-type]
    assert req.body is not None
    out: dict[str, Any] = orjson.loads(req.body)
    return out


def with_field(endpoint: str, field: str, value: Any) -> dict[str, Any]:
    """The base body plus `field`, and what the field needs beside it (tools for tool_choice, ...)."""
    body = {**BASE[endpoint], field: value}
    if endpoint == "chat" and field in ("tool_choice", "parallel_tool_calls"):
        body["tools"] = [TOOL]
    if endpoint == "chat" and field == "top_logprobs":
        body["logprobs"] = True
    return body


def passed_value(cls: type[OpenAICompatAdapter], endpoint: str, field: str) -> Any:
    """A value of a passed field that the engine honours (within the rule's accepted values, if limited)."""
    rule = table(cls).tables[endpoint][field]
    if rule.accepted is not None:
        return next(v for v in rule.accepted if v not in (None, "auto"))
    return VALUES[endpoint][field]


CASES = [(cls, ep) for cls in ADAPTERS for ep in ENDPOINTS]
IDS = [f"{cls.kind}-{ep}" for cls, ep in CASES]


@pytest.mark.parametrize(("cls", "endpoint"), CASES, ids=IDS)
def test_every_sdk_field_is_in_the_table(cls: type[OpenAICompatAdapter], endpoint: str) -> None:
    fields = sdk_fields(ENDPOINTS[endpoint])
    assert {"model", "stream", "n", "logit_bias", "seed"} <= fields  # the SDK's list was read
    t = table(cls).tables[endpoint]
    assert sorted(fields - set(t)) == [], f"fields of the openai SDK that the {cls.kind} adapter does not account for"
    assert sorted(set(t) - fields) == [], "table entries that are not fields of OpenAI's request"
    for field, rule in t.items():
        assert rule.how in HOWS and rule.why, (field, rule)
    assert sorted(fields - set(VALUES[endpoint])) == [], "fields this test has no value for"


@pytest.mark.parametrize(("cls", "endpoint"), CASES, ids=IDS)
def test_each_refused_field_is_a_400_naming_the_field_and_the_engine(
    cls: type[OpenAICompatAdapter], endpoint: str
) -> None:
    a = make(cls)
    refused = [f for f, r in table(cls).tables[endpoint].items() if r.accepted is not None]
    assert refused, cls.kind
    for field in refused:
        rule = table(cls).tables[endpoint][field]
        value = VALUES[endpoint][field]
        assert value not in rule.accepted, (field, value)  # type: ignore[operator]
        with pytest.raises(InvalidRequest) as e:
            sent(a, endpoint, with_field(endpoint, field, value))
        assert e.value.param == field and e.value.code == "unsupported_parameter", (field, e.value)
        assert f"'{field}'" in e.value.message and ENGINE_NAMES[cls.kind] in e.value.message, e.value.message
        if field in HARMLESS[endpoint] and rule.how == REFUSED:  # a value that asks nothing stays accepted
            sent(a, endpoint, with_field(endpoint, field, HARMLESS[endpoint][field]))


@pytest.mark.parametrize(("cls", "endpoint"), CASES, ids=IDS)
def test_each_passed_field_reaches_the_engine(cls: type[OpenAICompatAdapter], endpoint: str) -> None:
    a = make(cls)
    for field, rule in table(cls).tables[endpoint].items():
        if rule.how not in (PASSED, TRANSLATED):
            continue
        value = passed_value(cls, endpoint, field)
        body = with_field(endpoint, field, value)
        up = sent(a, endpoint, body)
        if rule.how == PASSED:
            assert up.get(field) == value, f"{cls.kind} {endpoint}: {field}={value!r} did not reach the engine: {up}"
        else:  # renamed or rewritten: the engine's body changes with the field
            without = with_field(endpoint, "stream", False) if field == "stream" else dict(BASE[endpoint])
            assert up != sent(a, endpoint, without), f"{cls.kind} {endpoint}: {field}={value!r} sent nothing"


@pytest.mark.parametrize(("cls", "endpoint"), CASES, ids=IDS)
def test_hints_and_gateway_fields_are_accepted(cls: type[OpenAICompatAdapter], endpoint: str) -> None:
    a = make(cls)
    for field, rule in table(cls).tables[endpoint].items():
        if rule.how in (HINT, GATEWAY):
            up = sent(a, endpoint, with_field(endpoint, field, VALUES[endpoint][field]))
            assert up["model"] == "upstream-model"  # the gateway's model, whatever the client said


def test_the_priority_fields_say_what_each_engine_does() -> None:
    """The issue's first fields, engine by engine (from each engine's own request schema)."""
    how = {cls.kind: {f: r.how for f, r in table(cls).tables["chat"].items()} for cls in FIRST}
    for kind in how:
        assert how[kind]["user"] == HINT
        assert how[kind]["model"] == GATEWAY
    assert {k: how[k]["seed"] for k in how} == {
        "llama-server": PASSED,
        "vllm": PASSED,
        "sglang": PASSED,
        "tabbyapi": REFUSED,  # no seed in its sampler request
        "lmdeploy": PASSED,
    }
    assert how["tabbyapi"]["parallel_tool_calls"] == REFUSED  # parsed, never read
    assert how["lmdeploy"]["presence_penalty"] == REFUSED  # not a GenerationConfig field
    assert how["llama-server"]["reasoning_effort"] == REFUSED
    assert how["sglang"]["parallel_tool_calls"] == REFUSED  # false not enforced for tool_choice auto
    for kind in ("vllm", "sglang", "lmdeploy", "llama-server"):
        for field in ("n", "logit_bias", "logprobs", "top_logprobs", "tool_choice"):
            assert how[kind][field] == PASSED, (kind, field)
        assert kind == "sglang" or how[kind]["parallel_tool_calls"] == PASSED, kind


def test_tabby_refuses_a_response_format_it_would_ignore() -> None:
    a = make(TabbyAPIAdapter)
    assert sent(a, "chat", {"messages": HI, "response_format": {"type": "json_object"}})["response_format"] == {
        "type": "json"
    }
    with pytest.raises(InvalidRequest) as e:
        sent(a, "chat", {"messages": HI, "response_format": {"type": "grammar"}})
    assert e.value.param == "response_format" and "TabbyAPI" in e.value.message


def test_llama_server_completions_do_not_send_values_that_ask_nothing() -> None:
    up = sent(make(LlamaServerAdapter), "completions", {"prompt": "x", "echo": False, "best_of": 1, "suffix": ""})
    assert not {"echo", "best_of", "suffix"} & set(up)


def test_native_and_unknown_fields_pass_through() -> None:
    extras = {"top_k": 5, "chat_template_kwargs": {"enable_thinking": False}, "min_p": 0.1, "x_unknown": 1}
    for cls in [c for c in ADAPTERS if c is not TRTLLMAdapter]:  # trtllm-serve forbids unknown fields
        up = sent(make(cls), "chat", {"messages": HI, **extras})
        assert {k: up[k] for k in extras} == extras, cls.kind


def test_booleans_are_not_numbers_to_the_check() -> None:
    """`n: true` is not `n: 1`: a refused field's accepted values are matched with their type."""
    with pytest.raises(InvalidRequest):
        sent(make(LMDeployAdapter), "completions", {"prompt": "x", "n": True})
    sent(make(LMDeployAdapter), "completions", {"prompt": "x", "presence_penalty": 0})
