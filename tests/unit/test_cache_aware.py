"""Cache-aware routing: the prefix record (routing/prefix_cache.py) and the `cache_aware` order
(routing/selection.py), then both through HTTP with an agent-shaped workload.

The rules proved here, deterministically: the chained block keys name whole prefixes; the record holds a
prefix of each conversation and never more than its bound; at equal load the deployment holding the prefix
goes first; a hot replica (load per slot more than `max_imbalance` above the lowest) yields; a new
conversation spreads by load, or with `spread_new` to the fewest live conversations; a known session
stays; the score trades the matched share against load.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from urllib.parse import urlsplit

from llm_gateway.routing.prefix_cache import (
    PrefixRecord,
    block_keys,
    max_blocks,
    placed,
    prompt_blocks,
    render,
)
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.selection import CandidateView, order
from llm_gateway.settings import AffinityConfig
from tests.conftest import gateway_client, make_config
from tests.support.fake_upstream import FakeAnswer, FakeUpstream

NOW = 1000.0
STALE = 15.0
BLOCK = 64
SYSTEM = "You are a coding agent. Follow the repository's conventions and explain every change. " * 8
TOOLS = b'[{"type":"function","function":{"name":"read_file","parameters":{"type":"object"}}}]'


def conversation(session: int, turns: int) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"session {session} asks question {t}: " + "details " * 20})
        if t < turns - 1:
            msgs.append({"role": "assistant", "content": f"answer {t} for session {session} " + "words " * 30})
    return msgs


def view(
    key: str,
    *,
    in_flight: int = 0,
    capacity: int = 2,
    match: float = 0.0,
    session_at: float = 0.0,
    conversations: int = 0,
):
    # reports_load False: the load score is the gateway's own in-flight count per slot, exactly
    c = CandidateView(key, in_flight, capacity, False, None, 0)
    c.match, c.session_at, c.conversations = match, session_at, conversations
    return c


def cache_order(cands: list[CandidateView], *, fresh: bool = False, rotation: int = 0, **kw: float) -> list[str]:
    idx = order("cache_aware", cands, now=NOW, stale_s=STALE, rotation=rotation, fresh=fresh, **kw)  # type: ignore[arg-type]
    return [cands[i].key for i in idx]


# -- the blocks -----------------------------------------------------------------------------------------


def test_a_block_key_names_its_whole_prefix() -> None:
    a, ends = block_keys([b"x" * 64 + b"y" * 64 + b"z" * 64], BLOCK)
    b, _ = block_keys([b"x" * 64 + b"y" * 64 + b"w" * 64], BLOCK)
    c, _ = block_keys([b"q" * 64 + b"y" * 64 + b"z" * 64], BLOCK)
    assert len(a) == 3 and ends == [64, 128, 192]
    assert a[:2] == b[:2] and a[2] != b[2]  # same first two blocks, different third
    assert all(x != y for x, y in zip(a, c, strict=True))  # a different first block changes every key after it


def test_every_message_ends_a_block_so_a_short_question_is_a_block_of_its_own() -> None:
    keys, ends = block_keys([b"t" * 100, b"short", b"m" * 130], BLOCK)
    assert ends == [64, 100, 105, 169, 233, 235]
    again, _ = block_keys([b"t" * 100, b"short", b"m" * 130, b"next turn"], BLOCK)
    assert again[: len(keys)] == keys
    other, _ = block_keys([b"t" * 100, b"shorT"], BLOCK)
    assert other[:2] == keys[:2] and other[2] != keys[2]


def test_the_next_turn_starts_with_the_blocks_of_the_turn_before() -> None:
    t1 = prompt_blocks(conversation(1, 1), TOOLS, BLOCK)
    t2 = prompt_blocks(conversation(1, 2), TOOLS, BLOCK)
    other = prompt_blocks(conversation(2, 2), TOOLS, BLOCK)
    assert len(t1.keys) > 5 and t2.keys[: len(t1.keys)] == t1.keys
    assert t2.share(len(t1.keys)) == len(render(conversation(1, 1), TOOLS)) / t2.size
    shared = len(prompt_blocks([{"role": "system", "content": SYSTEM}], TOOLS, BLOCK).keys)  # system and tools
    assert other.keys[:shared] == t2.keys[:shared] and other.keys[shared] != t2.keys[shared]


def test_tools_are_part_of_the_prefix_and_go_first() -> None:
    msgs = conversation(1, 2)
    with_tools = prompt_blocks(msgs, TOOLS, BLOCK)
    other_tools = prompt_blocks(msgs, TOOLS.replace(b"read_file", b"edit_file"), BLOCK)
    assert with_tools.keys[0] != other_tools.keys[0]  # another tool set: nothing matches, as on the engine


def test_tool_calls_and_text_parts_are_rendered_not_skipped() -> None:
    base: list[dict[str, Any]] = [{"role": "user", "content": [{"type": "text", "text": "hi " * 40}]}]
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": '{"path": "/a"}'}}]}
    call2 = {"role": "assistant", "tool_calls": [{"function": {"name": "ls", "arguments": '{"path": "/b"}'}}]}
    assert render([*base, call], b"") != render([*base, call2], b"")
    assert b"hi hi" in render(base, b"")


# -- the record -------------------------------------------------------------------------------------------


def test_the_record_matches_the_longest_prefix_it_was_sent() -> None:
    r = PrefixRecord()
    t1 = prompt_blocks(conversation(1, 1), TOOLS, BLOCK).keys
    t3 = prompt_blocks(conversation(1, 3), TOOLS, BLOCK).keys
    assert r.matched(t3, NOW, 60) == 0
    r.record(t1, NOW, 10_000)
    assert r.matched(t3, NOW, 60) == len(t1)
    assert r.matched(t1, NOW, 60) == len(t1)
    assert r.matched(t1, NOW + 61, 60) == 0  # aged out


def test_eviction_bounds_memory_and_takes_the_tails_of_old_conversations_first() -> None:
    r = PrefixRecord()
    bound = 40
    convs = [prompt_blocks(conversation(s, 3), TOOLS, BLOCK).keys for s in range(10)]
    for keys in convs:
        r.record(keys, NOW, bound)
        assert len(r.blocks) <= bound
    assert len(r.blocks) == bound
    last = convs[-1]
    assert r.matched(last, NOW, 60) == min(len(last), bound)  # the newest is held, up to the bound
    first = convs[0]
    held = r.matched(first, NOW, 60)
    shared = len(prompt_blocks([{"role": "system", "content": SYSTEM}], TOOLS, BLOCK).keys)
    assert held == shared  # of the oldest, only the prefix every session shares is left
    for k in first[held:]:
        assert k not in r.blocks


def test_max_blocks_turns_the_engines_cache_in_tokens_into_blocks() -> None:
    assert max_blocks(1_000_000, 1024) == 1_000_000 * 4 // 1024
    assert max_blocks(1, 1024) == 1


def test_sessions_are_remembered_with_their_time_and_age_out() -> None:
    r = PrefixRecord()
    r.note_session("s1", NOW)
    assert r.session_at("s1", NOW + 5, 60) == NOW
    assert r.session_at("s1", NOW + 61, 60) == 0.0
    assert r.session_at("s2", NOW, 60) == 0.0


def test_live_conversations_are_those_sent_within_the_ttl_and_a_move_leaves_the_old_count() -> None:
    a, b = PrefixRecord(), PrefixRecord()
    info = RequestInfo("m", None, False, False, frozenset(), 0, None, "", conversation=conversation(0, 1))
    cfg = AffinityConfig(block_bytes=BLOCK, ttl_s=60)
    placed(a, [b], info, "s1", cfg, NOW)
    placed(a, [b], info, "s2", cfg, NOW + 30)
    assert (a.live(NOW + 31, 60), b.live(NOW + 31, 60)) == (2, 0)
    assert a.live(NOW + 61, 60) == 1  # s1 was last sent 61 s ago: gone, s2 stays
    placed(b, [a], info, "s2", cfg, NOW + 62)  # s2 moved to b: a counts it no more
    assert (a.live(NOW + 62, 60), b.live(NOW + 62, 60)) == (0, 1)
    assert b.session_at("s2", NOW + 62, 60) == NOW + 62


# -- the order ------------------------------------------------------------------------------------------


def test_at_equal_load_the_deployment_holding_the_prefix_goes_first() -> None:
    for rotation in range(4):  # not the rotation's doing
        assert cache_order([view("a", match=0.1), view("b", match=0.8)], rotation=rotation)[0] == "b"
        assert cache_order([view("a", match=0.8), view("b", match=0.1)], rotation=rotation)[0] == "a"


def test_the_score_trades_the_matched_share_against_load() -> None:
    # b holds 0.3 more of the prompt but carries 0.5 more load per slot: 0.3 < 0.5 * 0.5 is false -> b
    cands = [view("a", match=0.5), view("b", match=0.8, in_flight=1)]
    assert cache_order(cands, load_weight=0.5)[0] == "b"  # 0.8 - 0.25 > 0.5
    assert cache_order(cands, load_weight=1.0)[0] == "a"  # 0.8 - 0.5 < 0.5
    assert cache_order(cands, load_weight=0.0)[0] == "b"


def test_a_hot_replica_yields_to_an_idle_one_even_holding_the_whole_prompt() -> None:
    # capacity 2: 3 in flight is 1.5 per slot above the idle one (max_imbalance 1.0)
    hot = [view("a", match=1.0, in_flight=3), view("b", match=0.0)]
    assert cache_order(hot, max_imbalance=1.0) == ["b", "a"]
    # at 1.0 above (2 in flight) it is not hot yet, and the match wins over 0.5 * 1.0 of load
    warm = [view("a", match=1.0, in_flight=2), view("b", match=0.0)]
    assert cache_order(warm, max_imbalance=1.0) == ["a", "b"]


def test_a_uniformly_busy_pool_keeps_its_affinity() -> None:
    # everyone is overloaded (4 per slot): imbalance, not absolute load, decides a yield
    busy = [view("a", match=0.9, in_flight=8), view("b", match=0.0, in_flight=8)]
    assert cache_order(busy)[0] == "a"


def test_a_new_conversation_spreads_by_load_and_takes_turns() -> None:
    shared = [view("a", match=0.7), view("b", match=0.0)]  # a holds the shared system prompt
    firsts = {cache_order(shared, fresh=True, rotation=r)[0] for r in range(4)}
    assert firsts == {"a", "b"}  # ties take turns: a fresh conversation does not pile onto the shared prefix
    busy_a = [view("a", match=0.7, in_flight=1), view("b", match=0.0)]
    assert cache_order(busy_a, fresh=True) == ["b", "a"]  # and goes to the least loaded
    assert cache_order(busy_a, fresh=False)[0] == "a"  # the same request in a running conversation stays


def test_spread_places_a_new_conversation_where_the_fewest_live_conversations_are() -> None:
    # a is less loaded right now but already holds more conversations: each is an agent's future load
    cands = [view("a", conversations=9), view("b", conversations=7, in_flight=1)]
    assert cache_order(cands, fresh=True, spread_new=True) == ["b", "a"]
    assert cache_order(cands, fresh=True) == ["a", "b"]  # without spread: least load
    assert cache_order(cands, fresh=False, spread_new=True)[0] == "a"  # a running conversation: not this rule
    for rotation in range(4):  # equal counts go by load, and the rotation does not override that
        even = [view("a", conversations=3, in_flight=1), view("b", conversations=3)]
        assert cache_order(even, fresh=True, spread_new=True, rotation=rotation)[0] == "b"
    # equal counts and loads take turns
    firsts = {cache_order([view("a"), view("b")], fresh=True, spread_new=True, rotation=r)[0] for r in range(4)}
    assert firsts == {"a", "b"}
    # a hot replica yields first, however few conversations it holds
    hot = [view("a", conversations=0, in_flight=5), view("b", conversations=8)]
    assert cache_order(hot, fresh=True, spread_new=True) == ["b", "a"]


def test_a_conversation_nobody_holds_goes_by_least_load() -> None:
    assert cache_order([view("a", in_flight=1), view("b")]) == ["b", "a"]


def test_a_known_session_stays_where_it_was_last_served_unless_that_replica_is_hot() -> None:
    cands = [view("a", match=0.9, session_at=NOW - 50), view("b", match=0.2, session_at=NOW - 10)]
    assert cache_order(cands)[0] == "b"  # the most recent, whatever the matches say
    assert cache_order(cands, fresh=True)[0] == "b"
    hot_b = [view("a", match=0.9, session_at=NOW - 50), view("b", match=0.2, session_at=NOW - 10, in_flight=5)]
    assert cache_order(hot_b)[0] == "a"


# -- through HTTP -----------------------------------------------------------------------------------------

NAMES = ["engine-a", "engine-b"]


def config(strategy: str, server: str = "{access_log: false}") -> Any:
    backends = "".join(f'  - {{name: {n}, engine: vllm, url: "http://{n}.test"}}\n' for n in NAMES)
    deps = "".join(
        f"      - {{backend: {n}, model: upstream-model, format: safetensors, capabilities: [chat, tools]}}\n"
        for n in NAMES
    )
    return make_config(
        f"""
