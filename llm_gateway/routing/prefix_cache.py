"""What each deployment's engine probably holds in its prefix cache, from what the gateway sent it.

The `cache_aware` strategy (selection.py) needs, per candidate, the share of this request's prompt that the
engine may still hold in its KV/prefix cache (vLLM and SGLang prefix caching, llama-server's slot cache and
`--cache-ram`), and whether it served this conversation's session last. Nothing here asks the engine: it is
an approximate record of what the gateway itself sent, the way SMG's cache-aware policy keeps an approximate
radix tree per worker (lightseekorg/smg `model_gateway/src/policies/cache_aware.rs` @1cb05933) and production-stack's
`loadaware` router keeps hashed prefixes per endpoint (vllm-project/production-stack#1035). Where the engine
publishes its KV-cache events (vLLM and SGLang `--kv-events-config`, a backend's `kv_events`), what the record
holds follows them instead of the guess by age (routing/kv_events.py): emptied when the engine clears or restarts,
its oldest blocks taken off as the engine evicts, and no block forgotten for its age (`ttl_s`) while the events
flow; the match itself stays this record's, since the events name blocks of token ids and the gateway does not
tokenize. llama-server's slots: slots.py.

The prompt: the request's conversation in the order a chat template renders it (tools first, then each
message's role, text, and tool calls), from the strings already in hand (the parsed body's messages and the
tools' JSON that request_info.py measured anyway): no JSON is encoded again. It is cut into blocks: one ends
every `block_bytes` within a message and one at the end of every message, so a short first question still
ends a block of its own and the next turn (which resends it) shares every block up to there. Block i's key
is the CRC-32 of the whole prompt up to the end of block i (`zlib.crc32` carries its running value from one
block to the next), with i in the high bits, so a key names its whole prefix and a match of block i implies
blocks 0..i.
CRC-32 collides once in ~4e9 per compared key at one index: a wrong match routes one request less well,
nothing worse.

The record, per deployment: an LRU of block keys (value: when last sent), bounded at `max_blocks` (the
engine's cache in tokens over the tokens of a block, BYTES_PER_TOKEN bytes each), and aged out after
`ttl_s` (an engine restart, a cache another client filled). A request touches its blocks last-first, so its
first blocks are the most recent: eviction takes the tails of old conversations first, as vLLM's free-block
queue does, and what is left of a conversation is always a prefix of it, so the match is a binary search.
Sessions (an agent's session id, routing/session_key.py): per deployment, an LRU of the sessions last sent
there and when.

Cost on the request path, only for routes with `cache_aware`: one join and UTF-8 encode of the conversation,
one C-level CRC pass, one Python step per block (a 200 KB prompt: ~200 blocks of 1 KB), a binary search per
candidate, and the touch of the chosen deployment's blocks. bench/prefix_cost.py measures it.
"""

from __future__ import annotations

import zlib
from bisect import bisect_left
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from llm_gateway.routing.engine_kv import EngineKv
from llm_gateway.routing.request_info import RequestInfo
from llm_gateway.routing.selection import CandidateView
from llm_gateway.settings import AffinityConfig

BYTES_PER_TOKEN = 4  # what a token of prose or code averages in bytes: turns a cache size in tokens into blocks
SEP = "\x1e"  # between rendered parts, so that ("ab", "c") and ("a", "bc") differ
MAX_SESSIONS = 8192  # sessions remembered per deployment


@dataclass(slots=True)
class PromptBlocks:
    """One request's chained block keys, where each block ends (bytes from the start), and the prompt's size."""

    keys: list[int]
    ends: list[int]
    size: int
    anchor: int = -1  # the index of the block that ends the first user message (-1: none)

    def share(self, matched: int) -> float:
        """The share of the prompt that its first `matched` blocks cover."""
        return self.ends[matched - 1] / self.size if matched else 0.0


