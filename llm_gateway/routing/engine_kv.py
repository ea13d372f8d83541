"""One engine's KV-cache events as counters (routing/kv_events.py's feed writes them, prefix_cache.settle reads them).

Apart from the feed so that the routing table and the prefix record can hold one without importing ZeroMQ or the
feed's lifecycle. Decoding is here too (`apply`, `_event`): it is what the counters mean, and tests drive it with
the payloads vLLM and SGLang send, without a socket.
"""

from __future__ import annotations

from typing import Any


class EngineKv:
    """One engine's KV-cache events, as counters: written by its feed's thread only, read by the event loop."""

    __slots__ = ("batches", "block_size", "cached_tokens", "clears", "endpoints", "last_seq", "removed_tokens")

    def __init__(self) -> None:
        self.endpoints: tuple[str, ...] = ()
        self.batches = 0  # batches decoded: the record follows the engine once this is above 0
        self.clears = 0  # AllBlocksCleared events, and publisher restarts (a sequence that starts again)
        self.removed_tokens = 0  # tokens of the blocks the engine evicted, since the start
        self.cached_tokens = 0  # tokens the engine holds, by its events (stored less removed, 0 at a clear)
        self.block_size = 0  # tokens per block, from the last BlockStored
        self.last_seq: dict[object, int] = {}  # per publisher (data-parallel rank): its last sequence number

    @property
    def source(self) -> str:
        return "kv_events" if self.batches else "approximate"

    def describe(self) -> dict[str, object]:
        return {
            "source": self.source,
            "endpoints": list(self.endpoints),
            "batches": self.batches,
            "cached_tokens": self.cached_tokens,
            "block_size": self.block_size,
        }

    def apply(self, seq: int, payload: Any) -> dict[str, int]:
        """One decoded batch (`seq`: its publisher's sequence number): the counters move; returns the events
        by kind (for the metrics). A batch it cannot read counts as `unreadable` and changes nothing."""
        counts: dict[str, int] = {}
        if isinstance(payload, dict):
            events, rank = payload.get("events"), payload.get("data_parallel_rank")
        elif isinstance(payload, list | tuple) and len(payload) >= 2:
            events, rank = payload[1], payload[2] if len(payload) > 2 else None
        else:
            events, rank = None, None
        if not isinstance(events, list | tuple):
            return {"unreadable": 1}
        last = self.last_seq.get(rank)
        if last is not None and seq <= last:  # the publisher starts again at 0: the engine restarted
            self._clear()
            counts["restart"] = 1
        self.last_seq[rank] = seq
        for ev in events:
            kind, fields = _event(ev)
            if kind == "BlockStored":
                size = fields.get("block_size")
                hashes = fields.get("block_hashes")
                if isinstance(size, int) and size > 0:
                    self.block_size = size
                n = len(hashes) if isinstance(hashes, list | tuple) else 0
                self.cached_tokens += n * self.block_size
            elif kind == "BlockRemoved":
                hashes = fields.get("block_hashes")
                n = (len(hashes) if isinstance(hashes, list | tuple) else 0) * self.block_size
                self.removed_tokens += n
                self.cached_tokens = max(0, self.cached_tokens - n)
            elif kind == "AllBlocksCleared":
                self._clear()
            else:
                kind = "unreadable"
            counts[kind] = counts.get(kind, 0) + 1
        self.batches += 1
        return counts

    def _clear(self) -> None:
        self.clears += 1
        self.cached_tokens = 0


#: the fields of each event kind in the order SGLang's array-like encoding puts them (after the tag)
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


def _event(ev: Any) -> tuple[str, dict[str, Any]]:
    """(kind, fields) of one event, map-encoded (vLLM: a `type` tag) or array-encoded (SGLang: the tag first)."""
    if isinstance(ev, dict):
        return str(ev.get("type")), ev
    if isinstance(ev, list | tuple) and ev and isinstance(ev[0], str):
        names = _ARRAY_FIELDS.get(ev[0], ())
        return ev[0], dict(zip(names, ev[1:], strict=False))
    return "", {}
