"""Waiting for conditions instead of sleeping: the timing helpers of the process-level suites.

A test on a loaded 2-core machine must never sleep a fixed time and then check once: it polls the
condition it needs (a metric, a state, an event) until it holds, with a deadline far beyond what a
healthy run needs, so that slowness costs time, never a false failure; the deadline only turns a
real hang into a failure that says what it was waiting for.

`scrape()` reads a gateway's `/metrics` with prometheus-client's own parser, so a test can wait for
the gateway to report what it is about to rely on (probes seen, a request in flight or queued, a
reload applied or rejected) and read timings by the gateway's own clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

DEADLINE_S = 30.0  # generous: a healthy run needs a fraction of it, a loaded one still fits


def wait_until(
    cond: Callable[[], T], *, timeout: float = DEADLINE_S, interval: float = 0.05, what: str = "the condition"
) -> T:
    """Call `cond` until it returns something truthy and return that; fail after `timeout` seconds,
    naming `what` and the last value seen (exceptions from `cond` count as not yet)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        got: T | None
        try:
            got = cond()
        except (httpx.HTTPError, OSError) as e:  # the server is busy or between states: try again
            got, last = None, e
        else:
            if got:
                return got
            last = got
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}; last seen: {last!r}")
        time.sleep(interval)


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(base_url: str, timeout: float = 10.0) -> Samples:
    """Every sample of `base_url/metrics`: (name, labels) -> value."""
    text = httpx.get(base_url + "/metrics", timeout=timeout).text
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    """The value of the one series `name` whose labels include `labels` (None when absent);
    several matching series are summed (e.g. a histogram's `_sum` over an unnamed label)."""
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= ls]
    return sum(found) if found else None


def metric(base_url: str, name: str, **labels: str) -> float | None:
    """One sample, scraped now."""
    return sample(scrape(base_url), name, **labels)
