"""A whole answer's finish reasons reach the request's span from the adapter's own parse of the answer
(CallContext.finish_reasons, set by OpenAICompatAdapter.fix_choices), not from a second reading of its bytes: for
every OpenAI-compatible engine's adapter and each shape of answer, the span's reasons are the ones
genai_spans.finish_reasons finds in the bytes the client gets (what the span said before), and the adapter tells
them for the common shapes (else the bytes are read: a choice that is not an object, a vLLM `stop_reason`)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.adapters.registry import ADAPTERS
from llm_gateway.observability.genai_spans import is_reason
from llm_gateway.observability.tracing import RequestTrace
from llm_gateway.types import BackendInfo, CallContext

COMPAT = sorted(k for k, cls in ADAPTERS.items() if issubclass(cls, OpenAICompatAdapter))


def chat(*choices: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "upstream",
        "choices": [{"index": i, **c} for i, c in enumerate(choices)],
        "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
        **extra,
    }


def said(text: str, finish: Any, **extra: Any) -> dict[str, Any]:
    return {"message": {"role": "assistant", "content": text}, "finish_reason": finish, **extra}


#: name -> (endpoint, the engine's answer, does the adapter tell the reasons (else the bytes are read))
ANSWERS: dict[str, tuple[str, dict[str, Any], bool]] = {
    "one": ("chat", chat(said("hi", "stop")), True),
    "length": ("chat", chat(said("hi", "length")), True),
    "vllm_null_stop_reason": ("chat", chat(said("hi", "length", logprobs=None, stop_reason=None)), True),
    "vllm_stop_string": ("chat", chat(said("hi", "stop", stop_reason="end")), False),
    "vllm_stop_token": ("chat", chat(said("hi", "stop", stop_reason=128001)), False),
    "several_in_order_once_each": (
        "chat",
        chat(said("a", "tool_calls"), said("b", "stop"), said("c", "tool_calls"), said("d", None)),
        True,
    ),
    "null": ("chat", chat(said("hi", None)), True),
    "not_a_reason": (
        "chat",
        chat(said("hi", "Stop"), said("x", "a" * 33), said("y", ""), said("z", "max-tokens")),
        True,
    ),
    "text_that_looks_like_one": ("chat", chat(said('"finish_reason":"length"', "stop")), True),
    "no_choices": ("chat", chat(), True),
    "choice_not_an_object": (
        "chat",
        {**chat(said("hi", "stop")), "choices": [["x"], {"finish_reason": "stop"}]},
        False,
    ),
    "completions": (
        "completions",
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
        },
        True,
    ),
    "lmdeploy_parse_error": ("chat", chat(said("hi", "parse_error")), True),  # lmdeploy's: renamed to stop
}


def span_reasons(out: bytes, told: list[str] | None) -> tuple[str, ...] | None:
    tracing = cast(Any, SimpleNamespace(capture=False))
    trace = RequestTrace(tracing, bytes(15) + b"\x01", True)
    trace.answered(out, told)
    return trace.reasons


@pytest.mark.parametrize("kind", COMPAT)
@pytest.mark.parametrize("name", list(ANSWERS))
def test_the_adapters_reasons_are_those_the_answers_bytes_say(kind: str, name: str) -> None:
    endpoint, answer, told = ANSWERS[name]
    adapter = cast(OpenAICompatAdapter, ADAPTERS[kind](BackendInfo("eng", "http://127.0.0.1:1")))
    ctx = CallContext(endpoint, "public-model", "upstream", False, False, "req-1")  # type: ignore[arg-type]
    out, _ = adapter.response_body(orjson.dumps(answer), ctx)
    assert (ctx.finish_reasons is not None) is told
    read = span_reasons(out, None)  # the bytes read, as the span did before the adapter told it
    assert span_reasons(out, ctx.finish_reasons) == read


def test_the_reasons_told_are_checked_and_kept_in_order_once_each() -> None:
    out = b"{}"  # not read: the reasons are told
    assert span_reasons(out, ["tool_calls", "stop", "tool_calls", "Stop", "a" * 33, "", "max-tokens"]) == (
        "tool_calls",
        "stop",
    )
    assert span_reasons(out, []) is None
    assert span_reasons(b'{"choices":[{"finish_reason":"length"}]}', None) == ("length",)


@pytest.mark.parametrize("told", ["stop", "Stop", "a" * 33, "", "max-tokens", "tool_calls"])
def test_an_answers_one_told_reason_is_checked_as_any_other_the_first_time_and_from_what_is_kept(told: str) -> None:
    """An answer's only reason (the usual case) is read by one lookup of what was kept for it (genai_spans.ONE_REASON):
    the same span reasons as when it is told among others, the first time and after."""
    want = span_reasons(b"{}", [told, told])  # two told: the general path
    assert want == ((told,) if is_reason(told) else None)
    assert span_reasons(b"{}", [told]) == want  # the first time: checked and kept
    assert span_reasons(b"{}", [told]) == want  # from what is kept


def test_a_whole_answers_reasons_as_the_span_has_them() -> None:
    """What the span says for the common shapes (not only that it matches the bytes): a choice's reason after the
    engine's rename, each once in order, and a vLLM stop string read as the bytes say it (a `stop_reason`)."""
    got = {}
    for name in ("one", "several_in_order_once_each", "vllm_stop_string", "lmdeploy_parse_error"):
        endpoint, answer, _ = ANSWERS[name]
        adapter = cast(OpenAICompatAdapter, ADAPTERS["lmdeploy"](BackendInfo("eng", "http://127.0.0.1:1")))
        ctx = CallContext(endpoint, "public-model", "upstream", False, False, "req-1")  # type: ignore[arg-type]
        out, _ = adapter.response_body(orjson.dumps(answer), ctx)
        got[name] = span_reasons(out, ctx.finish_reasons)
    assert got == {
        "one": ("stop",),
        "several_in_order_once_each": ("tool_calls", "stop"),
        "vllm_stop_string": ("stop", "end"),
        "lmdeploy_parse_error": ("stop",),
    }
