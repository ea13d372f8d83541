"""A tolerant reader of the Prometheus text format, for engine load probes.

Engines differ (llama.cpp prints integers and no labels, vLLM and LMDeploy label by `engine` rank and
`model_name`, SGLang's label set varies by version), so this reads any label set, sums samples of the
same name across labels (data-parallel ranks add up), and ignores what it cannot parse instead of
failing the probe.
"""

from __future__ import annotations

import math


def parse_samples(text: bytes) -> dict[str, float]:
    out: dict[str, float] = {}
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
        out[name] = out.get(name, 0.0) + value
    return out
