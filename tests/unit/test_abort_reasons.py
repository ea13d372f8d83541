"""Aborted generations are errors, never `stop`, and they still pay for what was generated.

Every engine's abort/error finish reasons, in the shapes the engines write them:

- SGLang `abort` (sgl-project/sglang `python/sglang/srt/entrypoints/openai/protocol.py` @9b116df:
  `matched_stop` beside it), LMDeploy `abort` (a cancelled session, `ResponseType.CANCEL` in
  `lmdeploy/serve/core/async_engine.py` @1263d5c, answered with the usage so far) and `error` (its
  protocol.py Literal), vLLM `abort` and `error` (`FINISH_REASON_STRINGS`, vllm/v1/engine/__init__.py).
- A whole answer with one becomes a 502 `generation_failed` (`ChargedError`) carrying the engine's
  usage, or an estimate of the text when the engine counted no completion; the service bills it (the
  token counters show it).
- A stream with one ends with one error event and `[DONE]`, billed the text it passed on.
- llama-server and TabbyAPI have no such finish reason (stop, length, tool_calls only: reference.md
  §1, theroyallab/tabbyAPI `endpoints/OAI/utils/chat_completion.py` @e632af4): their failures are
  error frames (`{"error": ...}`), which end the stream the same way.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from llm_gateway.adapters.llama_server import LlamaServerAdapter
from llm_gateway.adapters.lmdeploy import LMDeployAdapter
from llm_gateway.adapters.openai_compat import OpenAICompatAdapter
from llm_gateway.adapters.relay_base import BYTES_PER_TOKEN, ChargedError, usage_or_estimate
from llm_gateway.adapters.sglang import SGLangAdapter
from llm_gateway.adapters.tabbyapi import TabbyAPIAdapter
from llm_gateway.adapters.vllm import VLLMAdapter
from llm_gateway.types import BackendInfo, CallContext, Usage
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

TEXT = "Llamas are domesticated South American camelids, kept "  # what was generated before the abort
USAGE = {"prompt_tokens": 9, "completion_tokens": 12, "total_tokens": 21}
ADAPTERS: dict[str, type[OpenAICompatAdapter]] = {
    "sglang": SGLangAdapter,
    "lmdeploy": LMDeployAdapter,
    "vllm": VLLMAdapter,
    "llama-server": LlamaServerAdapter,
    "tabbyapi": TabbyAPIAdapter,
}
#: (engine, finish reason) pairs that are failed generations
ABORTS = [("sglang", "abort"), ("lmdeploy", "abort"), ("lmdeploy", "error"), ("vllm", "abort"), ("vllm", "error")]


def adapter(engine: str) -> OpenAICompatAdapter:
    return ADAPTERS[engine](BackendInfo("eng", "http://127.0.0.1:1"))


def ctx(endpoint: str = "chat", stream: bool = False) -> CallContext:
    return CallContext(endpoint, "public-model", "tiny", stream, False, "req-0123456789abcdef")  # type: ignore[arg-type]


def choice(engine: str, finish: str, endpoint: str = "chat") -> dict[str, Any]:
    """A choice as the engine writes it (its own extras included)."""
    if endpoint == "completions":
        return {"index": 0, "text": TEXT, "logprobs": None, "finish_reason": finish}
    msg: dict[str, Any] = {"role": "assistant", "content": TEXT, "tool_calls": None}
    ch: dict[str, Any] = {"index": 0, "message": msg, "logprobs": None, "finish_reason": finish}
    if engine == "sglang":
        msg["reasoning_content"] = None
        ch["matched_stop"] = None
    elif engine == "vllm":
        msg.update(refusal=None, annotations=None, audio=None, function_call=None, tool_calls=[], reasoning=None)
        ch.update(stop_reason=None, token_ids=None)
    elif engine == "lmdeploy":
        msg["reasoning_content"] = None
    return ch


def whole(engine: str, finish: str, usage: dict[str, Any] | None = USAGE, endpoint: str = "chat") -> bytes:
    obj: dict[str, Any] = {
        "id": "chatcmpl-7b2c" if endpoint == "chat" else "cmpl-7b2c",
        "object": "chat.completion" if endpoint == "chat" else "text_completion",
        "created": 1796007492,
        "model": "tiny",
        "choices": [choice(engine, finish, endpoint)],
    }
    if usage is not None:
        obj["usage"] = usage
    return orjson.dumps(obj)


def estimate(text: str) -> int:
    return -(-len(orjson.dumps(text)[1:-1]) // BYTES_PER_TOKEN)


# -- whole answers -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("engine", "finish"), ABORTS)
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_whole_answer_with_an_abort_reason_is_a_502_that_carries_the_engines_usage(
    engine: str, finish: str, endpoint: str
) -> None:
    with pytest.raises(ChargedError) as ei:
        adapter(engine).response_body(whole(engine, finish, endpoint=endpoint), ctx(endpoint))
    err = ei.value
    assert err.status == 502 and err.code == "generation_failed" and not err.retryable
    assert f"'{finish}'" in str(err)
    assert err.usage == Usage(9, 12)


@pytest.mark.parametrize(("engine", "finish"), ABORTS)
@pytest.mark.parametrize("usage", [None, {"prompt_tokens": 9, "completion_tokens": 0, "total_tokens": 9}])
def test_an_abort_without_a_completion_count_is_charged_an_estimate_of_its_text(
    engine: str, finish: str, usage: dict[str, Any] | None
) -> None:
    with pytest.raises(ChargedError) as ei:
        adapter(engine).response_body(whole(engine, finish, usage), ctx())
    prompt = 9 if usage else 0  # no prompt count: the service falls back to its own estimate
    assert ei.value.usage == Usage(prompt, estimate(TEXT)) and estimate(TEXT) > 0


def test_one_aborted_choice_fails_the_whole_answer() -> None:
    obj = orjson.loads(whole("sglang", "stop"))
    obj["choices"].append({**choice("sglang", "abort"), "index": 1})
    with pytest.raises(ChargedError) as ei:
        adapter("sglang").response_body(orjson.dumps(obj), ctx())
    assert ei.value.usage == Usage(9, 12)


@pytest.mark.parametrize("engine", sorted(ADAPTERS))
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_a_finished_answer_stands_with_its_usage(engine: str, finish: str) -> None:
    out, usage = adapter(engine).response_body(whole(engine, finish), ctx())
    assert usage == Usage(9, 12)
    assert orjson.loads(out)["choices"][0]["finish_reason"] == finish


# -- streams -----------------------------------------------------------------------------------------


def chunk(finish: str | None, content: str | None, *, spaced: bool) -> bytes:
    delta = {} if content is None else {"content": content}
    obj = {
        "id": "chatcmpl-7b2c",
        "object": "chat.completion.chunk",
        "created": 1796007492,
        "model": "tiny",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    # FastAPI/orjson compact JSON (vLLM, SGLang) or json.dumps' spaced style (LMDeploy)
    return b"data: " + (json.dumps(obj).encode() if spaced else orjson.dumps(obj)) + b"\n\n"


WORDS = ["Llamas", " are", " camel", "ids"]


@pytest.mark.parametrize(("engine", "finish"), ABORTS)
@pytest.mark.parametrize("spaced", [False, True])
@pytest.mark.parametrize("split", [False, True])
def test_a_stream_with_an_abort_reason_ends_with_an_error_event_and_pays_its_text(
    engine: str, finish: str, spaced: bool, split: bool
) -> None:
    r = adapter(engine).relay(ctx(stream=True))
    body = b"".join(chunk(None, w, spaced=spaced) for w in WORDS) + chunk(finish, None, spaced=spaced)
    body += b'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4}}\n\ndata: [DONE]\n\n'
    pieces = [body[i : i + 37] for i in range(0, len(body), 37)] if split else [body]
    out = b"".join(r.feed(p) for p in pieces) + r.finish()
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and b'"error"' in events[-2], out
    assert f"finish_reason '{finish}'".encode() in events[-2]
    passed_on = [e for e in events if f'"finish_reason": "{finish}"'.encode() in e.replace(b'":"', b'": "')]
    assert not passed_on, "the abort chunk was passed on"
    assert sum(e.count(w.encode()) for e in events for w in WORDS) == len(WORDS)  # the text went through
    assert r.error is not None and r.error.status == 502 and r.error.code == "stream_interrupted"
    prompt, completion, estimated = usage_or_estimate(r, 7)
    assert (prompt, completion, estimated) == (7, len(WORDS), True)  # one token per event relayed


@pytest.mark.parametrize(
    ("engine", "frame"),
    [
        (
            "tabbyapi",
            {"error": {"message": "Chat completion aborted. Please check the server console.", "trace": None}},
        ),
        ("llama-server", {"error": {"code": 500, "message": "slot aborted", "type": "server_error"}}),
        ("vllm", {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}}),
    ],
)
def test_an_engines_error_frame_ends_the_stream_the_same_way(engine: str, frame: dict[str, Any]) -> None:
    r = adapter(engine).relay(ctx(stream=True))
    body = b"".join(chunk(None, w, spaced=False) for w in WORDS) + b"data: " + orjson.dumps(frame) + b"\n\n"
    out = r.feed(body) + r.finish()
    events = [e for e in out.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and b'"error"' in events[-2], out
    assert r.error is not None and r.error.status == 502
    assert usage_or_estimate(r, 7) == (7, len(WORDS), True)


# -- through the gateway -----------------------------------------------------------------------------

CONFIG = """
server: {access_log: false}
auth:
  mode: keys
  keys:
    - {name: alice, sha256: "${ALICE_SHA}", limits: {tpm: 100000}}
