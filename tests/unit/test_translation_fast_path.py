"""The translated streams: the relay drives the translation (wire/chat_events.ChatTranslation) with the
engine's events, and an ordinary token whose envelope the relay has learnt (adapters/sse_relay.py) is handed
over as its text alone, which becomes its Anthropic `text_delta` or Responses `output_text.delta` without
being parsed. Nothing is written as OpenAI SSE to be read back. It must say exactly what the translation of
the chat stream says: for any stream an engine sends (texts with quotes, escapes, control characters,
non-ASCII; reasoning, tool calls, finishes, usage, an in-band error; compact or spaced JSON; a `created`
that changes; the model name swapped or not), split anyhow, the events a client parses, and what the relay
counts, are the same with the token path, without it (`_MAX_LEARNS = 0`: every event parsed by the
translation), and as the chat client's OpenAI SSE fed to the translation afterwards (the way before). The
exchanges write the relay's output as it is (one buffer: the relay's), and translate only what the service
writes itself before a relay exists (a queued stream's comments and failure)."""

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

from llm_gateway.adapters import sse_relay, sse_translated
from llm_gateway.adapters.sse_relay import SSERelay
from llm_gateway.dialects.anthropic.exchange import AnthropicExchange
from llm_gateway.dialects.anthropic.request import to_chat
from llm_gateway.dialects.anthropic.stream import StreamTranslator
from llm_gateway.dialects.responses import response as responses_response
from llm_gateway.dialects.responses import stream as responses_stream
from llm_gateway.dialects.responses.exchange import ResponsesExchange
from llm_gateway.dialects.responses.request import parse
from llm_gateway.dialects.responses.stream import ResponsesStream
from llm_gateway.errors import DONE, EngineErrorAnswer, Overloaded
from llm_gateway.types import CallContext
from llm_gateway.wire.chat_events import ChatTranslation, plain_text

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


def ctx(public: str = "m") -> CallContext:
    return CallContext("chat", public, "m", True, True, "req-1")


def relay(public: str = "m") -> SSERelay:
    return SSERelay(ctx(public), lambda obj: EngineErrorAnswer("the engine failed: " + str(obj["error"]), status=502))


def translated(tr: ChatTranslation, public: str = "m") -> SSERelay:
    r = relay(public)
    r.translate(tr)
    return r


def anthropic() -> StreamTranslator:
    return StreamTranslator((), 3)


def responses() -> ResponsesStream:
    return ResponsesStream(parse({"model": "m", "input": "hi", "stream": True}), "resp_1")


def test_a_learnt_token_is_copied_as_the_engine_escaped_it() -> None:
    t = anthropic()
    r = translated(t)
    assert frames(r.feed(token(b"a")) + r.feed(token(b"b")))[-1][1]["delta"]["text"] == "b"
    assert r._tok is not None  # learnt from "a" (the first output): "b" was handed over as its text
    out = r.feed(token(b"caf\\u00e9 \\n"))
    # parsing would have written the text back as orjson does ("café \n"): the escapes as sent show the token path
    head = b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    assert out == head + b'"text":"caf\\u00e9 \\n"}}\n\n'
    assert frames(out)[0][1]["delta"]["text"] == "café \n"

    s = responses()
    r = translated(s)
    r.feed(token(b"a"))
    out = r.feed(token(b"caf\\u00e9"))
    assert b'"delta":"caf\\u00e9","logprobs":[]}' in out
    r.feed(b"data: [DONE]\n\n")
    assert s.response["output"][0]["content"][0]["text"] == "acafé" and s.turn["content"] == "acafé"


@pytest.mark.parametrize("text", [b"bad \\x escape", b"raw \x01 control", b"\xff\xfe not utf-8", b"cut \\"])
def test_what_parsing_would_refuse_is_not_taken_as_a_token(text: bytes) -> None:
    for tr in (anthropic(), responses()):
        tr.feed(token(b"a"))  # a text block or item open
        assert tr.token(text) is None


def test_a_token_with_no_text_open_is_parsed() -> None:
    for tr in (anthropic(), responses()):
        assert tr.token(b"a") is None  # nothing open yet: the message/response and its block/item start first
        tr.feed(token(b"a"))
        assert tr.token(b"b") is not None
        tr.feed(token(b"").replace(b'"content":""', b'"reasoning_content":"r"'))  # a thinking block now
        assert tr.token(b"c") is None


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


def test_a_reasoning_envelope_is_no_token_envelope() -> None:
    # the relay's envelope learner takes any one-text event; only an ordinary token's is a token envelope
    t = anthropic()
    r = translated(t)
    reasoning = token(b"r").replace(b'"content"', b'"reasoning_content"')
    r.feed(reasoning)
    r.feed(reasoning)
    assert r._learns == 2 and r._tok is None
    assert [n for n, _ in frames(r.feed(reasoning))] == ["event: content_block_delta"]


