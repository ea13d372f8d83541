"""Ollama engine truth: no OpenAI field silently dropped, no prompt silently cut, no unfinished answer
passed off as finished.

- Every field of OpenAI's chat and completions requests (the installed openai SDK's own list) is in the
  adapter's table, and does what the table says: translated into Ollama's request, refused with a 400
  naming it, or (gateway fields, hints) accepted and not sent.
- `logprobs`/`top_logprobs` go to Ollama (>= 0.12.11) and come back in OpenAI's shape, whole and
  streamed; an older Ollama (known from the probe's /api/version, or from an answer without them) gets
  a 400 `unsupported_parameter`.
- Every request says `truncate: false`; Ollama's refusals of a long prompt (three wordings across
  versions) become 400 `context_length_exceeded`; an Ollama that cut the prompt anyway (0.5.4: no
  `truncate`) is caught by `prompt_eval_count`, whole and streamed, with the usage kept for billing.
- A whole answer with `done: false` (the repeated-token abort) or a `done_reason` other than stop/length
  is a 502 `generation_failed`, carrying the usage.
The adapter is driven directly, and the gateway in-process with the engine played by a FakeUpstream.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types import completion_create_params
from openai.types.chat import completion_create_params as chat_create_params

from llm_gateway.adapters.ollama import ChargedError, OllamaAdapter, parse_version
from llm_gateway.adapters.ollama_prompt import min_tokens
from llm_gateway.adapters.ollama_request import (
    CHAT_FIELDS,
    COMPLETIONS_FIELDS,
    GATEWAY,
    HINT,
    REFUSED,
    TRANSLATED,
)
from llm_gateway.errors import EngineErrorAnswer, InvalidRequest
from llm_gateway.types import BackendInfo, CallContext, Usage
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
LONG = " ".join(f"word{i % 50}" for i in range(20000))  # ~140 KB: far more than 4096 tokens anywhere


def adapter() -> OllamaAdapter:
    return OllamaAdapter(BackendInfo("ol", "http://127.0.0.1:11434"))


def ctx(endpoint: str = "chat", stream: bool = False) -> CallContext:
    """The call's context; its `stream` comes from the body's, as the service reads it."""
    return CallContext(endpoint, "public-model", "tiny", stream, False, "req-0123456789abcdef")  # type: ignore[arg-type]


def sent(body: dict[str, Any], endpoint: str = "chat", a: OllamaAdapter | None = None) -> dict[str, Any]:
    req = (a or adapter()).build(endpoint, body, ctx(endpoint, body.get("stream") is True))  # type: ignore[arg-type]
    assert req.body is not None
    out: dict[str, Any] = orjson.loads(req.body)
    return out


class Versioned:
    """A ProbeClient whose Ollama says `version` at /api/version and lists the model `tiny`."""

    def __init__(self, version: str) -> None:
        self.version = version

    async def get(self, path: str, headers: Any = None) -> tuple[int, bytes]:
        if path == "/api/version":
            return 200, orjson.dumps({"version": self.version})
        return 200, orjson.dumps({"models": [{"name": "tiny:latest"}]})

    def now(self) -> float:
        return 0.0


async def probed(version: str) -> OllamaAdapter:
    a = adapter()
    assert (await a.probe(Versioned(version))).state == "ready"
    return a


# -- every OpenAI field: translated, refused, or accepted as a hint -------------------------------------------

# a value of each field that must reach Ollama (changing what is sent), and one that must be refused
CHAT_SENT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "other"}],
    "stream": True,
    "max_tokens": 7,
    "max_completion_tokens": 7,
    "temperature": 0.3,
    "top_p": 0.5,
    "seed": 3,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "stop": "END",
    "response_format": {"type": "json_object"},
    "reasoning_effort": "low",
    "tools": [TOOL],
    "tool_choice": "none",  # against a body with tools: they are not sent
    "logprobs": True,
    "top_logprobs": 2,  # with logprobs: true
}
CHAT_REFUSED: dict[str, Any] = {
    "response_format": {"type": "grammar"},
    "tools": [{"type": "custom", "custom": {"name": "x"}}],
    "tool_choice": "required",
    "parallel_tool_calls": False,
    "n": 2,
    "modalities": ["text", "audio"],
    "verbosity": "low",
    "logit_bias": {"50256": -100},
    "functions": [TOOL["function"]],
    "function_call": {"name": "f"},
    "audio": {"voice": "alloy", "format": "mp3"},
    "web_search_options": {},
    "moderation": {"mode": "block"},
}
# accepted and not sent, by design
CHAT_QUIET: dict[str, Any] = {
    "model": "public-model",
    "stream_options": {"include_usage": True},
    "user": "u-1",
    "safety_identifier": "s-1",
    "metadata": {"a": "b"},
    "store": True,
    "service_tier": "flex",
    "prompt_cache_key": "k",
    "prompt_cache_retention": "24h",
    "prompt_cache_options": {"mode": "explicit"},
    "prediction": {"type": "content", "content": "x"},
    # the defaults of the value-dependent fields ask nothing of Ollama
    "parallel_tool_calls": True,
    "n": 1,
    "modalities": ["text"],
    "verbosity": "medium",
    "tool_choice": "auto",
    "logit_bias": {},
    "function_call": "auto",
}
COMPLETIONS_SENT: dict[str, Any] = {
    "prompt": "Once upon",
    "stream": True,
    "max_tokens": 7,
    "temperature": 0.3,
    "top_p": 0.5,
    "seed": 3,
    "presence_penalty": 0.5,
    "frequency_penalty": 0.5,
    "stop": ["END"],
    "logprobs": 2,
}
COMPLETIONS_REFUSED: dict[str, Any] = {
    "n": 3,
    "logit_bias": {"1": 5},
    "echo": True,
    "best_of": 2,
    "suffix": " the end.",
}
COMPLETIONS_QUIET: dict[str, Any] = {
    "model": "public-model",
    "stream_options": {"include_usage": True},
    "user": "u-1",
    "echo": False,
    "best_of": 1,
    "n": 1,
    "suffix": "",
}
CASES: dict[
    str, tuple[Any, dict[str, tuple[str, str]], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]
] = {
    "chat": (chat_create_params, CHAT_FIELDS, CHAT_SENT, CHAT_REFUSED, CHAT_QUIET, {"messages": HI}),
    "completions": (
        completion_create_params,
        COMPLETIONS_FIELDS,
        COMPLETIONS_SENT,
        COMPLETIONS_REFUSED,
        COMPLETIONS_QUIET,
        {"prompt": "Hello"},
    ),
}


def sdk_fields(module: Any) -> set[str]:
    """The request fields the openai SDK sends: `CompletionCreateParamsBase` and the `stream` flag."""
    return set(module.CompletionCreateParamsBase.__annotations__) | set(
        module.CompletionCreateParamsStreaming.__annotations__
    )


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_table_lists_exactly_the_sdks_request_fields(endpoint: str) -> None:
    module, table, *_ = CASES[endpoint]
    fields = sdk_fields(module)
    assert "stream" in fields and "model" in fields  # the SDK's list was read
    assert sorted(fields - set(table)) == [], "fields of the openai SDK that the Ollama adapter does not account for"
    assert sorted(set(table) - fields) == [], "table entries that are not fields of OpenAI's request"
    assert {how for how, _ in table.values()} <= {TRANSLATED, GATEWAY, HINT, REFUSED}


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_sdk_field_is_translated_refused_or_a_declared_hint(endpoint: str) -> None:
    module, table, sent_values, refused_values, quiet_values, base = CASES[endpoint]
    for field in sorted(sdk_fields(module)):
        how, why = table[field]
        assert why, field
        if how == TRANSLATED:
            assert field in sent_values or field in refused_values, f"{field}: no case says what it does"
        if how == REFUSED:
            assert field in refused_values and field not in sent_values, field
        if how in (GATEWAY, HINT):
            assert field in quiet_values and field not in sent_values and field not in refused_values, field
        if field in sent_values:
            without = {**base, "tools": [TOOL]} if field == "tool_choice" else dict(base)
            if field == "top_logprobs":
                without["logprobs"] = True
            value = sent_values[field]
            assert sent({**without, field: value}, endpoint) != sent(without, endpoint), (
                f"{field}={value!r} sent nothing"
            )
        if field in refused_values:
            with pytest.raises(InvalidRequest) as ei:
                sent({**base, field: refused_values[field]}, endpoint)
            assert (ei.value.status, ei.value.param) == (400, field), field
            assert ei.value.code == "unsupported_parameter", field
            assert field in ei.value.message
        if field in quiet_values:
            plain = sent(base, endpoint)
            assert sent({**base, field: quiet_values[field]}, endpoint) == plain, f"{field} was sent to Ollama"


def test_translations_say_where_each_field_went() -> None:
    out = sent({"messages": HI, "max_completion_tokens": 9, "stop": "END", "top_p": 0.5, "seed": 1})
    assert out["options"] == {"num_predict": 9, "stop": ["END"], "top_p": 0.5, "seed": 1}
    assert "tools" not in sent({"messages": HI, "tools": [TOOL], "tool_choice": "none"})
    assert sent({"messages": HI, "tools": [TOOL], "tool_choice": "auto"})["tools"] == [TOOL]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "f"}}])
def test_a_forced_tool_call_is_refused_naming_tool_choice(choice: Any) -> None:
    with pytest.raises(InvalidRequest) as ei:
        sent({"messages": HI, "tools": [TOOL], "tool_choice": choice})
    assert (ei.value.param, ei.value.code) == ("tool_choice", "unsupported_parameter")


def test_an_empty_completions_prompt_is_refused_rather_than_read_as_a_model_load() -> None:
    with pytest.raises(InvalidRequest) as ei:
        sent({"prompt": ""}, "completions")
    assert (ei.value.param, ei.value.code) == ("prompt", "unsupported_parameter")


# -- logprobs ----------------------------------------------------------------------------------------------------


def test_versions_are_read_from_ollamas_version_strings() -> None:
    assert parse_version("0.5.4-ipexllm-20250407") == (0, 5, 4)
    assert parse_version("0.13.5") == (0, 13, 5)
    assert parse_version("v0.12.11-rc1") == (0, 12, 11)
    assert parse_version("0.0.0") == (0, 0, 0)
    assert parse_version("dev") is None and parse_version(None) is None


async def test_logprobs_go_to_an_ollama_that_returns_them() -> None:
    for a in (adapter(), await probed("0.12.11"), await probed("0.13.5")):  # not known yet: asked for
        out = sent({"messages": HI, "logprobs": True, "top_logprobs": 2}, a=a)
        assert (out["logprobs"], out["top_logprobs"]) == (True, 2)
    out = sent({"prompt": "Once", "logprobs": 3}, "completions")
    assert (out["logprobs"], out["top_logprobs"]) == (True, 3)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
async def test_logprobs_to_an_ollama_before_0_12_11_are_a_400_naming_the_field(endpoint: str) -> None:
    a = await probed("0.5.4-ipexllm-20250407")
    body = (
        {"messages": HI, "logprobs": True, "top_logprobs": 2} if endpoint == "chat" else {"prompt": "x", "logprobs": 2}
    )
    with pytest.raises(InvalidRequest) as ei:
        sent(body, endpoint, a)
    assert (ei.value.status, ei.value.param, ei.value.code) == (400, "logprobs", "unsupported_parameter")
    assert "0.12.11" in ei.value.message
    assert "logprobs" not in sent({"messages": HI, "logprobs": False}, a=a)  # not asking is fine


def test_top_logprobs_without_logprobs_is_refused_as_openai_does() -> None:
    with pytest.raises(InvalidRequest) as ei:
        sent({"messages": HI, "top_logprobs": 2})
    assert ei.value.param == "top_logprobs"


# HEAD-shaped (api/types.go Logprob): bytes and top_logprobs as Ollama writes them
LP: list[dict[str, Any]] = [
    {
        "token": " llama",
        "logprob": -0.25,
        "bytes": [32, 108, 108, 97, 109, 97],
        "top_logprobs": [
            {"token": " llama", "logprob": -0.25, "bytes": [32, 108, 108, 97, 109, 97]},
            {"token": "W", "logprob": -2.0, "bytes": [87]},
        ],
    },
    {"token": "W", "logprob": -1.5, "bytes": [87], "top_logprobs": [{"token": "W", "logprob": -1.5, "bytes": [87]}]},
]
OPENAI_LP = {
    "content": [
        {
            "token": " llama",
            "logprob": -0.25,
            "bytes": [32, 108, 108, 97, 109, 97],
            "top_logprobs": [
                {"token": " llama", "logprob": -0.25, "bytes": [32, 108, 108, 97, 109, 97]},
                {"token": "W", "logprob": -2.0, "bytes": [87]},
            ],
        },
        {
            "token": "W",
            "logprob": -1.5,
            "bytes": [87],
            "top_logprobs": [{"token": "W", "logprob": -1.5, "bytes": [87]}],
        },
    ],
    "refusal": None,
}


def whole(content: str = " llamaW", **extra: Any) -> bytes:
    obj = {
        "model": "tiny",
        "message": {"role": "assistant", "content": content},
        "done": True,
        "done_reason": "length",
        "prompt_eval_count": 12,
        "eval_count": 2,
        **extra,
    }
    return orjson.dumps(obj)


def test_whole_chat_logprobs_come_back_in_openais_shape() -> None:
    a, c = adapter(), ctx()
    a.build("chat", {"messages": HI, "logprobs": True, "top_logprobs": 2}, c)
    body, usage = a.response_body(whole(logprobs=LP), c)
    assert orjson.loads(body)["choices"][0]["logprobs"] == OPENAI_LP and usage == Usage(12, 2)


def test_whole_completion_logprobs_come_back_in_the_legacy_shape() -> None:
    a, c = adapter(), ctx("completions")
    a.build("completions", {"prompt": "Once", "logprobs": 2}, c)
    raw = orjson.dumps(
        {
            "response": " llamaW",
            "done": True,
            "done_reason": "length",
            "prompt_eval_count": 3,
            "eval_count": 2,
            "logprobs": LP,
        }
    )
    lp = orjson.loads(a.response_body(raw, c)[0])["choices"][0]["logprobs"]
    assert lp == {
        "tokens": [" llama", "W"],
        "token_logprobs": [-0.25, -1.5],
        "top_logprobs": [{" llama": -0.25, "W": -2.0}, {"W": -1.5}],
        "text_offset": [0, 6],
    }


def ndjson(*objs: dict[str, Any]) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


def sse_objects(raw: bytes) -> list[Any]:
    return [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e.startswith(b"data: {")]


def test_streamed_logprobs_ride_on_the_content_chunks() -> None:
    a, c = adapter(), ctx(stream=True)
    a.build("chat", {"messages": HI, "logprobs": True, "top_logprobs": 2}, c)
    relay = a.relay(c)
    out = relay.feed(
        ndjson(
            {"message": {"role": "assistant", "content": " llama"}, "done": False, "logprobs": LP[:1]},
            {"message": {"role": "assistant", "content": "W"}, "done": False, "logprobs": LP[1:]},
            {
                "message": {"role": "assistant", "content": ""},
                "done": True,
                "done_reason": "length",
                "prompt_eval_count": 12,
                "eval_count": 2,
            },
        )
    )
    chunks = [o["choices"][0] for o in sse_objects(out)]
    content: list[Any] = OPENAI_LP["content"]  # type: ignore[assignment]
    assert [ch["logprobs"] for ch in chunks] == [
        None,
        {"content": content[:1], "refusal": None},
        {"content": content[1:], "refusal": None},
        None,
    ]
    assert relay.error is None and relay.usage == Usage(12, 2)


def test_an_ollama_that_ignores_logprobs_gets_a_400_and_is_not_asked_again() -> None:
    a, c = adapter(), ctx()  # version not known: asked for
    a.build("chat", {"messages": HI, "logprobs": True}, c)
    with pytest.raises(ChargedError) as ei:
        a.response_body(whole(), c)
    assert (ei.value.status, ei.value.param, ei.value.code) == (400, "logprobs", "unsupported_parameter")
    assert ei.value.usage == Usage(12, 2)
    with pytest.raises(InvalidRequest):
        sent({"messages": HI, "logprobs": True}, a=a)
    s = ctx(stream=True)
    b = adapter()
    b.build("chat", {"messages": HI, "logprobs": True}, s)
    relay = b.relay(s)
    relay.feed(
        ndjson(
            {"message": {"content": "x"}, "done": False},
            {"message": {"content": ""}, "done": True, "done_reason": "stop", "prompt_eval_count": 5, "eval_count": 1},
        )
    )
    assert relay.error is not None and relay.error.code == "unsupported_parameter" and relay.usage == Usage(5, 1)


# -- prompts longer than the context window ------------------------------------------------------------------------


def test_every_request_tells_ollama_not_to_truncate_unless_the_client_said_otherwise() -> None:
    assert sent({"messages": HI})["truncate"] is False
    assert sent({"prompt": "x"}, "completions")["truncate"] is False
    assert sent({"input": "x"}, "embeddings")["truncate"] is False
    assert sent({"messages": HI, "truncate": None})["truncate"] is False
    assert sent({"messages": HI, "truncate": True})["truncate"] is True


@pytest.mark.parametrize(
    ("status", "message"),
    [
        (400, "the input length exceeds the context length"),  # v0.12.6+ runners (errorInputTooLong)
        (400, "input length exceeds maximum context length"),  # /api/embed, 0.5.4 on
        (  # HEAD: llama-server's error, wrapped
            400,
            '{"error":{"code":400,"message":"request (10022 tokens) exceeds the available context size '
            '(2048 tokens), try increasing it","type":"exceed_context_size_error",'
            '"n_prompt_tokens":10022,"n_ctx":2048}}',
        ),
        (400, "the prompt is longer than the context length currently available to the model; shorten the prompt"),
    ],
)
def test_ollamas_refusals_of_a_long_prompt_are_context_length_exceeded(status: int, message: str) -> None:
    err = adapter().error(status, orjson.dumps({"error": message}), "application/json")
    assert (err.status, err.code, err.type, err.retryable) == (
        400,
        "context_length_exceeded",
        "invalid_request_error",
        False,
    )
    assert "exceed_context_size_error" not in err.message and "(ollama)" in err.message
    mid = adapter().relay(ctx(stream=True))
    mid.feed(orjson.dumps({"error": message}) + b"\n")
    assert mid.error is not None and mid.error.code == "context_length_exceeded"


def cut_answer(prompt_eval_count: int, **extra: Any) -> bytes:
    return whole(prompt_eval_count=prompt_eval_count, **extra)


def test_a_prompt_that_ollama_cut_anyway_is_a_400_with_the_usage_kept() -> None:
    a, c = adapter(), ctx()
    a.build("chat", {"messages": [{"role": "user", "content": LONG}]}, c)
    with pytest.raises(ChargedError) as ei:
        a.response_body(cut_answer(4096), c)  # 0.5.4 keeps exactly num_ctx tokens
    e = ei.value
    assert (e.status, e.code, e.type, e.param) == (400, "context_length_exceeded", "invalid_request_error", "messages")
    assert e.usage == Usage(4096, 2) and "4096" in e.message


def test_a_whole_prompt_is_not_mistaken_for_a_cut_one() -> None:
    a, c = adapter(), ctx()
    text = "The quick brown fox jumps over the lazy dog. " * 100  # 4,500 bytes: >= 900 tokens in any vocabulary
    a.build("chat", {"messages": [{"role": "user", "content": text}]}, c)
    body, usage = a.response_body(cut_answer(1000), c)
    assert usage == Usage(1000, 2) and orjson.loads(body)["choices"][0]["finish_reason"] == "length"
    assert min_tokens(text) < 1000


def test_a_num_ctx_the_request_set_is_a_limit_before_and_after() -> None:
    a, c = adapter(), ctx()
    with pytest.raises(InvalidRequest) as ei:  # its text alone cannot fit: not sent at all
        a.build("chat", {"messages": [{"role": "user", "content": LONG}], "options": {"num_ctx": 2048}}, c)
    assert (ei.value.code, ei.value.param) == ("context_length_exceeded", "messages")
    a.build("chat", {"messages": [{"role": "user", "content": "a b c " * 300}], "num_ctx": 512}, c)
    with pytest.raises(ChargedError) as e2:
        a.response_body(cut_answer(512), c)
    assert e2.value.code == "context_length_exceeded"


def test_a_client_that_asked_for_truncation_gets_its_answer() -> None:
    a, c = adapter(), ctx()
    a.build("chat", {"messages": [{"role": "user", "content": LONG}], "truncate": True}, c)
    assert a.response_body(cut_answer(4096), c)[1] == Usage(4096, 2)


def test_a_streamed_cut_prompt_ends_with_an_error_event_and_keeps_the_usage() -> None:
    a, c = adapter(), ctx(stream=True)
    a.build("chat", {"messages": [{"role": "user", "content": LONG}]}, c)
    relay = a.relay(c)
    out = relay.feed(
        ndjson(
            {"message": {"content": " llama"}, "done": False},
            {
                "message": {"content": ""},
                "done": True,
                "done_reason": "stop",
                "prompt_eval_count": 4096,
                "eval_count": 1,
            },
        )
    )
    objs = sse_objects(out)
    assert objs[-1]["error"]["code"] == "context_length_exceeded" and out.endswith(b"data: [DONE]\n\n")
    assert not any(o.get("choices", [{}])[0].get("finish_reason") for o in objs if "choices" in o)
    assert relay.usage == Usage(4096, 1)


# -- whole answers Ollama did not finish ---------------------------------------------------------------------------


def test_a_whole_answer_with_done_false_is_a_502_with_the_generated_text_billed() -> None:
    a, c = adapter(), ctx()
    a.build("chat", {"messages": HI}, c)
    aborted = orjson.dumps({"model": "tiny", "message": {"role": "assistant", "content": "W" * 31}, "done": False})
    with pytest.raises(ChargedError) as ei:
        a.response_body(aborted, c)
    e = ei.value
    assert (e.status, e.code, e.retryable) == (502, "generation_failed", False)
    assert "done: false" in e.message and "backend 'ol' (ollama)" in e.message
    assert e.usage == Usage(0, 8)  # no counts in it: its 31 bytes at 4 a token


@pytest.mark.parametrize("reason", ["load", "unload", "", None])
def test_a_done_reason_other_than_stop_or_length_is_a_502(reason: str | None) -> None:
    raw = orjson.dumps({"response": "x", "done": True, "done_reason": reason, "prompt_eval_count": 2, "eval_count": 1})
    with pytest.raises(ChargedError) as ei:
        adapter().response_body(raw, ctx("completions"))
    assert (ei.value.status, ei.value.code, ei.value.usage) == (502, "generation_failed", Usage(2, 1))
    relay = adapter().relay(ctx("completions", stream=True))
    relay.feed(raw + b"\n")
    assert relay.error is not None and relay.error.code == "generation_failed" and relay.usage == Usage(2, 1)


# -- through the gateway, the engine played at the upstream seam -------------------------------------------------

OLLAMA_BACKEND = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}"}
backends:
  - name: ol
    engine: ollama
    url: http://ollama.test
    timeouts: {connect_s: 1, first_byte_s: 2, idle_s: 2, total_s: 10}
models:
  - name: public-model
    deployments:
      - {backend: ol, model: tiny, format: gguf, capabilities: [chat, completions]}
"""