backends:
  - name: eng
    engine: ENGINE
    url: http://engine.test
    timeouts: {connect_s: 1, first_byte_s: 2, idle_s: 2, total_s: 10}
models:
  - name: public-model
    deployments:
      - {backend: eng, model: tiny, format: safetensors, capabilities: [chat]}
"""


def counter(metrics: str, name: str) -> float:
    return sum(float(x.rsplit(" ", 1)[1]) for x in metrics.splitlines() if x.startswith(name + "{"))


@pytest.mark.parametrize(("engine", "finish"), [("sglang", "abort"), ("lmdeploy", "error"), ("vllm", "abort")])
@pytest.mark.parametrize("counted", [True, False])
async def test_through_the_gateway_an_aborted_answer_is_a_502_and_its_tokens_are_counted(
    engine: str, finish: str, counted: bool
) -> None:
    body = orjson.loads(whole(engine, finish, USAGE if counted else None))
    up = FakeUpstream({("POST", "http://engine.test/v1/chat/completions"): [FakeAnswer.json(body)]})
    async with gateway_client(make_config(CONFIG.replace("ENGINE", engine)), upstream=up) as (client, _):
        r = await client.post(
            "/v1/chat/completions",
            json={"model": "public-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50},
        )
        assert r.status_code == 502 and r.json()["error"]["code"] == "generation_failed", r.text
        metrics = (await client.get("/metrics")).text
    assert counter(metrics, "gateway_completion_tokens_total") == (12 if counted else estimate(TEXT))
    assert counter(metrics, "gateway_prompt_tokens_total") > 0