# -- the equivalence -----------------------------------------------------------------------------------
texts = st.text(alphabet=st.characters(codec="utf-8", categories=None), min_size=0, max_size=8) | st.sampled_from(
    ["a", " the", '"', "\\", "\n", "é", "\u2028", "\x00", "}", '"},{"content":"x']
)
TEXTS = ["text", "text", "text", "text_finish", "text_logprobs", "text_reasoning"]
kinds = st.sampled_from([*TEXTS, "reasoning", "tool", "role", "finish", "usage", "empty", "error"])
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


ERROR = b'data: {"error":{"message":"boom","type":"server_error"}}\n\n'


def wire(evs: list[tuple[str, str, bool, bool]]) -> list[bytes]:
    out = []
    for i, (k, t, sp, tick) in enumerate(evs):
        if k == "error":  # an in-band engine error: the stream's last event
            return [*out, ERROR]
        out.append(chat_event(k, t, sp, tick, i))
    return [*out, b"data: [DONE]\n\n"]


_IDS = [itertools.count()]


def _stable(out: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    for _, obj in out:  # the clock, not the translation
        if isinstance(obj.get("response"), dict):
            obj["response"].pop("created_at", None)
    return out


def run(make: Callable[[], ChatTranslation], writes: list[bytes], how: str, public: str) -> tuple[Any, ...]:
    """The client's frames and what the relay counted, for the stream `writes` relayed and translated `how`."""
    _IDS[0] = itertools.count()
    tr = make()
    if how == "chat":  # the chat client's OpenAI SSE, fed to the translation afterwards
        r = relay(public)
        chat = b"".join(r.feed(w) for w in writes) + r.finish()
        raw = tr.feed(chat) + tr.finish()
    else:
        r = translated(tr, public)
        parts = []
        for w in writes:
            parts.append(r.feed(w))
            # the translation ends only with the relay: its last part is never written from the callback
            assert not tr.done or r.done or r.error is not None
        raw = b"".join(parts) + r.finish() + tr.finish()
    err = None if r.error is None else r.error.message
    return _stable(frames(raw)), r.content_events, r.text_bytes, r.done, err, r.output_started


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(evs=events_st, public=st.sampled_from(["m", "public-m"]))
# a token with its finish after another finish: learnt, its finish would be lost
@example(
    evs=[("text", "a", False, False), *[("text_finish", "b", False, False), ("finish", "", False, False)] * 2][:4],
    public="m",
)
@example(evs=[("text", "a", False, False), *[("text_reasoning", c, False, False) for c in "bb"]], public="m")
@example(evs=[("text", "a", False, False), ("text", "b", False, False), ("error", "", False, False)], public="m")
# a token event's shape measured on a reasoning event: a later event of reasoning and text has both after that prefix
@example(
    evs=[
        ("text", "", False, False),
        ("text", "0", True, False),
        ("reasoning", "", False, False),
        ("text", "", True, False),
        ("text_reasoning", "", False, False),
    ],
    public="m",
)
def test_the_token_path_says_what_parsing_says(
    evs: list[tuple[str, str, bool, bool]], public: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (responses_stream, responses_response):  # item ids: the same in every run
        monkeypatch.setattr(module, "new_id", lambda prefix: f"{prefix}{next(_IDS[0])}")
    events = wire(evs)
    whole = b"".join(events)
    for writes in (
        events,  # one event a read, as an engine sends a token
        [b"".join(events[i : i + 2]) for i in range(0, len(events), 2)],  # two events in one read
        [whole[i : i + 37] for i in range(0, len(whole), 37)],  # cut anywhere: partial events held
    ):
        for make in (anthropic, responses):
            fast = run(make, writes, "translated", public)
            with monkeypatch.context() as m:
                m.setattr(sse_relay, "_MAX_LEARNS", 0)
                m.setattr(sse_translated, "_MAX_LEARNS", 0)  # the token path learns its envelope there
                parsed = run(make, writes, "translated", public)
            before = run(make, writes, "chat", public)
            assert fast == parsed == before


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


def test_tokens_coalesced_in_one_read_are_handed_over_one_by_one() -> None:
    for tr in (anthropic(), responses()):
        r = translated(tr, "public-m")  # the model name swapped: the envelope is the engine's bytes'
        r.feed(token(b"a"))
        r.feed(token(b"b") + token(b"c"))  # learnt from "b": taken apart, parsed
        # parsing would write the texts back as orjson does ("d", "e"): the escapes as sent show the token path
        out = r.feed(token(b"\\u0064") + token(b"\\u0065") + token(b'\\"q\\"'))
        assert out.count(b"\\u0064") == out.count(b"\\u0065") == 1
        assert [d for _, d in frames(out)][2]["delta"] in ('"q"', {"type": "text_delta", "text": '"q"'})
        assert r.content_events == 6


@pytest.mark.parametrize("make", [_anthropic, _responses])
def test_the_relays_writes_go_out_as_they_are_once_each(make: Callable[[], Any]) -> None:
    ex, call = make()
    asyncio.run(ex.start(200, []))  # started early: a queued stream
    asyncio.run(ex.write(b": queued position=1\n\n"))  # the service's own writes are OpenAI SSE: translated
    r = translated(ex.translation())
    write_now = ex.direct_writer()
    assert write_now is not None
    assert write_now(r.feed(token(b"a"))) and write_now(r.feed(token(b"b")))
    call.refuse = True
    kept = r.feed(token(b"c"))
    assert not write_now(kept)  # the relay keeps it and writes it itself next: nothing to re-match here
    call.refuse = False
    asyncio.run(ex.write(kept))
    assert write_now(r.feed(token(b"d")))
    last = r.feed(b"data: [DONE]\n\n")
    assert r.done  # so the relay writes the last part with the end, never from the callback
    asyncio.run(ex.end(last))
    assert _texts(b"".join(call.sent)) == "abcd"  # each once, in order


@pytest.mark.parametrize("make", [_anthropic, _responses])
def test_a_queued_streams_failure_is_the_clients_error_event(make: Callable[[], Any]) -> None:
    ex, call = make()
    asyncio.run(ex.start(200, []))
    asyncio.run(ex.write(Overloaded("the queue is full").sse_event() + DONE))  # service/queue_progress.fail
    asyncio.run(ex.end())
    name, obj = frames(b"".join(call.sent))[-1]
    if isinstance(ex, AnthropicExchange):
        assert (name, obj["error"]["type"]) == ("event: error", "overloaded_error")
    else:
        assert name == "event: response.failed" and "queue_full" in obj["response"]["error"]["message"]


def test_the_responses_last_event_waits_for_the_store(monkeypatch: pytest.MonkeyPatch) -> None:
    ex, call = _responses()
    saved: list[int] = []

    async def save(self: ResponsesExchange, resp: Any, turn: Any) -> bool:
        saved.append(len(call.sent))
        return True

    monkeypatch.setattr(ResponsesExchange, "_save", save)
    r = translated(ex.translation())
    asyncio.run(ex.start(200, []))
    write_now = ex.direct_writer()
    assert write_now is not None and write_now(r.feed(token(b"a")))
    last = r.feed(b"data: [DONE]\n\n")
    assert r.done and b"response.completed" in last
    asyncio.run(ex.end(last))
    assert saved == [1] and b"response.completed" in call.sent[-1] and _texts(b"".join(call.sent)) == "a"


# -- Ollama: its relay makes the chunks, handed to the translation as objects ---------------------------------
OLLAMA_LINES = [
    b'{"model":"tiny","message":{"role":"assistant","content":"","thinking":"hmm"},"done":false}\n',
    b'{"model":"tiny","message":{"role":"assistant","content":" llama"},"done":false}\n',
    b'{"model":"tiny","message":{"role":"assistant","content":"","tool_calls":[{"function":{"name":"f",'
    b'"arguments":{"city":"Rome"}}}]},"done":false}\n',
    b'{"model":"tiny","message":{"role":"assistant","content":""},"done_reason":"stop","done":true,'
    b'"prompt_eval_count":34,"eval_count":5}\n',
]


@pytest.mark.parametrize(
    "lines",
    [
        OLLAMA_LINES,
        [*OLLAMA_LINES[1:2], b'{"error":"the model crashed"}\n'],  # an error line mid-stream
        OLLAMA_LINES[:2],  # the body ends without `done`
        [b"".join(OLLAMA_LINES)],  # all in one read
    ],
)
@pytest.mark.parametrize("make", [anthropic, responses])
def test_an_ollama_stream_translated_by_objects_says_what_its_chat_stream_says(
    lines: list[bytes], make: Callable[[], ChatTranslation], monkeypatch: pytest.MonkeyPatch
) -> None:
    from llm_gateway.adapters.ollama import OllamaAdapter
    from llm_gateway.types import BackendInfo

    for module in (responses_stream, responses_response):
        monkeypatch.setattr(module, "new_id", lambda prefix: f"{prefix}{next(_IDS[0])}")
    got = []
    for how in ("translated", "chat"):
        _IDS[0] = itertools.count()
        relay = OllamaAdapter(BackendInfo("ollama-a", "http://127.0.0.1:11434")).relay(ctx())
        tr = make()
        if how == "translated":
            relay.translate(tr)
            raw = b"".join(relay.feed(line) for line in lines) + relay.finish() + tr.finish()
        else:
            chat = b"".join(relay.feed(line) for line in lines) + relay.finish()
            raw = tr.feed(chat) + tr.finish()
        got.append((_stable(frames(raw)), relay.usage, relay.content_events, relay.error is None))
    assert got[0] == got[1]
