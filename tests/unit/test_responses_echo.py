"""The Response's echo of tools and instructions keeps their JSON across turns (issue 36 item 2), and what goes out
is byte for byte what encoding the Response plainly gives: on the same turn again, with tools or instructions that
changed (the same length, other contents), whole or streamed."""

from __future__ import annotations

import copy
import itertools
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from llm_gateway.dialects.responses import exchange, response, stream
from llm_gateway.dialects.responses.echo import KEPT, Echo, echo_json, kept_json
from llm_gateway.dialects.responses.request import parse
from llm_gateway.dialects.responses.response import to_response
from llm_gateway.dialects.responses.stream import ResponsesStream
from llm_gateway.wire.recent import Recent

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import agent_request


def _agent(**changes: Any) -> dict[str, Any]:
    body = copy.deepcopy(agent_request.bodies()["responses"])
    body.update(changes)
    return body


def _answer() -> dict[str, Any]:
    msg = {"role": "assistant", "content": "Done."}
    usage = {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13}
    return {"model": "m", "choices": [{"index": 0, "message": msg, "finish_reason": "stop"}], "usage": usage}


def test_recent_finds_equal_keys_and_keeps_the_last_few() -> None:
    kept: Recent[bytes] = Recent(KEPT)
    first = kept_json(kept, b"abc", ["abc"])
    assert kept_json(kept, b"".join([b"ab", b"c"]), ["other"]) is first  # an equal key, another object: found
    assert kept_json(kept, b"abd", ["abd"]) == b'["abd"]'  # the same length, other contents
    for i in range(KEPT - 1):
        kept_json(kept, b"k%d" % i, [i])
    assert kept_json(kept, b"abc", ["new"]) is not first  # pushed out by KEPT newer keys
    assert kept_json(kept, "text", "text") == b'"text"'


def test_a_whole_response_is_what_plain_encoding_gives_across_turns() -> None:
    bodies = [_agent(), _agent(), _agent(), _agent(instructions=_agent()["instructions"].replace("a", "b"))]
    tools = _agent()["tools"]
    changed = copy.deepcopy(tools)
    changed[3]["description"] = changed[3]["description"].replace("a", "e")  # the same length
    bodies.append(_agent(tools=changed))
    bodies.append(_agent(tools=tools[:5], instructions=None))
    seen: list[dict[str, Any]] = []
    for body in bodies:
        req = parse(body)
        enc = echo_json(req)
        assert ("tools" in enc) and (("instructions" in enc) == bool(body.get("instructions")))
        resp, _ = to_response(_answer(), req, "resp_1")
        out = Echo(resp, enc).dumps(resp)
        assert out == orjson.dumps(resp)
        assert orjson.loads(out)["tools"] == req.echo["tools"]
        seen.append(enc)
    assert seen[1]["tools"] is seen[0]["tools"] and seen[2]["instructions"] is seen[0]["instructions"]  # kept
    assert seen[3]["instructions"] is not seen[0]["instructions"] and seen[4]["tools"] is not seen[0]["tools"]


