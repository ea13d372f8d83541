"""Live counters of one emulator, read by tests and by the metrics endpoints.

Owns ``Stats`` (what the emulator saw and did) and ``Histogram`` (the few latency
distributions the vLLM/SGLang/LMDeploy metrics expose). Counters are plain ints updated
from the event loop; reading them from another thread is safe enough for tests.
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field
from typing import Any

RECENT = 64


class Histogram:
    """Cumulative Prometheus-style histogram with fixed upper bounds."""

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[int]:
        out, acc = [], 0
        for c in self.counts:
            acc += c
            out.append(acc)
        return out


@dataclass
class Stats:
    """What the emulator has seen. See the package docstring for each field."""

    requests_total: int = 0  # inference requests (chat, completions, embeddings, native generate)
    http_requests_total: int = 0  # every request except /_emulator/*
    active: int = 0  # holding a slot (generating) now
    waiting: int = 0  # queued for a slot now
    completed: int = 0  # inference responses sent to the end
    cancelled: int = 0  # client went away before the end of the response
    faulted: int = 0  # requests a fault was applied to
    rejected: int = 0  # turned away by a full queue
    errors: int = 0  # error responses (status >= 400) of any route
    connections_open: int = 0
    connections_total: int = 0
    prompt_tokens_total: int = 0
    tokens_generated_total: int = 0
    last_request: dict[str, Any] | None = None  # last non-GET/HEAD request
    last_effective: dict[str, Any] | None = None  # how the engine read the last inference request
    recent_requests: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=RECENT))
    by_path: dict[str, int] = field(default_factory=dict)
    finished_reasons: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests_total": self.requests_total,
            "http_requests_total": self.http_requests_total,
            "active": self.active,
            "waiting": self.waiting,
            "completed": self.completed,
            "cancelled": self.cancelled,
            "faulted": self.faulted,
            "rejected": self.rejected,
            "errors": self.errors,
            "connections_open": self.connections_open,
            "connections_total": self.connections_total,
            "prompt_tokens_total": self.prompt_tokens_total,
            "tokens_generated_total": self.tokens_generated_total,
            "last_request": self.last_request,
            "last_effective": self.last_effective,
            "recent_requests": list(self.recent_requests),
            "by_path": dict(self.by_path),
            "finished_reasons": dict(self.finished_reasons),
        }

    def reset(self) -> None:
        """Zero the counters, keeping the live gauges (active, waiting, connections_open)."""
        keep = (self.active, self.waiting, self.connections_open)
        fresh = Stats()
        for name in fresh.__dataclass_fields__:
            setattr(self, name, getattr(fresh, name))
        self.active, self.waiting, self.connections_open = keep
