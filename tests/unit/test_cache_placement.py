"""cache_aware across gateway replicas (routing/placements.py, selection.py rule 3, prefix_cache.anchor_key).

Deterministically: a conversation's placement key (its session, else the block key ending its first user message)
is the same every turn and differs between conversations that share only a system prompt; a conversation nobody
placed goes to the rendezvous hash of that key over the candidates, whatever their order or the rotation, so every
replica derives the same deployment, and removing a deployment moves only the conversations that were on it; the
replicas' shared record (`assigned`) wins over the local one, and a hot assigned replica still yields; under hash
placement (no Redis) the hash wins over the local record too, so a yield lasts one turn.
Through HTTP: three in-process gateway replicas in front of the same two engines, each turn to the next replica,
keep every conversation on one engine (without Redis, by the hash alone), and after one replica moved a turn away
from a hot engine, all three send the next turn home once it is cool; with a real Redis, the replicas follow a
placement another replica recorded (a moved conversation) instead of the hash, and no session id reaches Redis.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack
from typing import Any

import pytest
from pydantic import SecretStr

from llm_gateway.routing.placements import RedisPlacements
from llm_gateway.routing.prefix_cache import prompt_blocks
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.selection import CandidateView, order
from llm_gateway.settings import AffinityConfig
from tests.conftest import gateway_client
from tests.support.redis_server import RedisNotInstalled, RedisServer
from tests.unit.test_cache_aware import NAMES, SYSTEM, config, conversation, engines

NOW = 1000.0
BLOCK = 256
TOOLS = b'[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]'


def anchor(messages: Any, tools: bytes = TOOLS) -> str | None:
    from llm_gateway.routing.prefix_cache import anchor_key

    info = RequestInfo.__new__(RequestInfo)  # only the fields anchor_key reads
    info.conversation, info.tools_json, info.blocks = messages, tools, None
    return anchor_key(info, BLOCK)


def view(key: str, *, in_flight: int = 0, session_at: float = 0.0, assigned: bool = False) -> CandidateView:
    c = CandidateView(key, in_flight, 2, False, None, 0)
    c.session_at, c.assigned = session_at, assigned
    return c


def first(
    cands: list[CandidateView],
    key: str | None,
    *,
    fresh: bool = False,
    rotation: int = 0,
    spread_new: bool = False,
    max_imbalance: float = AffinityConfig().max_imbalance,  # the config's default, as dispatch passes it
) -> str:
    idx = order(
        "cache_aware",
        cands,
        now=NOW,
        stale_s=15.0,
        rotation=rotation,
        affinity_key=key,
        fresh=fresh,
        spread_new=spread_new,
        max_imbalance=max_imbalance,
    )
    return cands[idx[0]].key


# -- the placement key ------------------------------------------------------------------------------------


def test_the_anchor_is_the_same_every_turn_and_differs_between_conversations() -> None:
    turns = [anchor(conversation(0, t)) for t in range(1, 6)]
    assert turns[0] is not None and len(set(turns)) == 1
    others = {anchor(conversation(s, 3)) for s in range(1, 20)}
    assert len(others) == 19 and turns[0] not in others  # a shared system prompt is not a shared conversation
    assert anchor(conversation(0, 2), b"") != turns[0]  # the tools are part of it


def test_the_anchor_ends_at_the_first_user_message_exactly() -> None:
    msgs = conversation(0, 3)
    pb = prompt_blocks(msgs, TOOLS, BLOCK)
    head = prompt_blocks(msgs[:2], TOOLS, BLOCK)  # system + first question
    assert pb.anchor == len(head.keys) - 1 and pb.keys[pb.anchor] == head.keys[-1]


def test_no_anchor_without_a_user_message_or_for_a_completions_prompt() -> None:
    assert anchor([{"role": "system", "content": SYSTEM}]) is None
    assert anchor("a completions prompt") is None
    assert anchor(["a", "batch"]) is None


# -- the order --------------------------------------------------------------------------------------------


def test_an_unplaced_conversation_goes_where_the_rendezvous_hash_says_on_every_replica() -> None:
    keys = [f"c{i:x}" for i in range(200)]
    names = ["a/m", "b/m", "c/m"]
    chosen = {k: first([view(n) for n in names], k) for k in keys}
    for k in keys:  # another replica: other rotation, candidates listed in another order, a fresh turn or not
        for rotation in range(3):
            assert first([view(n) for n in reversed(names)], k, rotation=rotation) == chosen[k]
            assert first([view(n) for n in names], k, fresh=True, rotation=rotation) == chosen[k]
    split = Counter(chosen.values())
    assert len(split) == 3 and min(split.values()) > 200 / 3 * 0.6, split  # and it spreads
    # a deployment gone: only the conversations that were on it move
    without_c = {k: first([view("a/m"), view("b/m")], k) for k in keys}
    assert all(without_c[k] == chosen[k] for k in keys if chosen[k] != "c/m")


def test_the_hash_yields_to_load_like_every_other_rule() -> None:
    k = next(f"c{i:x}" for i in range(100) if first([view("a/m"), view("b/m")], f"c{i:x}") == "a/m")
    # the default max_imbalance (2.0 per slot; capacity 2)
    assert first([view("a/m", in_flight=5), view("b/m")], k) == "b/m"  # 2.5 per slot above: hot, it yields
    assert first([view("a/m", in_flight=4), view("b/m")], k) == "a/m"  # 2.0 above: not hot yet
    assert first([view("a/m", in_flight=3), view("b/m")], k) == "a/m"  # 1.5 above: not under the default...
    assert first([view("a/m", in_flight=3), view("b/m")], k, max_imbalance=1.0) == "b/m"  # ...but at 1.0


def test_with_a_shared_record_a_new_conversation_spreads_by_load_and_a_running_one_still_hashes() -> None:
    k = next(f"c{i:x}" for i in range(100) if first([view("a/m"), view("b/m")], f"c{i:x}") == "a/m")
    assert {first([view("a/m"), view("b/m")], k, fresh=True, spread_new=True, rotation=r) for r in range(4)} == {
        "a/m",
        "b/m",
    }  # equal loads take turns
    assert first([view("a/m", in_flight=1), view("b/m")], k, fresh=True, spread_new=True) == "b/m"
    assert first([view("a/m", in_flight=1), view("b/m")], k, fresh=True) == "a/m"  # no shared record: the hash
    assert first([view("a/m", in_flight=1), view("b/m")], k, spread_new=True) == "a/m"  # the record lost it: the hash


def test_the_shared_record_wins_over_the_local_one_and_the_hash() -> None:
    k = next(f"c{i:x}" for i in range(100) if first([view("a/m"), view("b/m")], f"c{i:x}") == "a/m")
    assert first([view("a/m"), view("b/m", assigned=True)], k) == "b/m"
    assert first([view("a/m", session_at=NOW - 1), view("b/m", assigned=True)], k) == "b/m"
    assert first([view("a/m"), view("b/m", session_at=NOW - 1)], k, spread_new=True) == "b/m"  # the local record next
    assert first([view("a/m"), view("b/m", assigned=True, in_flight=5)], k) == "a/m"  # hot: it yields


def test_with_hash_placement_the_hash_wins_over_the_local_record_unless_home_is_hot() -> None:
    # this replica moved the conversation to b (a was hot here); the other replicas never saw the move
    k = next(f"c{i:x}" for i in range(100) if first([view("a/m"), view("b/m")], f"c{i:x}") == "a/m")
    moved = [view("a/m", session_at=NOW - 20), view("b/m", session_at=NOW - 1)]
    assert first(moved, k) == "a/m"  # home is no longer hot: home again, as every other replica would
    assert first([view("a/m", session_at=NOW - 20, in_flight=5), view("b/m", session_at=NOW - 1)], k) == "b/m"
    assert first(moved, None) == "b/m"  # no placement key: the local record still decides


# -- three replicas through HTTP --------------------------------------------------------------------------


async def replicas_run(
    n: int, sessions: int, turns: int, *, redis_url: str | None = None, header: bool = False, new: str = "auto"
) -> dict[int, list[str]]:
    """`sessions` conversations, interleaved, turn t of each sent to replica (s + t) % n: the engine of each turn."""
    up = engines()
    cfg = config("cache_aware")
    if redis_url is not None:
        cfg = cfg.model_copy(
            update={"limits": cfg.limits.model_copy(update={"store": "redis", "redis_url": SecretStr(redis_url)})}
        )
    m = cfg.models[0]
    m = m.model_copy(update={"affinity": m.affinity.model_copy(update={"new_conversations": new})})
    cfg = cfg.model_copy(update={"models": [m, *cfg.models[1:]]})
    served: dict[int, list[str]] = {s: [] for s in range(sessions)}
    async with AsyncExitStack() as stack:
        clients = [(await stack.enter_async_context(gateway_client(cfg, upstream=up)))[0] for _ in range(n)]
        for t in range(1, turns + 1):
            for s in range(sessions):
                headers = {"x-session-id": f"session-{s}"} if header else {}
                body = {"model": "agent", "messages": conversation(s, t)}
                r = await clients[(s + t) % n].post("/v1/chat/completions", json=body, headers=headers)
                assert r.status_code == 200, r.text
                served[s].append(r.headers["x-gateway-backend"])
    return served


async def test_three_replicas_keep_each_conversation_on_one_engine_without_a_shared_store() -> None:
    served = await replicas_run(3, sessions=6, turns=4, new="hash")  # what replicas without Redis set (README)
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    assert len({turns[0] for turns in served.values()}) == 2, served  # and the conversations use both engines


async def test_after_a_yield_every_replica_sends_the_next_turn_home_once_home_is_cool() -> None:
    """Without Redis: one replica sees the conversation's home engine hot and moves a turn to the other engine;
    once home is cool again, that replica and the two that never saw the move all send the next turn home."""
    from llm_gateway.types import LoadSnapshot

    up = engines()
    cfg = config("cache_aware")
    m = cfg.models[0]
    m = m.model_copy(update={"affinity": m.affinity.model_copy(update={"new_conversations": "hash"})})
    cfg = cfg.model_copy(update={"models": [m, *cfg.models[1:]]})  # what replicas without Redis set (README)
    async with AsyncExitStack() as stack:
        pairs = [await stack.enter_async_context(gateway_client(cfg, upstream=up)) for _ in range(3)]
        clients = [c for c, _ in pairs]

        async def turn(r: int, t: int) -> str:
            body = {"model": "agent", "messages": conversation(0, t)}
            resp = await clients[r].post("/v1/chat/completions", json=body)
            assert resp.status_code == 200, resp.text
            return str(resp.headers["x-gateway-backend"])

        home = await turn(0, 1)
        away = next(n for n in NAMES if n != home)
        backend = pairs[1][1].gw.runtime.table.backends[home]
        backend.load = LoadSnapshot(running=0.0, waiting=10_000.0, kv=0.0, at=time.monotonic())  # hot on replica 1
        assert await turn(1, 2) == away  # it yields
        backend.load = None  # home is cool again
        assert [await turn(r, 3 + r) for r in (1, 2, 0)] == [home] * 3


async def test_new_conversations_load_spreads_them_evenly_on_one_replica_and_hash_does_not() -> None:
    # 8 conversations sent one at a time: by load, equal loads take turns (4 and 4); by hash, this set splits 6-2
    by_load = await replicas_run(1, sessions=8, turns=2, new="load")
    assert sorted(Counter(t[0] for t in by_load.values()).values()) == [4, 4], by_load
    assert all(len(set(turns)) == 1 for turns in by_load.values()), by_load
    by_hash = await replicas_run(1, sessions=8, turns=2, new="hash")
    assert sorted(Counter(t[0] for t in by_hash.values()).values()) != [4, 4], by_hash


async def test_new_conversations_auto_is_load_on_a_replica_without_redis() -> None:
    # the default: one replica without Redis (docker-compose) spreads new conversations by load, as `load` does;
    # the hash (34.5-34.8% recomputed against load's 30.3-31.4%, README's 8 x 8) only where it is named
    assert AffinityConfig().new_conversations == "auto"
    auto = await replicas_run(1, sessions=8, turns=2)
    assert auto == await replicas_run(1, sessions=8, turns=2, new="load")
    assert auto != await replicas_run(1, sessions=8, turns=2, new="hash")
    assert sorted(Counter(t[0] for t in auto.values()).values()) == [4, 4], auto


async def test_three_replicas_keep_a_session_header_on_one_engine() -> None:
    served = await replicas_run(3, sessions=4, turns=3, header=True, new="hash")  # replicas without Redis (README)
    assert all(len(set(turns)) == 1 for turns in served.values()), served


def _require(exc: Exception) -> None:
    if os.environ.get("LLM_GATEWAY_REQUIRE_TOOLS") == "1":
        pytest.fail(str(exc))
    pytest.skip(str(exc))


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    try:
        server = RedisServer(tmp_path_factory.mktemp("redis"))
    except RedisNotInstalled as e:
        _require(e)
    with server:
        yield server


@pytest.fixture
async def placements(redis: RedisServer) -> AsyncIterator[RedisPlacements]:
    p = RedisPlacements(redis.url, timeout_ms=250)
    await p._redis.flushall()
    yield p
    await p.aclose()


async def test_redis_placements_round_trip_with_a_ttl_and_hashed_keys(placements: RedisPlacements) -> None:
    assert await placements.get("agent", "session-secret-1") is None
    await placements.put("agent", "session-secret-1", "engine-b/upstream-model", 60.0)
    assert await placements.get("agent", "session-secret-1") == "engine-b/upstream-model"
    assert await placements.get("other-model", "session-secret-1") is None  # per model
    keys = await placements._redis.keys("*")
    assert len(keys) == 1 and b"session-secret" not in keys[0] and keys[0].startswith(b"{llmgw}:place:")
    assert 0 < await placements._redis.pttl(keys[0]) <= 60_000


async def test_an_unreachable_redis_answers_nothing_at_once() -> None:
    p = RedisPlacements("redis://127.0.0.1:1/0", timeout_ms=100)
    try:
        t = asyncio.get_running_loop().time()
        assert await p.get("agent", "s") is None
        await p.put("agent", "s", "x", 10)  # skipped: marked down
        assert await p.get("agent", "s") is None
        assert asyncio.get_running_loop().time() - t < 1.0
    finally:
        await p.aclose()


async def test_replicas_follow_a_placement_another_replica_recorded(redis: RedisServer, placements) -> None:
    # where the hash alone puts each conversation (no shared store)
    hashed = await replicas_run(3, sessions=4, turns=1, new="hash")
    # another replica moved each conversation to the other engine (its engine was hot) and recorded it
    for s, turns in hashed.items():
        other = next(n for n in NAMES if n != turns[0])
        key = anchor(conversation(s, 1), b"")
        assert key is not None
        await placements.put("agent", key, f"{other}/upstream-model", 60.0)
    served = await replicas_run(3, sessions=4, turns=3, redis_url=redis.url)
    for s, turns in served.items():
        assert set(turns) == {next(n for n in NAMES if n != hashed[s][0])}, (s, served, hashed)


async def test_three_replicas_sharing_redis_keep_each_conversation_on_one_engine(
    redis: RedisServer, placements
) -> None:
    served = await replicas_run(3, sessions=6, turns=4, redis_url=redis.url)
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    split = Counter(turns[0] for turns in served.values())
    assert sorted(split.values()) == [3, 3], served  # new conversations spread by load: equal loads take turns


async def test_replicas_record_new_placements_in_redis(redis: RedisServer, placements) -> None:
    await replicas_run(3, sessions=5, turns=2, redis_url=redis.url)
    keys = await placements._redis.keys("{llmgw}:place:*")
    assert len(keys) == 5  # one per conversation, written once (the placement did not change)
