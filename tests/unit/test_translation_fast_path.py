"""The streamed translations' fast paths. The token path (wire/chat_events.text_in): once a text block or
item is open, a chat token event shaped like the last one parsed becomes its Anthropic `text_delta` or
Responses `output_text.delta` without being parsed. It must say exactly what parsing would have said: for
any sequence of chat events (texts with quotes, escapes, control characters, non-ASCII; reasoning, tool
calls, finishes, usage; compact or spaced JSON; a `created` that changes), the events a client parses
are the same with the fast path and without it (`_MAX_LEARNS = 0`). The push path (CallExchange's
`direct_writer`): a chunk translated in the connection's callback that the socket could not take is sent
once, by the relay's next write or end of it, never translated twice."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from llm_gateway.dialects.anthropic import stream as anthropic_stream
from llm_gateway.dialects.anthropic.exchange import AnthropicExchange
from llm_gateway.dialects.anthropic.request import to_chat
from llm_gateway.dialects.anthropic.stream import StreamTranslator
from llm_gateway.dialects.responses import response as responses_response
from llm_gateway.dialects.responses import stream as responses_stream
from llm_gateway.dialects.responses.exchange import ResponsesExchange
from llm_gateway.dialects.responses.request import parse
from llm_gateway.dialects.responses.stream import ResponsesStream
from llm_gateway.wire.chat_events import plain_text, text_in

TOKEN = b'data: {"id":"c1","object":"chat.completion.chunk","created":7,"model":"m","choices":[{"index":0,"delta":{"content":"TEXT"},"logprobs":null,"finish_reason":null}]}\n\n'  # noqa: E501


def token(text: bytes) -> bytes:
    return TOKEN.replace(b"TEXT", text)


def frames(raw: bytes) -> list[tuple[str, Any]]:
    out = []
    for frame in raw.split(b"\n\n"):
        if frame:
            name, data = frame.split(b"\n", 1)
            out.append((name.decode(), orjson.loads(data.removeprefix(b"data: "))))
    return out


def test_a_learnt_token_is_copied_as_the_engine_escaped_it() -> None:
    t = StreamTranslator((), 3)
    assert frames(t.feed(token(b"a") + token(b"b")))[-1][1]["delta"]["text"] == "b"  # "a" parsed, "b" not
    assert t._env is not None
    out = t.feed(token(b"caf\\u00e9 \\n"))
    # parsing would have written the text back as orjson does ("café \n"): the escapes as sent show the fast path
    head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    assert out == head + b'"text":"caf\\u00e9 \\n"}}\n\n'
    assert frames(out)[0][1]["delta"]["text"] == "café \n"

    r = ResponsesStream(parse({"model": "m", "input": "hi", "stream": True}), "resp_1")
    r.feed(token(b"a"))
    out = r.feed(token(b"caf\\u00e9"))
    assert b'"delta":"caf\\u00e9","logprobs":[]}' in out
    r.feed(b"data: [DONE]\n\n")
    assert r.response["output"][0]["content"][0]["text"] == "acafé" and r.turn["content"] == "acafé"


def test_tokens_parsed_for_their_text_do_not_use_up_the_shapes_a_stream_may_learn() -> None:
    # code output: many tokens with a quote go the parsed way; the shape learnt stays the one learnt, so a
    # later change of shape (`created` ticks each second) is still learnt and taken unparsed
    t = StreamTranslator((), 3)
    r = ResponsesStream(parse({"model": "m", "input": "hi", "stream": True}), "resp_1")
    later = token(b"b").replace(b'"created":7', b'"created":8')
    for tr in (t, r):
        tr.feed(token(b"a"))
        for _ in range(40):
            tr.feed(token(b'\\"q\\"'))
        tr.feed(later)
        assert tr._env is not None and tr._env[0] == later.split(b'"b"')[0] + b'"'
        assert b"caf\\u00e9" in tr.feed(later.replace(b'"b"', b'"caf\\u00e9"'))  # unparsed: escapes as sent


@pytest.mark.parametrize(
    "text",
    [b'say \\"hi\\"', b"bad \\x escape", b"raw \x01 control", b"cut \\", b"\xff\xfe not utf-8", b""],
)
def test_what_parsing_would_refuse_or_treat_apart_is_not_taken_unparsed(text: bytes) -> None:
    before, after = TOKEN.split(b"TEXT")
    assert text_in(token(text), before, after) is None


def _chunk(delta: dict[str, Any], **choice: Any) -> dict[str, Any]:
    return {"id": "c", "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None, **choice}]}


def test_only_a_chunk_of_nothing_but_text_is_a_token_to_learn() -> None:
    assert plain_text(_chunk({"content": "x"})) == "x"
    assert plain_text(_chunk({"content": ""})) is None
    assert plain_text(_chunk({"content": "x"}, finish_reason="stop")) is None  # its finish would be lost
    assert plain_text(_chunk({"content": "x"}, logprobs={"content": []})) is None
    assert plain_text(_chunk({"content": "x", "reasoning_content": "y"})) is None
    assert plain_text(_chunk({"content": "x"}) | {"usage": {"prompt_tokens": 1}}) is None
    assert plain_text({"id": "c", "choices": [_chunk({"content": "x"})["choices"][0]] * 2}) is None


# -- the equivalence -----------------------------------------------------------------------------------
texts = st.text(alphabet=st.characters(codec="utf-8", categories=None), min_size=0, max_size=8) | st.sampled_from(
    ["a", " the", '"', "\\", "\n", "é", "\u2028", "\x00", "}", '"},{"content":"x']
)
TEXTS = ["text", "text", "text", "text_finish", "text_logprobs", "text_reasoning"]
kinds = st.sampled_from([*TEXTS, "reasoning", "tool", "role", "finish", "usage", "empty"])
events_st = st.lists(st.tuples(kinds, texts, st.booleans(), st.booleans()), min_size=1, max_size=25)


def chat_event(kind: str, text: str, spaced: bool, tick: bool, n: int) -> bytes:
    delta: dict[str, Any]
    finish, logprobs = None, None
    if kind == "text":
        delta = {"content": text}
    elif kind == "text_finish":  # the last token with the finish (llama-server's last chunk can be so)
        delta, finish = {"content": text}, "length"
    elif kind == "text_reasoning":  # reasoning and text in one delta: a thinking delta, then a text delta
        delta = {"reasoning_content": text, "content": text}
    elif kind == "text_logprobs":
        delta = {"content": text}
        logprobs = {"content": [{"token": text, "logprob": -0.5, "bytes": list(text.encode()), "top_logprobs": []}]}
    elif kind == "reasoning":
        delta = {"reasoning_content": text}
    elif kind == "tool":
        delta = {"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f", "arguments": text}}]}
    elif kind == "role":
        delta = {"role": "assistant", "content": text}
    elif kind == "finish":
        delta, finish = {}, "stop"
    else:
        delta = {}
    obj: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1000 + (n if tick else 0),
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if kind == "usage":
        obj = {**obj, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}}
    body = json.dumps(obj).encode() if spaced else orjson.dumps(obj)  # json.dumps: spaced, \uXXXX escapes
    return b"data: " + body + b"\n\n"


def wire(evs: list[tuple[str, str, bool, bool]]) -> list[bytes]:
    return [chat_event(k, t, sp, tick, i) for i, (k, t, sp, tick) in enumerate(evs)] + [b"data: [DONE]\n\n"]


def anthropic_run(writes: list[bytes]) -> list[tuple[str, Any]]:
    t = StreamTranslator((), 3)
    return frames(b"".join(t.feed(w) for w in writes) + t.finish())


def responses_run(writes: list[bytes], monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[str, Any]], Any, Any]:
    ids = itertools.count()
    for module in (responses_stream, responses_response):  # item ids: the same in both runs
        monkeypatch.setattr(module, "new_id", lambda prefix: f"{prefix}{next(ids)}")
    s = ResponsesStream(parse({"model": "m", "input": "hi", "stream": True}), "resp_1")
    out = frames(b"".join(s.feed(w) for w in writes) + s.finish())
    for _, obj in out:  # the clock, not the translation
        if isinstance(obj.get("response"), dict):
            obj["response"].pop("created_at", None)
    s.response.pop("created_at", None)
    return out, s.response, s.turn


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evs=events_st)
# a token with its finish after another finish: learnt, its finish would be lost
@example(evs=[("text", "a", False, False), *[("text_finish", "b", False, False), ("finish", "", False, False)] * 2][:4])
@example(evs=[("text", "a", False, False), *[("text_reasoning", c, False, False) for c in "bb"]])  # reasoning lost?
def test_the_fast_path_says_what_parsing_says(
    evs: list[tuple[str, str, bool, bool]], monkeypatch: pytest.MonkeyPatch
) -> None:
    events = wire(evs)
    whole = b"".join(events)
    for writes in (
        events,  # one event a write, as the relay writes a token
        [b"".join(events[i : i + 2]) for i in range(0, len(events), 2)],  # two events in one read
        [whole[i : i + 37] for i in range(0, len(whole), 37)],  # cut anywhere: partial events held
    ):
        fast_a, fast_r = anthropic_run(writes), responses_run(writes, monkeypatch)
        with monkeypatch.context() as m:
            m.setattr(anthropic_stream, "_MAX_LEARNS", 0)
            m.setattr(responses_stream, "_MAX_LEARNS", 0)
            slow_a, slow_r = anthropic_run(writes), responses_run(writes, monkeypatch)
        assert fast_a == slow_a
        assert fast_r == slow_r


# -- written from the connection's callback (the relay's push mode) ----------------------------------------
class _Call:
    """A `Call` as the exchanges see it: a chunk writer that can refuse (a full socket), and the async path."""

    rid = "req-1"

    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.refuse = False

    def direct_writer(self) -> Callable[[bytes], bool]:
        def direct(data: bytes) -> bool:
            if self.refuse:
                return False
            self.sent.append(data)
            return True

        return direct

    async def start(self, status: int, headers: Any, *, hold: bool = False) -> None:
        pass

    async def write(self, data: bytes) -> None:
        self.sent.append(data)

    async def end(self, data: bytes = b"") -> None:
        self.sent.append(data)


def _anthropic() -> tuple[AnthropicExchange, _Call]:
    call = _Call()
    req = to_chat({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], "stream": True})
    return AnthropicExchange(call, req, {}), call  # type: ignore[arg-type]


def _responses() -> tuple[ResponsesExchange, _Call]:
    call = _Call()
    return ResponsesExchange(call, parse({"model": "m", "input": "hi", "stream": True}), [], None, "o"), call  # type: ignore[arg-type]


def _texts(raw: bytes) -> str:
    """The text deltas a client saw, checked against what the translation itself counted at the end: the
    estimated output tokens (one per delta: no usage chunk here) or the completed Response's text."""
    out = ""
    for name, obj in frames(raw):
        d = obj.get("delta")
        out += d.get("text", "") if isinstance(d, dict) else d if isinstance(d, str) else ""
        if name == "event: message_delta":
            assert obj["usage"]["output_tokens"] == len(out)  # one-letter tokens
        if name == "event: response.completed":
            assert obj["response"]["output"][0]["content"][0]["text"] == out
    return out


