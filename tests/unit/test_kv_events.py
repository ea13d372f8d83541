"""Engines' KV-cache events (routing/kv_events.py, engine_kv.py): the payloads vLLM and SGLang publish move an
engine's counters the way their sources say; the cache_aware record empties when the engine clears or restarts
and ages as it evicts; a real ZeroMQ publisher feeds a running gateway, whose /readyz and /metrics say the record
follows the events."""

from __future__ import annotations

import asyncio
import socket
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from llm_gateway.adapters.vllm import connectable, endpoints_from_sources
from llm_gateway.app import create_app
from llm_gateway.routing.engine_kv import EngineKv
from llm_gateway.routing.prefix_cache import BYTES_PER_TOKEN, PrefixRecord
from llm_gateway.settings.loader import ConfigError, parse_config
from tests.unit.test_usage_ledger import running

zmq = pytest.importorskip("zmq", reason="the kv-events extra (dev extra)")
msgspec = pytest.importorskip("msgspec", reason="the kv-events extra (dev extra)")


def stored(hashes: list[int], block_size: int = 16) -> dict[str, object]:
    """vLLM's BlockStored as its map encoding carries it (vllm/distributed/kv_events.py @0181ea31)."""
    return {
        "type": "BlockStored",
        "block_hashes": hashes,
        "parent_block_hash": None,
        "token_ids": list(range(len(hashes) * block_size)),
        "block_size": block_size,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
    }


def removed(hashes: list[int]) -> dict[str, object]:
    return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}


CLEARED = {"type": "AllBlocksCleared"}


def test_vllm_batches_move_the_counters() -> None:
    kv = EngineKv()
    assert kv.source == "approximate"
    got = kv.apply(0, [1.0, [stored([1, 2, 3]), stored([4])], 0])
    assert got == {"BlockStored": 2}
    assert (kv.block_size, kv.cached_tokens, kv.removed_tokens, kv.source) == (16, 64, 0, "kv_events")
    assert kv.apply(1, [2.0, [removed([1, 2])]]) == {"BlockRemoved": 1}
    assert (kv.cached_tokens, kv.removed_tokens, kv.clears) == (32, 32, 0)
    assert kv.apply(2, {"ts": 3.0, "events": [CLEARED]}) == {"AllBlocksCleared": 1}
    assert (kv.cached_tokens, kv.clears) == (0, 1)


def test_sglang_array_encoding_is_read_by_position() -> None:
    """SGLang's structs are array_like with the tag first (python/sglang/srt/disaggregation/kv_events.py
    @006d053f): [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id]."""
    kv = EngineKv()
    kv.apply(0, [1.0, [["BlockStored", [7, 8], None, list(range(64)), 32, None]]])
    assert (kv.block_size, kv.cached_tokens) == (32, 64)
    kv.apply(1, [2.0, [["BlockRemoved", [7]], ["AllBlocksCleared"]]])
    assert (kv.removed_tokens, kv.clears, kv.cached_tokens) == (32, 1, 0)


def test_a_sequence_that_starts_again_is_a_restart_and_unreadable_batches_change_nothing() -> None:
    kv = EngineKv()
    kv.apply(5, [1.0, [stored([1])]])
    assert kv.apply(0, [1.0, [stored([2])]]) == {"restart": 1, "BlockStored": 1}
    assert (kv.clears, kv.cached_tokens) == (1, 16)
    # data-parallel ranks number their batches apart: rank 1's 0 after rank 0's 5 is no restart
    assert kv.apply(0, [1.0, [stored([3])], 1]) == {"BlockStored": 1}
    assert kv.clears == 1
    assert kv.apply(6, "junk") == {"unreadable": 1}
    assert kv.apply(7, [1.0, [{"type": "Nope"}]]) == {"unreadable": 1}
    assert kv.cached_tokens == 32


def record_with(n: int) -> PrefixRecord:
    rec = PrefixRecord()
    rec.record(list(range(n)), 1.0, 10_000)  # touched last-first: block 0 is the most recent
    return rec


def test_the_record_ages_as_the_engine_evicts_oldest_first() -> None:
    rec = record_with(10)
    kv = rec.engine = EngineKv()
    block_bytes = 64  # 16 tokens of BYTES_PER_TOKEN bytes
    per_block = block_bytes // BYTES_PER_TOKEN
    rec.settle(block_bytes)
    assert len(rec.blocks) == 10
    kv.removed_tokens = 3 * per_block + 5  # three blocks' worth and a rest that waits
    rec.settle(block_bytes)
    assert list(rec.blocks) == [6, 5, 4, 3, 2, 1, 0]  # the tails of what was sent longest ago went first
    kv.removed_tokens += per_block - 5  # the rest completes a fourth block
    rec.settle(block_bytes)
    assert list(rec.blocks) == [5, 4, 3, 2, 1, 0]
    assert rec.matched([0, 1, 2, 3, 4, 5], 2.0, 60.0) == 6