async def test_through_the_gateway_cut_prompts_unfinished_answers_and_refusals_are_errors() -> None:
    up = FakeUpstream(
        {
            ("POST", "http://ollama.test/api/chat"): [
                FakeAnswer.json(orjson.loads(cut_answer(4096))),
                FakeAnswer.json({"model": "tiny", "message": {"role": "assistant", "content": "WWW"}, "done": False}),
                FakeAnswer.json({"error": "the input length exceeds the context length"}, status=400),
            ]
        }
    )
    async with gateway_client(make_config(OLLAMA_BACKEND), upstream=up) as (client, _):
        long = {"model": "public-model", "messages": [{"role": "user", "content": LONG}]}
        r = await client.post("/v1/chat/completions", json=long)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        r = await client.post("/v1/chat/completions", json={"model": "public-model", "messages": HI})
        assert r.status_code == 502 and r.json()["error"]["code"] == "generation_failed", r.text
        r = await client.post("/v1/chat/completions", json=long)
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        r = await client.post(
            "/v1/chat/completions", json={"model": "public-model", "messages": HI, "logit_bias": {"1": 1}}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", r.text
    calls = up.calls_to("http://ollama.test/api/chat")
    assert len(calls) == 3 and all(call.json()["truncate"] is False for call in calls)


def test_errors_found_in_answers_are_engine_errors_the_dispatcher_does_not_retry() -> None:
    err = ChargedError("x", usage=Usage(1, 2), status=502, code="generation_failed")
    assert isinstance(err, EngineErrorAnswer) and not err.retryable


async def test_an_unfinished_whole_answer_is_charged_what_was_generated() -> None:
    """The 502 of a `done: false` answer still pays for its tokens: the key's TPM is settled with them
    (not 0, as for an error before any output), and the token counters show them."""
    unfinished = {"model": "tiny", "message": {"role": "assistant", "content": "W" * 400}, "done": False}
    up = FakeUpstream({("POST", "http://ollama.test/api/chat"): [FakeAnswer.json(unfinished)]})
    cfg = OLLAMA_BACKEND.replace('sha256: "${ALICE_SHA}"}', 'sha256: "${ALICE_SHA}", limits: {tpm: 100000}}')
    async with gateway_client(make_config(cfg), upstream=up) as (client, _):
        r = await client.post("/v1/chat/completions", json={"model": "public-model", "messages": HI, "max_tokens": 5})
        assert r.status_code == 502 and r.json()["error"]["code"] == "generation_failed", r.text
        metrics = (await client.get("/metrics")).text
    line = next(x for x in metrics.splitlines() if x.startswith("gateway_completion_tokens_total{"))
    assert float(line.rsplit(" ", 1)[1]) == 100  # 400 bytes of text at 4 per token
