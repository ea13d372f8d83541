"""Prometheus text exposition in the two dialects the engines emit.

``PyProm`` mimics prometheus_client (Python engines: vLLM, SGLang, LMDeploy): floats as
``1.0``, Go-style exponents for large values, ``_created`` series next to counters and
histograms, labels in declaration order. llama.cpp's hand-written exposition (integers
without decimals, six significant digits) lives in the llama-server module.
"""

from __future__ import annotations

import math

from llm_gateway_emulators.stats import Histogram


def go_float(value: float) -> str:
    """prometheus_client.utils.floatToGoString."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return s


def labels_text(labels: list[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels) + "}"


class PyProm:
    """Collects families and renders them like prometheus_client's generate_latest()."""

    def __init__(
        self, labels: list[tuple[str, str]], created: float, sort_labels: bool, multiprocess: bool = True
    ) -> None:
        self.labels = labels
        self.created = created
        self.sort_labels = sort_labels  # multiprocess-mode registries (vLLM, SGLang) sort
        #: multiprocess collectors give ``_created`` its own HELP/TYPE (gauge); the default
        #: registry prints it inside the counter/histogram family
        self.multiprocess = multiprocess
        self.lines: list[str] = []

    def _created_head(self, name: str, doc: str) -> None:
        if self.multiprocess:
            self._head(f"{name}_created", doc, "gauge")

    def _lt(self, extra: list[tuple[str, str]] | None = None) -> str:
        labels = self.labels + (extra or [])
        return labels_text(sorted(labels) if self.sort_labels else labels)

    def _head(self, name: str, doc: str, kind: str) -> None:
        self.lines.append(f"# HELP {name} {doc}")
        self.lines.append(f"# TYPE {name} {kind}")

    def gauge(self, name: str, doc: str, value: float, extra: list[tuple[str, str]] | None = None) -> None:
        self._head(name, doc, "gauge")
        self.lines.append(f"{name}{self._lt(extra)} {go_float(value)}")

    def gauge_multi(self, name: str, doc: str, series: list[tuple[list[tuple[str, str]], float]]) -> None:
        self._head(name, doc, "gauge")
        for extra, value in series:
            self.lines.append(f"{name}{self._lt(extra)} {go_float(value)}")

    def counter(self, name: str, doc: str, series: list[tuple[list[tuple[str, str]], float]]) -> None:
        """``name`` without the ``_total`` suffix, as prometheus_client declares it."""
        self._head(f"{name}_total", doc, "counter")
        for extra, value in series:
            self.lines.append(f"{name}_total{self._lt(extra)} {go_float(value)}")
        self._created_head(name, doc)
        for extra, _ in series:
            self.lines.append(f"{name}_created{self._lt(extra)} {go_float(self.created)}")

    def histogram(self, name: str, doc: str, hist: Histogram) -> None:
        self._head(name, doc, "histogram")
        for bound, acc in zip(hist.bounds, hist.cumulative(), strict=True):
            self.lines.append(f"{name}_bucket{self._lt([('le', go_float(bound))])} {go_float(acc)}")
        self.lines.append(f"{name}_bucket{self._lt([('le', '+Inf')])} {go_float(hist.count)}")
        self.lines.append(f"{name}_count{self._lt()} {go_float(hist.count)}")
        self.lines.append(f"{name}_sum{self._lt()} {go_float(hist.sum)}")
        self._created_head(name, doc)
        self.lines.append(f"{name}_created{self._lt()} {go_float(self.created)}")

    def render(self) -> bytes:
        return ("\n".join(self.lines) + "\n").encode()


PROM_CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
