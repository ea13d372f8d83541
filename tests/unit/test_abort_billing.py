"""What an unfinished stream is billed: the relays count the generated text they pass on, so the
estimate (`completion_estimate`) is honest when an engine puts several tokens in one event (vLLM and
SGLang with `--stream-interval`), and stays the event count when it sends one token per event.

The count is exact without parsing on the fast path: once one event of a stream has been measured, a
block that starts and ends like it is its envelopes around the text. These tests hold it to the
bytes a parser would count, for every shape and split of the stream.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gateway.adapters.ollama import OllamaAdapter
from llm_gateway.adapters.relay_base import BYTES_PER_TOKEN, usage_or_estimate
from llm_gateway.adapters.sse_relay import SSERelay, text_bytes
from llm_gateway.errors import EngineErrorAnswer
from llm_gateway.types import BackendInfo, CallContext, Usage
from llm_gateway_emulators import VOCAB


def ctx(public: str = "tiny-llama", upstream: str = "tiny-llama", endpoint: str = "chat") -> CallContext:
    return CallContext(endpoint, public, upstream, True, False, "req-123")  # type: ignore[arg-type]


def relay(c: CallContext | None = None) -> SSERelay:
    return SSERelay(c or ctx(), lambda obj: EngineErrorAnswer("frame", status=502, code="x"))


def event(delta: dict[str, Any], finish: str | None = None, *, spaced: bool = False, **extra: Any) -> bytes:
    obj = {
        "id": "chatcmpl-953a9c2d42d54ebb",
        "object": "chat.completion.chunk",
        "created": 1796007492,
        "model": "tiny-llama",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **extra,
    }
    # compact JSON (vLLM, llama.cpp, SGLang) or Python's json.dumps (TabbyAPI, LMDeploy: spaced, ASCII)
    data = json.dumps(obj).encode() if spaced else orjson.dumps(obj)
    return b"data: " + data + b"\n\n"


def sent(text: str, spaced: bool = False) -> int:
    """The bytes of `text` inside a JSON string, as the engine writes it (escapes included)."""
    return len(json.dumps(text) if spaced else orjson.dumps(text)) - 2


def feed_all(r: SSERelay, chunks: Iterable[bytes]) -> bytes:
    return b"".join(r.feed(c) for c in chunks)


ROLE = event({"role": "assistant", "content": ""})


def test_one_token_per_event_is_billed_one_token_per_event():
    r = relay()
    feed_all(r, [ROLE, *(event({"content": VOCAB[i % len(VOCAB)]}) for i in range(100))])
    assert r.text_bytes == sum(sent(VOCAB[i % len(VOCAB)]) for i in range(100))
    assert r.completion_estimate() == r.content_events == 101  # the role chunk counts: an event


@pytest.mark.parametrize("per_event", [2, 4, 16])
def test_several_tokens_per_event_are_billed_by_their_text_not_by_the_events(per_event: int):
    """--stream-interval N: counting events would bill 1/N of the tokens."""
    tokens = [VOCAB[i % len(VOCAB)] for i in range(400)]
    groups = ["".join(tokens[i : i + per_event]) for i in range(0, 400, per_event)]
    r = relay()
    feed_all(r, [ROLE, *(event({"content": g}) for g in groups)])
    assert r.content_events == len(groups) + 1
    assert r.text_bytes == sum(map(sent, groups))
    assert 400 <= r.completion_estimate() <= 1.15 * 400  # the emulator's words: 4.4 bytes a token


def test_the_estimate_rounds_up_and_never_falls_below_the_events():
    r = relay()
    r.feed(event({"content": "abcdefghi"}))  # 9 bytes: 3 tokens at 4 bytes each, rounded up
    assert (r.content_events, r.text_bytes, r.completion_estimate()) == (1, 9, -(-9 // BYTES_PER_TOKEN))
    r.feed(event({"content": ""}) * 5)  # tokens that decode to no text yet: one event each
    assert r.completion_estimate() == 6


def test_every_field_that_carries_generated_text_counts():
    r = relay()
    evs = [
        event({"reasoning_content": "think"}),
        event({"reasoning": "more"}),  # vLLM's field
        event({"content": "say"}),
        event({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": '{"a": 1}'}}]}),
        event({}, "stop"),
    ]
    feed_all(r, evs)
    assert r.text_bytes == sent("think") + sent("more") + sent("say") + sent('{"a": 1}')


def test_escapes_are_counted_as_sent_and_never_end_a_string_early():
    texts = ['say "hi"', "back\\slash\\", 'end with \\"', "line\nbreak\ttab", "é \u2013 漢字 🦙", "\u0001"]
    r = relay()
    feed_all(r, [event({"content": t}) for t in texts])
    assert r.text_bytes == sum(map(sent, texts)) == sum(text_bytes(event({"content": t})) for t in texts)


def test_the_public_model_name_does_not_change_the_count():
    evs = [ROLE, *(event({"content": "ab" * i}) for i in range(1, 50))]
    same, renamed = relay(), relay(ctx(public="a-much-longer-public-model-name", upstream="tiny-llama"))
    feed_all(same, evs)
    feed_all(renamed, evs)
    assert same.text_bytes == renamed.text_bytes == sum(sent("ab" * i) for i in range(1, 50))


def test_slow_path_events_count_too():
    """Pings (TabbyAPI), CRLF framing, `usage: null` in json.dumps style (LMDeploy), a usage chunk."""
    pieces = ["one", "two", "three"]
    block = (
        b": ping\r\n\r\n"
        + event({"content": pieces[0]}, spaced=True, usage=None).replace(b"\n", b"\r\n")
        + event({"content": pieces[1]}, spaced=True, usage=None)
    )
    r = relay()
    r.feed(block)
    u = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}
    r.feed(event({"content": pieces[2]}, usage=u))  # usage riding on a content chunk (TabbyAPI)
    assert r.text_bytes == sum(map(sent, pieces))  # ASCII: the same bytes in either style
    assert r.usage == Usage(3, 3)


def test_the_cheap_count_is_what_runs_once_the_shape_is_known(monkeypatch):
    scans: list[bytes] = []
    real_scan = SSERelay._scan

    def counting(self: SSERelay, block: bytes) -> None:
        scans.append(block)
        real_scan(self, block)

    monkeypatch.setattr(SSERelay, "_scan", counting)
    r = relay()
    texts = [VOCAB[i % len(VOCAB)] * (1 + i % 3) for i in range(1000)]
    feed_all(r, [ROLE, *(event({"content": t}) for t in texts)])
    assert len(scans) == 2  # the role chunk, then the first content event: every later one is arithmetic
    assert r.text_bytes == sum(map(sent, texts))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    items=st.lists(
        st.tuples(
            st.sampled_from(["content", "reasoning_content", "reasoning", "arguments", "role", "finish"]),
            st.text(max_size=12),
        ),
        max_size=25,
    ),
    spaced=st.booleans(),
    cuts=st.lists(st.integers(min_value=1, max_value=4000), max_size=12),
)
def test_any_stream_split_anywhere_counts_exactly_what_a_parser_would(items, spaced, cuts):
    evs, expected = [], 0
    for kind, text in items:
        if kind == "role":
            evs.append(event({"role": "assistant", "content": ""}, spaced=spaced))
        elif kind == "finish":
            evs.append(event({}, "length", spaced=spaced))
        elif kind == "arguments":
            call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": text}}
            evs.append(event({"tool_calls": [call]}, spaced=spaced))
            expected += sent(text, spaced)
        else:
            evs.append(event({kind: text}, spaced=spaced))
            expected += sent(text, spaced)
    stream = b"".join(evs)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    r = relay(ctx(public="pub", upstream="tiny-llama"))
    feed_all(r, [stream[a:b] for a, b in itertools.pairwise(points)])
    assert r.text_bytes == expected
    assert r.completion_estimate() >= r.content_events


# -- Ollama's NDJSON, and what the service settles -------------------------------------------------------


def ollama_line(content: str = "", thinking: str | None = None, done: bool = False) -> bytes:
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking is not None:
        msg["thinking"] = thinking
    return orjson.dumps({"model": "tiny", "created_at": "2026-11-30T02:59:45Z", "message": msg, "done": done}) + b"\n"


def test_ollama_counts_the_utf8_bytes_of_its_deltas():
    r = OllamaAdapter(BackendInfo("o", "http://o.test", None)).relay(ctx(public="m", upstream="tiny"))
    r.feed(ollama_line("Hello, this is") + ollama_line(thinking="hm") + ollama_line(" a llama 🦙"))
    assert r.text_bytes == len(b"Hello, this is") + len(b"hm") + len(" a llama 🦙".encode())
    assert r.completion_estimate() == max(r.content_events, -(-r.text_bytes // BYTES_PER_TOKEN))


def test_the_service_bills_the_engines_usage_when_it_came_and_the_estimate_when_not():
    r = relay()
    r.feed(event({"content": "Hello, this is a test"}))  # 21 bytes in one event
    assert usage_or_estimate(r, 7) == (7, 6, True)
    r.feed(event({}, "length", usage={"prompt_tokens": 9, "completion_tokens": 5, "total_tokens": 14}))
    assert usage_or_estimate(r, 7) == (9, 5, False)
