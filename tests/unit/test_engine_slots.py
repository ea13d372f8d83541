"""llama-server slot placement (routing/slots.py): a conversation keeps the slot that holds its prefix.

The book: a conversation is given the idle slot used least recently and keeps it; a slot busy with the gateway's
own request is never named (the engine would make the request wait for it), so then another idle slot is given,
or none; a slot the engine does not have is never named. Through HTTP on two llama-server deployments
(cache_aware): each conversation's turns ask for the same `id_slot` on the same engine, concurrent conversations
get different slots, `affinity.engine_slots: false` sends none, and an engine of another kind gets no such field.
"""

from __future__ import annotations

from typing import Any

from llm_gateway.routing.slots import SlotBook
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream
from tests.unit.test_cache_aware import conversation


def test_a_conversation_keeps_its_slot_and_new_ones_take_the_least_recently_used() -> None:
    book = SlotBook()
    a = book.take("a", 2)
    book.give_back(a)  # type: ignore[arg-type]
    b = book.take("b", 2)
    book.give_back(b)  # type: ignore[arg-type]
    assert {a, b} == {0, 1}
    for _ in range(3):
        assert book.take("a", 2) == a
        book.give_back(a)  # type: ignore[arg-type]
    assert book.take("b", 2) == b
    book.give_back(b)  # type: ignore[arg-type]
    c = book.take("c", 2)  # a third conversation: the slot used least recently (a's)
    assert c == a
    book.give_back(c)  # type: ignore[arg-type]
    assert book.take("a", 2) == b  # a lost its slot to c: it takes the least recent one, b's
    assert book.held == {"c": a, "a": b}


def test_a_busy_slot_is_never_named_and_with_none_idle_none_is() -> None:
    book = SlotBook()
    assert book.take("a", 2) == 0  # in flight
    assert book.take("a", 2) == 1  # a second request of the same conversation: not behind the first
    assert book.take("b", 2) is None  # both busy: the engine chooses
    book.give_back(0)
    assert book.take("b", 2) == 0
    book.give_back(0)
    book.give_back(1)
    assert book.busy == {}


def test_a_slot_the_engine_does_not_have_is_never_named() -> None:
    book = SlotBook()
    assert book.take("a", 0) is None  # the count unknown (no probe yet, /slots disabled)
    assert book.take("a", 4) == 0
    book.give_back(0)
    for s in "bcd":
        book.give_back(book.take(s, 4))  # type: ignore[arg-type]
    assert book.take("d", 2) in (0, 1)  # d held slot 3; the engine now has 2 (restarted with -np 2)


def config(engine: str = "llama-server", affinity: str = "{engine_slots: true}") -> Any:
    names = ["engine-a", "engine-b"]
    backends = "".join(f'  - {{name: {n}, engine: {engine}, url: "http://{n}.test"}}\n' for n in names)
    fmt = "gguf" if engine == "llama-server" else "safetensors"
    deps = "".join(f"      - {{backend: {n}, model: m, format: {fmt}, capabilities: [chat]}}\n" for n in names)
    return make_config(
        f"""
server: {{access_log: false}}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
backends:
{backends}models:
  - name: agent
    strategy: cache_aware
    affinity: {affinity}
    deployments:
{deps}"""
    )


def engines() -> FakeUpstream:
    answer = {
        "id": "c",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    return FakeUpstream({("POST", "/v1/chat/completions"): FakeAnswer.json(answer)})


async def run(cfg: Any, sessions: int = 4, turns: int = 3, slots: int = 2) -> dict[int, list[tuple[str, Any]]]:
    """Each conversation's (engine, id_slot asked) per turn."""
    up = engines()
    async with gateway_client(cfg, upstream=up) as (client, app):
        for b in app.gw.runtime.table.backends.values():
            b.adapter.slot_count = slots  # what the probe of /slots would have said
        for t in range(1, turns + 1):
            for s in range(sessions):
                r = await client.post("/v1/chat/completions", json={"model": "agent", "messages": conversation(s, t)})
                assert r.status_code == 200, r.text
    calls = up.calls_to("/v1/chat/completions")
    order = [(s, t) for t in range(turns) for s in range(sessions)]
    out: dict[int, list[tuple[str, Any]]] = {s: [] for s in range(sessions)}
    for (s, _), call in zip(order, calls, strict=True):
        out[s].append((str(call.url).split("//")[1].split(".")[0], call.json().get("id_slot")))
    return out


async def test_each_conversation_asks_for_the_same_slot_on_the_same_engine_every_turn() -> None:
    served = await run(config())
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    firsts = [turns[0] for turns in served.values()]
    assert all(slot in (0, 1) for _, slot in firsts), served
    assert len(set(firsts)) == len(firsts), served  # conversations on one engine hold different slots


async def test_engine_slots_off_sends_no_slot() -> None:
    served = await run(config(affinity="{}"))  # off by default
    assert all(slot is None for turns in served.values() for _, slot in turns), served


async def test_an_engine_without_slots_gets_no_slot_field() -> None:
    served = await run(config(engine="vllm"))
    assert all(slot is None for turns in served.values() for _, slot in turns), served