def segments(conversation: Any, tools_json: bytes) -> list[bytes]:
    """The conversation as byte segments in a chat template's order: the tools' JSON, then one segment per
    message (its role, text parts, other string fields such as name, tool_call_id or reasoning, and its tool
    calls' names and arguments); a completions prompt (a string, or a list whose first item is one) is one."""
    out = [tools_json] if tools_json else []
    if isinstance(conversation, str):
        out.append(conversation.encode("utf-8", "surrogatepass"))
        return out
    if not isinstance(conversation, list):
        return out
    if conversation and isinstance(conversation[0], str):
        out.append(conversation[0].encode("utf-8", "surrogatepass"))
        return out
    for m in conversation:
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if len(m) == 2 and isinstance(content, str):  # the common message: one encode, no list
            out.append(f"{m.get('role')}{SEP}{content}{SEP}".encode("utf-8", "surrogatepass"))
            continue
        parts = [str(m.get("role"))]
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for p in content:
                if isinstance(p, dict):
                    t = p.get("text")
                    if isinstance(t, str):
                        parts.append(t)
                    elif isinstance(u := p.get("image_url"), dict) and isinstance(u.get("url"), str):
                        parts.append(u["url"][:256])  # an image is known by its URL's start
        if len(m) > (2 if "content" in m else 1):  # tool calls, name, tool_call_id, reasoning...
            for k, v in m.items():
                if k == "tool_calls" and isinstance(v, list):
                    for call in v:
                        fn = call.get("function") if isinstance(call, dict) else None
                        if isinstance(fn, dict):
                            parts.append(str(fn.get("name")))
                            args = fn.get("arguments")
                            if isinstance(args, str):
                                parts.append(args)
                elif k not in ("role", "content") and isinstance(v, str):
                    parts.append(v)
        parts.append("")  # a separator after the last part: a message's end is part of its bytes
        out.append(SEP.join(parts).encode("utf-8", "surrogatepass"))
    return out


def render(conversation: Any, tools_json: bytes) -> bytes:
    """The segments joined: the prompt as the blocks hash it (for tests and the benchmark)."""
    return b"".join(segments(conversation, tools_json))


def block_keys(segs: list[bytes], block: int) -> tuple[list[int], list[int]]:
    """(keys, ends): a block ends every `block` bytes within a segment and at each segment's end, so the end of
    every message is a block's end and the next turn, which resends it, has the same blocks up to there.
    Key i is the CRC-32 of the whole prompt up to block i's end, with i in the high bits."""
    crc32 = zlib.crc32
    crc = pos = 0
    keys: list[int] = []
    ends: list[int] = []
    for seg in segs:
        n = len(seg)
        if not n:
            continue
        view = memoryview(seg)
        off = 0
        while n - off > block:
            crc = crc32(view[off : off + block], crc)
            off += block
            keys.append(crc | (len(keys) << 32))
            ends.append(pos + off)
        crc = crc32(view[off:], crc)
        pos += n
        keys.append(crc | (len(keys) << 32))
        ends.append(pos)
    return keys, ends


def prompt_blocks(conversation: Any, tools_json: bytes, block: int) -> PromptBlocks:
    segs = segments(conversation, tools_json)
    keys, ends = block_keys(segs, block)
    pb = PromptBlocks(keys, ends, ends[-1] if ends else 0)
    first = _first_user_segment(conversation, 1 if tools_json else 0)
    if first is not None and first < len(segs):
        end = sum(len(s) for s in segs[: first + 1])  # every message's end is a block's end: ends holds it
        i = bisect_left(ends, end)
        pb.anchor = i if i < len(ends) and ends[i] == end else -1
    return pb


def _first_user_segment(conversation: Any, before: int) -> int | None:
    """The segment (`segments`) of the conversation's first user message, None where it has none."""
    if not isinstance(conversation, list) or (conversation and isinstance(conversation[0], str)):
        return None
    i = before
    for m in conversation:
        if isinstance(m, dict):
            if m.get("role") == "user":
                return i
            i += 1
    return None


def anchor_key(info: RequestInfo, block_bytes: int) -> str | None:
    """A conversation's identity where it sends no session key: its chained block key at the end of its first
    user message (tools, system prompt and the first question: what every later turn resends unchanged, and what
    two conversations sharing only a system prompt do not share). The same on every gateway replica."""
    pb = blocks_of(info, block_bytes)
    return None if pb.anchor < 0 else f"c{pb.keys[pb.anchor]:x}"


_EVER = float("-inf")  # `matched`'s oldest time where the engine's events say what it holds