def test_a_clear_empties_the_record_once() -> None:
    rec = record_with(4)
    kv = rec.engine = EngineKv()
    kv.clears = 1
    rec.settle(64)
    assert not rec.blocks
    rec.record([9, 8], 2.0, 100)
    rec.settle(64)  # nothing new since: the blocks sent after the clear stay
    assert list(rec.blocks) == [8, 9]
    kv.clears, kv.removed_tokens = 2, 1000  # what was evicted before the clear is not taken again after it
    rec.settle(64)
    rec.record([7], 3.0, 100)
    rec.settle(64)
    assert list(rec.blocks) == [7]


def test_while_events_flow_what_is_held_is_theirs_not_a_guess_by_age() -> None:
    """ttl_s ages blocks out only where nothing says what the engine holds: with its events flowing, a block sent
    long ago is still held until the engine evicts it (then it goes, however recent)."""
    rec = record_with(4)  # sent at t=1.0
    later = 1.0 + 7200.0  # two hours on, past a one-hour ttl_s
    assert rec.matched([0, 1, 2, 3], later, 3600.0) == 0  # no events: aged out
    kv = rec.engine = EngineKv()
    assert rec.matched([0, 1, 2, 3], later, 3600.0) == 0  # a feed, but no batch yet: still the guess
    kv.batches = 1
    assert rec.matched([0, 1, 2, 3], later, 3600.0) == 4
    kv.removed_tokens = 2 * 64 // BYTES_PER_TOKEN  # two blocks of 64 bytes evicted
    rec.settle(64)
    assert rec.matched([0, 1, 2, 3], 2.0, 3600.0) == 2


def test_without_events_the_record_is_untouched() -> None:
    rec = record_with(3)
    rec.settle(64)
    assert len(rec.blocks) == 3


def test_vllm_kv_event_sources_become_connect_addresses() -> None:
    body = (
        b'{"0": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", "topic": ""},'
        b' "1": {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://10.0.0.9:5558"},'
        b' "2": {"enable_kv_cache_events": false, "publisher": "zmq", "endpoint": "tcp://*:5559"},'
        b' "3": {"publisher": "null", "endpoint": "tcp://*:5560"}}'
    )
    assert endpoints_from_sources(body, "http://vllm-a:8000") == ("tcp://vllm-a:5557", "tcp://10.0.0.9:5558")
    assert endpoints_from_sources(b"{}", "http://x:1") == ()
    assert endpoints_from_sources(b"not json", "http://x:1") == ()
    assert connectable("tcp://0.0.0.0:5557", "::1") == "tcp://[::1]:5557"


@pytest.mark.parametrize("bad", ["http://h:1", "tcp://h", "tcp://*:5557", "tcp://0.0.0.0:1", "tcp://h:1/x", "h:1"])
def test_a_bad_kv_events_setting_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="kv_events"):
        parse_config(config(bad), "t.yaml", {})


def config(kv_events: str) -> str:
    return textwrap.dedent(f"""
        server: {{access_log: false}}
        auth: {{mode: none}}
        backends:
          - {{name: v, engine: vllm, url: 'http://127.0.0.1:9', kv_events: '{kv_events}'}}
        models:
          - name: m
            strategy: cache_aware
            deployments: [{{backend: v, model: m, format: safetensors}}]
        """)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_real_publisher_feeds_the_running_gateway(tmp_path: Path) -> None:
    port = free_port()
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    pub.bind(f"tcp://127.0.0.1:{port}")
    encode = msgspec.msgpack.Encoder().encode
    app = create_app(parse_config(config(f"tcp://127.0.0.1:{port}"), "t.yaml", {}), probes=False)
    try:
        async with running(app), httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as c:
            dep = app.gw.runtime.table.models[0].deployments[0]
            dep.prefixes.record([1, 2, 3], time.monotonic(), 100)
            ready = (await c.get("/readyz")).json()["backends"]["v"]
            assert ready["prefix_cache"]["source"] == "approximate"
            seq = 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # a SUB joins a moment after connecting: send until heard
                pub.send_multipart([b"", seq.to_bytes(8, "big"), encode([1.0, [stored([1, 2])], 0])])
                seq += 1
                await asyncio.sleep(0.05)
                found = (await c.get("/readyz")).json()["backends"]["v"]["prefix_cache"]
                if found["source"] == "kv_events":
                    break
            assert found["source"] == "kv_events", found
            assert found["endpoints"] == [f"tcp://127.0.0.1:{port}"] and found["block_size"] == 16
            pub.send_multipart([b"", seq.to_bytes(8, "big"), encode([1.0, [CLEARED], 0])])
            deadline = time.monotonic() + 10
            while dep.backend.kv is not None and dep.backend.kv.clears == 0 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert dep.prefixes.engine is dep.backend.kv
            dep.prefixes.settle(1024)  # what the next cache_aware routing does first
            assert not dep.prefixes.blocks
            text = (await c.get("/metrics")).text
            assert 'gateway_kv_events_total{backend="v",event="AllBlocksCleared"} 1.0' in text
            assert 'gateway_prefix_cache_source{backend="v",gateway_prefix_cache_source="kv_events"} 1.0' in text
    finally:
        pub.close(0)
        ctx.term()
        await app.gw.aclose()