server: {server}
auth:
  mode: keys
  keys:
    - {{name: alice, sha256: "${{ALICE_SHA}}"}}
backends:
{backends}models:
  - name: agent
    strategy: {strategy}
    affinity: {{block_bytes: 256}}
    deployments:
{deps}"""
    )


def engines() -> FakeUpstream:
    answer = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "upstream-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }
    return FakeUpstream({("POST", "/v1/chat/completions"): FakeAnswer.json(answer)})


async def agent_workload(strategy: str, sessions: int = 3, turns: int = 4) -> dict[int, list[str]]:
    """`sessions` agents (not a multiple of the engines: rotation cannot mimic affinity), interleaved turn
    by turn, each resending its growing conversation with the shared system prompt and tools; no session
    header: which engine served each turn, per session."""
    up = engines()
    tools = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]
    served: dict[int, list[str]] = {s: [] for s in range(sessions)}
    async with gateway_client(config(strategy), upstream=up) as (client, _):
        for t in range(1, turns + 1):
            for s in range(sessions):
                body = {"model": "agent", "messages": conversation(s, t), "tools": tools}
                r = await client.post("/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                served[s].append(r.headers["x-gateway-backend"])
    called = [str(urlsplit(c.url).hostname).removesuffix(".test") for c in up.calls]
    assert called == [served[s][t] for t in range(turns) for s in range(sessions)]
    return served


async def test_agent_sessions_stay_on_the_engine_that_holds_their_prefix_and_spread_over_both() -> None:
    served = await agent_workload("cache_aware")
    assert all(len(set(turns)) == 1 for turns in served.values()), served
    per_engine = Counter(turns[0] for turns in served.values())
    assert sorted(per_engine.values()) == [1, 2], served  # new conversations spread


async def test_least_load_moves_the_same_sessions_around() -> None:
    """The control: the stickiness above is the strategy's, not the workload's."""
    served = await agent_workload("least_load")
    assert any(len(set(turns)) > 1 for turns in served.values()), served


async def test_cache_aware_reports_the_matched_share_of_each_routed_prompt() -> None:
    up = engines()
    async with gateway_client(config("cache_aware"), upstream=up) as (client, _):
        for t in (1, 2, 3):
            r = await client.post("/v1/chat/completions", json={"model": "agent", "messages": conversation(0, t)})
            assert r.status_code == 200
        text = (await client.get("/metrics")).text
    count = [ln for ln in text.splitlines() if ln.startswith('gateway_prefix_match_ratio_count{model="agent"}')]
    total = [ln for ln in text.splitlines() if ln.startswith('gateway_prefix_match_ratio_sum{model="agent"}')]
    assert count and float(count[0].split()[-1]) == 3
    # turn 1 matched nothing; turns 2 and 3 matched most of their prompt (all but the new turn)
    assert 1.0 < float(total[0].split()[-1]) < 2.0


def test_a_full_kv_cache_is_not_load_to_cache_aware() -> None:
    """llama-server's KV signal is its busy slots a probe ago: stale, it made the replica holding the
    conversation look 1.5 slots busier than the other and the session yield (bench/agent_cache.py)."""
    from llm_gateway.types import LoadSnapshot

    full = LoadSnapshot(running=2.0, waiting=0.0, kv=1.0, at=NOW)  # both slots busy when probed
    a = CandidateView("a", 0, 2, True, full, 2)  # ...and done since: nothing in flight now
    b = CandidateView("b", 0, 2, True, LoadSnapshot(running=0.0, waiting=0.0, kv=0.0, at=NOW), 0)
    a.match, b.match = 0.9, 0.7
    assert cache_order([a, b])[0] == "a"
    assert order("least_load", [a, b], now=NOW, stale_s=STALE)[0] == 1  # least_load still counts it


async def test_the_engines_cache_counters_are_re_exported_per_backend() -> None:
    from llm_gateway.types import LoadSnapshot

    async with gateway_client(config("cache_aware"), upstream=engines()) as (client, app):
        backends = app.gw.runtime.table.backends
        backends["engine-a"].load = LoadSnapshot(1.0, 0.0, 0.2, 0.0, computed=1234.0)
        backends["engine-b"].load = LoadSnapshot(1.0, 0.0, 0.2, 0.0, cache_queries=900.0, cache_hits=300.0)
        text = (await client.get("/metrics")).text
    assert 'gateway_engine_prompt_computed_tokens_total{backend="engine-a"} 1234.0' in text
    assert 'gateway_engine_prefix_cache_queried_tokens_total{backend="engine-b"} 900.0' in text
    assert 'gateway_engine_prefix_cache_hit_tokens_total{backend="engine-b"} 300.0' in text
    assert 'gateway_engine_prompt_computed_tokens_total{backend="engine-b"}' not in text  # not said: no series


async def test_previous_response_id_chains_stay_on_the_engine_that_holds_them(tmp_path: Any) -> None:
    """The OpenAI Agents SDK's chaining sends only the new input: the gateway puts the stored conversation
    first, so routing sees the whole history and the prefix record matches it like a resent one."""
    cfg = config("cache_aware", server=f'{{access_log: false, data_dir: "{tmp_path}"}}')
    served: dict[int, list[str]] = {c: [] for c in range(3)}
    last: dict[int, str | None] = dict.fromkeys(range(3))
    async with gateway_client(cfg, upstream=engines()) as (client, app):
        try:
            for turn in range(4):
                for c in range(3):
                    body: dict[str, Any] = {"model": "agent", "input": f"chain {c} asks {turn}: " + "why " * 60}
                    if last[c] is not None:
                        body["previous_response_id"] = last[c]
                    r = await client.post("/v1/responses", json=body)
                    assert r.status_code == 200, r.text
                    last[c] = r.json()["id"]
                    served[c].append(r.headers["x-gateway-backend"])
        finally:
            await app.context.responses.aclose()
    assert all(len(set(s)) == 1 for s in served.values()), served
    assert len({s[0] for s in served.values()}) == 2, served  # and the chains spread


async def test_the_responses_routes_hand_read_request_what_the_translation_gathered(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """The input's chat messages are sized from what the translation gathered as it built them (issue 36), on
    both routes; a chained request's stored conversation is not gathered, so its messages are walked."""
    from llm_gateway.routing import request_info
    from llm_gateway.service import pipeline

    handed: list[bool] = []

    def read(endpoint: str, body: dict[str, Any], gathered: Any = None) -> Any:
        handed.append(gathered is not None)
        return request_info.read_request(endpoint, body, gathered)

    monkeypatch.setattr(pipeline, "read_request", read)
    cfg = config("cache_aware", server=f'{{access_log: false, data_dir: "{tmp_path}"}}')
    up = engines()
    up.route("POST", "/tokenize", FakeAnswer.json({"count": 17, "max_model_len": 4096}))
    async with gateway_client(cfg, upstream=up) as (client, app):
        try:
            body: dict[str, Any] = {"model": "agent", "input": "first", "instructions": "Be brief."}
            first = await client.post("/v1/responses", json=body)
            assert first.status_code == 200, first.text
            counted = await client.post("/v1/responses/input_tokens", json=body)
            assert counted.status_code == 200, counted.text
            chained = {**body, "input": "second", "previous_response_id": first.json()["id"]}
            for path in ("/v1/responses", "/v1/responses/input_tokens"):
                r = await client.post(path, json=chained)
                assert r.status_code == 200, r.text
        finally:
            await app.context.responses.aclose()
    assert handed == [True, True, False, False]
