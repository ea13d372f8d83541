"""A tolerant reader of the Prometheus text format, for engine load probes.

Engines differ (llama.cpp prints integers and no labels, vLLM and LMDeploy label by `engine` rank and
`model_name`, SGLang's label set varies by version), so this reads any label set and keeps every
sample of a name: counts (running, waiting) add up across data-parallel ranks, fractions (KV-cache
fill) do not, so callers take the sum or the peak. What cannot be parsed is skipped, never fatal.
"""

from __future__ import annotations

import math


def parse_samples(text: bytes) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for raw in text.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            close = line.rfind("}")
            if close < brace:
                continue
            name, rest = line[:brace], line[close + 1 :]
        else:
            name, _, rest = line.partition(" ")
        fields = rest.split()
        if not name or not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out.setdefault(name, []).append(value)
    return out


def total(samples: dict[str, list[float]], name: str) -> float | None:
    values = samples.get(name)
    return sum(values) if values else None


def peak(samples: dict[str, list[float]], name: str) -> float | None:
    values = samples.get(name)
    return max(values) if values else None
