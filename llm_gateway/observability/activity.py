"""Recent traffic in memory, for the status page: the last failed requests (codes, never messages) and, per
key, requests and tokens in one-minute buckets. Always on, whether or not the usage ledger is; the ledger
(observability/ledger.py) feeds it every finished request.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from llm_gateway.observability.record import NONE, RequestRecord


class Activity:
    """What the status page shows of recent traffic: the last `errors` failed requests (codes, never
    messages) and, per key, requests and tokens in one-minute buckets for the last `minutes` minutes."""

    def __init__(self, errors: int = 50, minutes: int = 60) -> None:
        self.errors: deque[dict[str, Any]] = deque(maxlen=errors)
        self.minutes = minutes
        self._buckets: dict[int, dict[str, list[int]]] = {}  # minute -> key -> [requests, prompt, completion]

    def record(self, rec: RequestRecord, now_s: float) -> None:
        if rec.status >= 400 or rec.outcome != "success":
            self.errors.append(
                {
                    "at": round(now_s, 3),
                    "request_id": rec.rid,
                    "key": rec.key,
                    "model": rec.model,
                    "backend": rec.backend,
                    "endpoint": rec.endpoint,
                    "status": rec.status,
                    "outcome": rec.outcome,
                    "error": rec.error,
                }
            )
        if rec.key == NONE:
            return
        minute = int(now_s // 60)
        bucket = self._buckets.get(minute)
        if bucket is None:
            for old in [m for m in self._buckets if m <= minute - self.minutes]:
                del self._buckets[old]
            bucket = self._buckets[minute] = {}
        counts = bucket.get(rec.key)
        if counts is None:
            counts = bucket[rec.key] = [0, 0, 0]
        counts[0] += 1
        counts[1] += rec.prompt_tokens or 0
        counts[2] += rec.completion_tokens or 0

    def recent_errors(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(reversed(self.errors))

    def tokens_by_key(self, now_s: float) -> list[dict[str, Any]]:
        """Per key over the last `minutes` minutes: totals and tokens per minute (oldest first), most used first."""
        last = int(now_s // 60)
        first = last - self.minutes + 1
        out: dict[str, dict[str, Any]] = {}
        for minute, bucket in self._buckets.items():
            if not first <= minute <= last:
                continue
            for key, (n, p, c) in bucket.items():
                k = out.get(key)
                if k is None:
                    k = out[key] = {
                        "key": key,
                        "requests": 0,
                        "prompt_tokens": 0,
                        "completion_tokens": 0,
                        "per_minute": [0] * self.minutes,
                    }
                k["requests"] += n
                k["prompt_tokens"] += p
                k["completion_tokens"] += c
                k["per_minute"][minute - first] += p + c
        for k in out.values():
            k["total_tokens"] = k["prompt_tokens"] + k["completion_tokens"]
        return sorted(out.values(), key=lambda k: (-k["total_tokens"], k["key"]))