@pytest.mark.parametrize("make", [_anthropic, _responses])
def test_a_chunk_the_socket_refused_is_sent_once_by_the_write_that_follows(make: Callable[[], Any]) -> None:
    ex, call = make()
    write_now = ex.direct_writer()
    assert write_now is not None
    asyncio.run(ex.start(200, []))
    assert write_now(token(b"a")) and write_now(token(b"b"))
    call.refuse = True
    kept = token(b"c")
    assert not write_now(kept)  # translated, kept: the relay writes this chunk itself next
    call.refuse = False
    asyncio.run(ex.write(kept))
    assert write_now(token(b"d"))
    asyncio.run(ex.end(b"data: [DONE]\n\n"))
    assert _texts(b"".join(call.sent)) == "abcd"  # each once, in order


@pytest.mark.parametrize("make", [_anthropic, _responses])
def test_a_refused_chunk_ended_with_more_is_sent_once_before_the_rest(make: Callable[[], Any]) -> None:
    ex, call = make()
    write_now = ex.direct_writer()
    assert write_now is not None
    asyncio.run(ex.start(200, []))
    assert write_now(token(b"a"))
    call.refuse = True
    kept = token(b"b")
    assert not write_now(kept)
    asyncio.run(ex.end(kept + token(b"c") + b"data: [DONE]\n\n"))  # the relay's end: kept parts joined
    assert _texts(b"".join(call.sent)) == "abc"


def test_the_responses_last_event_waits_for_the_async_path() -> None:
    ex, call = _responses()
    write_now = ex.direct_writer()
    assert write_now is not None
    asyncio.run(ex.start(200, []))
    assert write_now(token(b"a"))
    done = b"data: [DONE]\n\n"
    assert not write_now(done) and not any(b"response.completed" in s for s in call.sent)  # the store first
    asyncio.run(ex.end(done))
    assert b"response.completed" in call.sent[-1] and _texts(b"".join(call.sent)) == "a"
