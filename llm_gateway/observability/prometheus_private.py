"""Every write the gateway makes to prometheus-client's internals, in one module.

The request path counts a dozen times a request (a stream's inter-token gaps included), and prometheus-client's own
`inc` and `observe` take a `threading.Lock` per value touched and check their arguments through more calls each
time. The gateway's series are only ever updated and read on the event loop's thread (the request path, and
`/metrics` rendered in a handler), so `Metrics.child` swaps a labelled Counter's or Histogram's values for
lock-free `LoopValue`s (`loop_values`), and `inc`, `observe` and `observe_many` write those values directly.

That stands on prometheus-client's private layout, listed here and checked against the installed version by
tests/unit/test_prometheus_private.py (which names what changed): a labelled Counter keeps its count in `_value`
(`COUNTER_FIELDS`); a Histogram a value per bucket in `_buckets`, one per bound of `_upper_bounds` (ascending,
the last +Inf), and its sum in `_sum` (`HISTOGRAM_FIELDS`); each value is a `values.MutexValue` (the single-process
`ValueClass`) with the methods `VALUE_METHODS`. pyproject.toml allows only the minor version last checked
(`CHECKED`); constraints.txt pins its patch release. tests/unit/test_metrics_batching.py checks that the series
are the ones prometheus-client's own methods leave.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from typing import Any

from prometheus_client import Counter, Histogram

#: the prometheus-client release this module was last checked against (pyproject.toml: `>=0.26,<0.27`)
CHECKED = "0.26.0"
#: a labelled Counter's field holding its count
COUNTER_FIELDS = ("_value",)
#: a labelled Histogram's fields: its buckets' values, their upper bounds, its sum's value
HISTOGRAM_FIELDS = ("_buckets", "_upper_bounds", "_sum")
#: the methods of a child's value (prometheus_client/values.py `MutexValue`), which `LoopValue` has alike
VALUE_METHODS = ("inc", "set", "set_exemplar", "get", "get_exemplar")


class LoopValue:
    """A Counter's or Histogram's value that only the event loop's thread updates and reads (the request path,
    and `/metrics` rendered in a handler): a float with no lock. prometheus-client's `MutexValue` takes a
    `threading.Lock` for every increment, a dozen a stream; nothing in the gateway updates these series from
    another thread. Its methods are MutexValue's (`VALUE_METHODS`)."""

    __slots__ = ("_exemplar", "_value")

    def __init__(self, value: float = 0.0) -> None:
        self._value = value
        self._exemplar: Any = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Any:
        return self._exemplar


def loop_values(child: Any) -> None:
    """Swap a Counter or Histogram child's values for `LoopValue`s holding what they held."""
    if isinstance(child, Histogram):
        child._buckets = [LoopValue(b.get()) for b in child._buckets]
        child._sum = LoopValue(child._sum.get())
    elif isinstance(child, Counter):
        child._value = LoopValue(child._value.get())
    else:
        raise TypeError(f"Metrics.child serves counters and histograms, not {type(child).__name__}")


def inc(child: Any, amount: float = 1) -> None:
    """`child.inc(amount)` for a Counter child (amount >= 0), straight on its value: prometheus-client's
    own `inc` checks the amount and the child's observability through two more calls, which every
    request pays several times (tests/unit/test_metrics_batching.py checks the series are the same)."""
    child._value.inc(amount)


def observe(child: Any, value: float) -> None:
    """`child.observe(value)` for a Histogram child, as `observe_many` does it for one value."""
    child._buckets[bisect_left(child._upper_bounds, value)].inc(1)
    child._sum.inc(value)


def observe_many(child: Any, values: list[float]) -> None:
    """What `observe(v)` for each of `values` does to a Histogram child, with each bucket and the sum
    incremented once: prometheus-client takes two locks per observation, which a stream's relay would
    pay per token (the inter-token latencies are batched, tests/unit/test_metrics_batching.py checks the result
    is the same). The values are sorted once and each bucket's count read off with one bisect per bound
    from the smallest value's bucket on (a bisect per value was a C call per relayed event), or at once
    when they all fall in that bucket. Relies on prometheus-client's child layout
    (`HISTOGRAM_FIELDS`)."""
    if not values:
        return
    ordered = sorted(values)
    n = len(ordered)
    buckets = child._buckets
    bounds = child._upper_bounds  # ascending, the last +Inf; a value v counts in the first bucket whose
    first = bisect_left(bounds, ordered[0])  # bound is >= v: none below the smallest value's
    if ordered[-1] <= bounds[first]:  # all in that one bucket: a stream's gaps at a steady pace usually are
        buckets[first].inc(n)
    else:
        below = 0  # values at or under the previous bound
        for i, bound in enumerate(bounds[first:], first):
            upto = bisect_right(ordered, bound, below)
            if upto > below:
                buckets[i].inc(upto - below)
                below = upto
                if below == n:
                    break
    child._sum.inc(math.fsum(ordered))