class PrefixRecord:
    """One deployment's approximate prefix cache: block keys and sessions, LRU, bounded, aged; where its engine
    publishes KV-cache events (`engine`, routing/kv_events.py), emptied when the engine clears and aged as it
    evicts (`settle`)."""

    __slots__ = ("blocks", "engine", "seen_clears", "seen_removed", "sessions")

    def __init__(self) -> None:
        self.blocks: OrderedDict[int, float] = OrderedDict()
        self.sessions: OrderedDict[str, float] = OrderedDict()
        self.engine: EngineKv | None = None
        self.seen_clears = 0  # the engine's clears this record has applied
        self.seen_removed = 0  # the engine's evicted tokens this record has aged out

    def settle(self, block_bytes: int) -> None:
        """Apply what the engine's events said since the last call: a clear (or restart) empties the record;
        evicted tokens take as many bytes' blocks off the least recent end (BYTES_PER_TOKEN a token)."""
        engine = self.engine
        if engine is None:
            return
        if engine.clears != self.seen_clears:
            self.seen_clears = engine.clears
            self.seen_removed = engine.removed_tokens
            self.blocks.clear()
            return
        evicted = (engine.removed_tokens - self.seen_removed) * BYTES_PER_TOKEN // block_bytes
        if evicted <= 0:
            return
        self.seen_removed += evicted * block_bytes // BYTES_PER_TOKEN  # the rest waits for the next eviction
        blocks = self.blocks
        for _ in range(min(evicted, len(blocks))):
            blocks.popitem(last=False)

    def matched(self, keys: list[int], now: float, ttl_s: float) -> int:
        """How many leading keys this deployment holds, sent within `ttl_s` (what is held is a prefix). Where the
        engine's KV events are flowing, what it holds is what they say (`settle` took off what it evicted or
        cleared), not a guess by age: a block is held however long ago it was sent."""
        blocks = self.blocks
        engine = self.engine
        oldest = _EVER if engine is not None and engine.batches else now - ttl_s
        lo, hi = 0, len(keys)  # keys[:lo] held; keys[hi:] not
        while lo < hi:
            mid = (lo + hi) // 2
            t = blocks.get(keys[mid])
            if t is not None and t >= oldest:
                lo = mid + 1
            else:
                hi = mid
        return lo

    def record(self, keys: list[int], now: float, max_blocks: int) -> None:
        """The engine was sent these blocks now: touch them last-first, then evict the least recent."""
        blocks = self.blocks
        move = blocks.move_to_end
        for k in reversed(keys):
            blocks[k] = now
            move(k)
        while len(blocks) > max_blocks:
            blocks.popitem(last=False)

    def session_at(self, session: str, now: float, ttl_s: float) -> float:
        """When this deployment last served `session` (0.0: not within `ttl_s`)."""
        t = self.sessions.get(session)
        return t if t is not None and t >= now - ttl_s else 0.0

    def note_session(self, session: str, now: float) -> None:
        sessions = self.sessions
        sessions[session] = now
        sessions.move_to_end(session)
        if len(sessions) > MAX_SESSIONS:
            sessions.popitem(last=False)

    def forget_session(self, session: str) -> None:
        self.sessions.pop(session, None)

    def live(self, now: float, ttl_s: float) -> int:
        """The sessions sent here within `ttl_s` (the older ones are dropped: the LRU's head is the oldest)."""
        sessions = self.sessions
        oldest = now - ttl_s
        while sessions:
            first = next(iter(sessions))
            if sessions[first] >= oldest:
                break
            del sessions[first]
        return len(sessions)


def max_blocks(cache_tokens: int, block_bytes: int) -> int:
    """The blocks an engine cache of `cache_tokens` tokens holds (at least one)."""
    return max(1, cache_tokens * BYTES_PER_TOKEN // block_bytes)


def blocks_of(info: RequestInfo, block_bytes: int) -> PromptBlocks:
    """The request's blocks, hashed once (a retry on another deployment reuses them)."""
    found = info.blocks
    if found is None:
        found = info.blocks = prompt_blocks(info.conversation, info.tools_json, block_bytes)
    assert isinstance(found, PromptBlocks)
    return found


def annotate(
    views: list[CandidateView],
    records: list[PrefixRecord],
    info: RequestInfo,
    session: str | None,
    cfg: AffinityConfig,
    now: float,
) -> None:
    """Set each candidate's `match` (share of the prompt its record holds), `session_at` and `conversations`."""
    pb = blocks_of(info, cfg.block_bytes)
    for view, record in zip(views, records, strict=True):
        if record.engine is not None:
            record.settle(cfg.block_bytes)
        if pb.keys:
            view.match = pb.share(record.matched(pb.keys, now, cfg.ttl_s))
        if session is not None:
            view.session_at = record.session_at(session, now, cfg.ttl_s)
        view.conversations = record.live(now, cfg.ttl_s)


def placed(
    record: PrefixRecord,
    others: list[PrefixRecord],
    info: RequestInfo,
    session: str | None,
    cfg: AffinityConfig,
    now: float,
) -> float:
    """The request went to this deployment: record its blocks and session (which the `others`, the model's other
    deployments, no longer count among their live conversations); returns the share it matched."""
    pb = blocks_of(info, cfg.block_bytes)
    share = pb.share(record.matched(pb.keys, now, cfg.ttl_s))
    record.record(pb.keys, now, max_blocks(cfg.cache_tokens, cfg.block_bytes))
    if session is not None:
        record.note_session(session, now)
        for other in others:
            other.forget_session(session)
    return share
