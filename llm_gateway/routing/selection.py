"""Choosing a deployment: a pure function of the request, the candidates and a load snapshot.

`order()` returns the candidates in the order to try them (the first is the choice, the rest are
the failover order). Strategies:

- `least_load` (the default for a model with one deployment): lowest estimated load per slot. The
  estimate is the gateway's own in-flight count (exact, live) plus what the engine reported beyond the
  gateway's own requests at probe time (other clients' work), plus the engine's queue, plus a penalty
  when its KV cache is nearly full. A signal that is missing or older than `stale_s` is *unknown*: it costs a full slot
  of load, so a backend that says nothing never looks idle next to one that says it is idle.
  Engines that report nothing at all (Ollama, TabbyAPI) are judged by the gateway's count alone.
  Residency: a deployment whose model is not loaded (`resident` False: a cold load ahead) counts
  `COLD_LOAD`, one full capacity's worth, on top, so the order is resident and idle, resident and
  busy, cold, and a warm deployment keeps the work until it is saturated; unknown (None) adds
  nothing. Every strategy that orders by load (all but `round_robin`) sees it. `prefer_resident`
  False (routing config) leaves it out: least load alone, as a baseline (bench/residency.py).
- `round_robin`: rotate through the candidates.
- `weighted`: pick at random in proportion to `weight`; failover by load.
- `priority`: lowest `priority` value first (ordered fallback), load breaks ties.
- `prefix_affinity`: requests with the same affinity key (session header or prompt prefix) go to
  the same deployment (rendezvous hashing, stable when deployments come and go) while its load per
  slot stays under `max_load`; otherwise least load.
- `cache_aware` (the default for a model with more than one deployment: settings/gateway.py): the deployment
  whose engine probably holds most of this prompt, traded against load.
  Each candidate comes with `match`, the share of the prompt (0..1) its engine was sent before and may
  still hold (routing/prefix_cache.py), and `session_at`, when it last served this request's session.
  With `load` the load score above without its KV-cache term, and `spare` = load - the lowest load among
  the candidates:
  1. hot replicas yield: a candidate with `spare` > `max_imbalance` goes after every other (by load);
     imbalance, not absolute load, so a uniformly busy pool keeps its affinity; so does one whose model would
     load cold (`resident` False, unless `prefer_resident` is off) while another has it loaded: its engine holds
     none of the conversation, and a cold load costs more than any recompute;
  2. a session seen before stays where it was last served: where the replicas' shared record says
     (`assigned`, routing/placements.py), else, with `spread_new` or without a placement key, where this
     replica last sent it (the most recent);
  3. a conversation with a placement key (`affinity_key`: its session key, or its first user message's
     block key, prefix_cache.anchor_key) that no shared record places goes to the highest rendezvous hash
     of that key over the candidates left: every gateway replica derives the same deployment from the same
     key, so the turns of one conversation meet on one engine without any replica having seen it before.
     Without `spread_new` (hash placement: `affinity.new_conversations: hash`, what replicas without Redis set)
     the hash wins over this replica's own record: a yield (rule 1) is a detour for one turn, and the
     next goes home again unless home is still hot there. Otherwise the replica that moved a conversation
     would keep it away through its record while the others, which never saw the move, sent it home: the
     turns would flip-flop between engines (bench/agent_cache.py, 3 replicas: 1.21x the recompute of one).
     With `spread_new` (`affinity.new_conversations: load` or `auto`, the default: one replica, or replicas
     sharing their placements through Redis) a new conversation is spread instead (rule 4): the shared
     record (or, with one replica, its own) carries its placement to the later turns;
  4. a new conversation (no assistant turn yet, `fresh`) goes, with `spread_new`, to the candidate left after
     rule 1 that holds the fewest live conversations (`conversations`: those this replica last sent there
     within `ttl_s`), equal counts by least load: a conversation is the unit of an agent's future load, and
     the in-flight count at its first turn is not. Without `spread_new`, and for a conversation no
     candidate holds any of, least load (ties take turns);
  5. otherwise the highest `match - load_weight * spare` goes first (production-stack's `loadaware`
     score, matched/prompt - beta * relative load), ties by load.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass

from llm_gateway.types import LoadSnapshot

UNKNOWN_LOAD = 1.0  # slots of load assumed for an engine whose load signal is missing or stale
KV_KNEE = 0.85  # KV-cache fill above which new work starts to evict or queue
COLD_LOAD = 1.0  # slots of load a cold load counts as (a resident model is preferred until saturated)


@dataclass(slots=True)
class CandidateView:
    """What selection may know about one deployment; built fresh for each request (not frozen: a frozen
    dataclass sets each field through object.__setattr__, twice the cost of building it)."""

    key: str  # a stable identity: backend name + upstream model
    in_flight: int  # the gateway's own requests to this backend now
    capacity: int  # slots (engine capacity or the deployment's max_concurrency)
    reports_load: bool
    load: LoadSnapshot | None
    own_at_probe: int  # the gateway's in-flight count when `load` was read
    weight: float = 1.0
    priority: int = 0
    resident: bool | None = None  # the model is loaded (True), would load cold (False), unknown (None)
    match: float = 0.0  # cache_aware: the share of the prompt its engine may hold (prefix_cache.py)
    session_at: float = 0.0  # cache_aware: when it last served this request's session (0: never)
    assigned: bool = False  # cache_aware: the replicas' shared record places this request's session here
    conversations: int = 0  # cache_aware: the live conversations this replica last sent here (prefix_cache.py)


def load_score(
    c: CandidateView, now: float, stale_s: float, prefer_resident: bool = True, kv_penalty: bool = True
) -> float:
    """The candidate's estimated load per slot (one function: it runs for every candidate of every request);
    `kv_penalty` False leaves the KV-cache fill out (cache_aware: see `_cache_aware`)."""
    cap = c.capacity if c.capacity > 1 else 1
    cold = COLD_LOAD if prefer_resident and c.resident is False else 0.0
    load = c.load
    if load is not None and now - load.at <= stale_s:
        running = load.running or 0.0
        waiting = load.waiting if load.waiting is not None else 0.0
        external = running + waiting - c.own_at_probe
        score = (c.in_flight + (external if external > 0.0 else 0.0)) / cap + waiting / cap
        if load.running is None and load.waiting is None:
            score += UNKNOWN_LOAD
        kv = load.kv
        if kv is not None and kv > KV_KNEE and kv_penalty:
            score += (kv - KV_KNEE) * 10
        return score + cold
    if c.reports_load:
        return c.in_flight / cap + UNKNOWN_LOAD + cold
    return c.in_flight / cap + cold


def order(
    strategy: str,
    cands: Sequence[CandidateView],
    *,
    now: float,
    stale_s: float,
    rotation: int = 0,
    affinity_key: str | None = None,
    max_affinity_load: float = 1.5,
    rng: random.Random | None = None,
    prefer_resident: bool = True,
    fresh: bool = False,
    load_weight: float = 0.5,
    max_imbalance: float = 2.0,
    spread_new: bool = False,
) -> list[int]:
    """Indices of `cands` in the order to try them."""
    n = len(cands)
    if n <= 1:
        return list(range(n))
    # rotate before the stable sort so that equal scores take turns
    turn = rotation % n
    base = [*range(turn, n), *range(turn)]
    kv = strategy != "cache_aware"
    scores = [load_score(c, now, stale_s, prefer_resident, kv) for c in cands]
    by_load = sorted(base, key=scores.__getitem__)  # a C key: no Python frame per candidate
    if strategy == "least_load":
        return by_load
    if strategy == "round_robin":
        return base
    if strategy == "priority":
        return sorted(by_load, key=lambda i: cands[i].priority)
    if strategy == "weighted":
        r = (rng or random).random() * sum(c.weight for c in cands)
        first = n - 1
        for i, c in enumerate(cands):
            r -= c.weight
            if r < 0:
                first = i
                break
        return [first] + [i for i in by_load if i != first]
    if strategy == "prefix_affinity":
        if affinity_key is None:
            return by_load
        sticky = max(range(n), key=lambda i: _rendezvous(affinity_key, cands[i].key))
        if load_score(cands[sticky], now, stale_s, prefer_resident) <= max_affinity_load:
            return [sticky] + [i for i in by_load if i != sticky]
        return by_load
    if strategy == "cache_aware":
        key = None if spread_new and fresh else affinity_key
        cold = prefer_resident and any(c.resident is False for c in cands)
        return _cache_aware(cands, scores, by_load, fresh, load_weight, max_imbalance, key, spread_new, cold)
    raise ValueError(f"unknown strategy {strategy!r}")


def _cache_aware(
    cands: Sequence[CandidateView],
    scores: list[float],
    by_load: list[int],
    fresh: bool,
    load_weight: float,
    max_imbalance: float,
    key: str | None = None,
    spread_new: bool = False,
    cold: bool = False,
) -> list[int]:
    """The `cache_aware` order (the module's docstring has the rules). Its load leaves the KV-cache fill out:
    a full cache is what this strategy routes to, and llama-server's fill (its busy slots) repeats a probe ago
    what the in-flight count says now; a stale one made replicas look 1.5 slots busier than they were, and
    sessions yield for nothing (bench/agent_cache.py, 4 sessions x 4 turns: 4 moves)."""
    lowest = scores[by_load[0]]
    bound = lowest + max_imbalance
    cool = [i for i in by_load if scores[i] <= bound]
    hot = by_load[len(cool) :]  # by_load is sorted: the hot ones are its tail
    if cold:  # an engine whose model would load cold holds none of its prompts: it yields like a hot one
        warm = [i for i in cool if cands[i].resident is not False]
        if warm and len(warm) < len(cool):
            hot = [i for i in by_load if i not in warm]
            cool = warm
    for i in cool:
        if cands[i].assigned:
            return [i] + [j for j in by_load if j != i]
    if key is None or spread_new:  # hash placement: the hash, the same on every replica, wins over this record
        seen = max(cool, key=lambda i: cands[i].session_at)
        if cands[seen].session_at > 0.0:
            return [seen] + [i for i in by_load if i != seen]
    if key is not None:
        first = max(cool, key=lambda i: _rendezvous(key, cands[i].key))
        return [first] + [i for i in by_load if i != first]
    if fresh and spread_new:  # the fewest live conversations first (sorted is stable: equal counts by load)
        return sorted(cool, key=lambda i: cands[i].conversations) + hot
    if fresh or max(cands[i].match for i in cool) <= 0.0:
        return by_load
    ranked = sorted(cool, key=lambda i: load_weight * (scores[i] - lowest) - cands[i].match)  # stable: ties by load
    return ranked + hot


def _rendezvous(key: str, node: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}\0{node}".encode(), digest_size=8).digest(), "big")