def test_no_tools_or_instructions_nothing_kept() -> None:
    req = parse({"model": "m", "input": "hi"})
    assert echo_json(req) == {}
    resp, _ = to_response(_answer(), req, "resp_1")
    assert Echo(resp, {}).dumps(resp) == orjson.dumps(resp)


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    obj = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
    obj["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
    return b"data: " + orjson.dumps(obj) + b"\n\n"


_CHAT_STREAM = [_chunk({"role": "assistant", "content": ""}), _chunk({"content": "Done."}), _chunk({}, "stop")]


def _streamed(body: dict[str, Any], plain: bool, monkeypatch: pytest.MonkeyPatch) -> bytes:
    ids = itertools.count()
    for module in (stream, response):
        monkeypatch.setattr(module, "new_id", lambda prefix: f"{prefix}{next(ids)}")
    monkeypatch.setattr(response.time, "time", lambda: 1_700_000_000.0)
    if plain:
        monkeypatch.setattr(stream, "echo_json", lambda req: {})
    s = ResponsesStream(parse({**body, "stream": True}), "resp_s")
    out = b"".join(s.feed(w) for w in _CHAT_STREAM) + s.feed(b"data: [DONE]\n\n") + s.finish()
    assert s.terminal == "response.completed"
    return out


def test_a_stream_is_what_plain_encoding_gives_across_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    changed = copy.deepcopy(_agent()["tools"])
    changed[0]["description"] = changed[0]["description"].replace("a", "e")
    for body in (_agent(), _agent(), _agent(tools=changed), _agent(instructions="Be brief.")):
        with monkeypatch.context() as m:
            plain = _streamed(body, True, m)
        with monkeypatch.context() as m:
            kept = _streamed(body, False, m)
        assert kept == plain
        whole = (b"created", b"in_progress", b"completed")
        frames = [f for f in kept.split(b"\n\n") if f.split(b"\n")[0].removeprefix(b"event: response.") in whole]
        assert len(frames) == 3
        for f in frames:
            data = orjson.loads(f.split(b"data: ", 1)[1])
            assert data["response"]["tools"][0]["description"] == body["tools"][0]["description"]
            assert data["response"]["instructions"] == body["instructions"]


def test_the_stored_response_keeps_plain_values() -> None:
    body = _agent()
    s = ResponsesStream(parse({**body, "stream": True}), "resp_s")
    for w in [*_CHAT_STREAM, b"data: [DONE]\n\n"]:
        s.feed(w)
    assert s.terminal == "response.completed"  # what is stored: the plain values, not their JSON
    assert s.response["instructions"] == body["instructions"]
    assert s.response["tools"][0]["name"] == body["tools"][0]["name"]


def test_the_stream_writes_the_kept_json_not_a_new_encoding(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream, "echo_json", lambda req: {"tools": b'"kept"'})
    s = ResponsesStream(parse({**_agent(), "stream": True}), "resp_s")
    out = b"".join(s.feed(w) for w in _CHAT_STREAM) + s.feed(b"data: [DONE]\n\n")
    assert out.count(b'"tools":"kept"') == 3  # created, in_progress, completed


class _Call:
    """What ResponsesExchange.respond needs of a Call: where the answer goes."""

    rid = "req-1"

    def __init__(self) -> None:
        self.answers: list[bytes] = []

    async def respond(self, status: int, body: bytes, headers: Any, content_type: bytes = b"") -> None:
        self.answers.append(body)


async def test_a_whole_answer_writes_the_kept_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(exchange, "echo_json", lambda req: {"tools": b'"kept"'})
    call = _Call()
    ex = exchange.ResponsesExchange(call, parse(_agent()), [], None, "o")  # type: ignore[arg-type]
    await ex.respond(200, orjson.dumps(_answer()), [])
    assert b'"tools":"kept"' in call.answers[0]
    monkeypatch.undo()
    await ex.respond(200, orjson.dumps(_answer()), [])
    assert orjson.loads(call.answers[1])["tools"] == parse(_agent()).echo["tools"]


def _engine_writes(n: int) -> list[bytes]:
    """An engine's stream as bench/fake_engine.py writes it: the role with the first token, a token a write, the
    last token with the finish, the usage and `[DONE]`."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 7, "model": "m"}

    def ev(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**head, "choices": [choice]}) + b"\n\n"

    writes = [ev({"role": "assistant", "content": ""}) + ev({"content": "t0"})]
    writes += [ev({"content": f" t{i}"}) for i in range(1, n)]
    usage = {"prompt_tokens": 11, "completion_tokens": n, "total_tokens": 11 + n}
    writes[-1] += ev({}, "length") + b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
    return [*writes[:-1], writes[-1] + b"data: [DONE]\n\n"]


@pytest.mark.parametrize("agent", [True, False])
def test_a_stream_through_the_relay_is_what_plain_encoding_gives(agent: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a client receives for an agent's streamed request, relayed and translated (the whole-Response frames
    in pieces, joined once), is byte for byte the chat stream translated afterwards with every frame encoded plainly."""
    from llm_gateway.adapters.sse_relay import SSERelay
    from llm_gateway.errors import EngineErrorAnswer
    from llm_gateway.types import CallContext

    body = {**(_agent() if agent else {"model": "m", "input": "hi"}), "stream": True}

    def relay() -> SSERelay:
        return SSERelay(CallContext("chat", "m", "m", True, True, "r"), lambda obj: EngineErrorAnswer("x", status=502))

    def run(translated: bool) -> bytes:
        ids = itertools.count()
        with monkeypatch.context() as m:
            for module in (stream, response):
                m.setattr(module, "new_id", lambda prefix: f"{prefix}{next(ids)}")
            m.setattr(response.time, "time", lambda: 1_700_000_000.0)
            if not translated:
                m.setattr(stream, "echo_json", lambda req: {})
            s = ResponsesStream(parse(body), "resp_s")
            r = relay()
            if translated:
                r.translate(s)
                out = b"".join(r.feed(w) for w in _engine_writes(6)) + r.finish()
            else:  # the chat client's SSE, translated afterwards
                out = s.feed(b"".join(r.feed(w) for w in _engine_writes(6)) + r.finish())
            assert s.terminal == "response.incomplete" and r.done
            return out + s.finish()

    out = run(True)
    assert out == run(False)
    kinds = (b"event: response.created", b"event: response.in_progress", b"event: response.incomplete")
    whole = [f for f in out.split(b"\n\n") if f.startswith(kinds)]
    assert len(whole) == 3 and all((len(f) > 20_000) == agent for f in whole)  # the echo is in each
    for f in whole:
        echoed = orjson.loads(f.split(b"data: ", 1)[1])["response"]
        assert echoed["tools"] == parse(body).echo["tools"] and echoed["instructions"] == body.get("instructions")
