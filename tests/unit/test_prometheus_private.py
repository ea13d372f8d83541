"""The prometheus-client internals the request path writes (llm_gateway/observability/prometheus_private.py),
checked against the installed prometheus-client: a labelled Counter's value is its `_value`, a Histogram's its
`_buckets` (one per `_upper_bounds`, the last +Inf) and `_sum`, each value a `MutexValue` whose methods
`LoopValue` stands in for, and nothing else in the product touches them. An upgrade that changes one fails
here, naming it, before a series silently stops counting; pyproject.toml allows only the minor version checked.
(tests/unit/test_metrics_batching.py checks that the series are the ones prometheus-client's own methods leave.)"""

from __future__ import annotations

import ast
import inspect
import math
import tomllib
from importlib.metadata import version
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
from prometheus_client import CollectorRegistry, Counter, Histogram, values

from llm_gateway.observability import prometheus_private as pp

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "llm_gateway"


def _version() -> str:
    return f"prometheus-client {version('prometheus-client')} (prometheus_private.py was checked against {pp.CHECKED})"


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    """A method's parameters (name, kind, default), not their annotations (prometheus-client has none)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_value_class_is_the_one_loop_value_stands_in_for() -> None:
    assert values.ValueClass is values.MutexValue, (
        f"{_version()}: the children's values are {values.ValueClass.__name__}, not MutexValue "
        "(multiprocess mode, PROMETHEUS_MULTIPROC_DIR, is not supported: one worker per process)"
    )
    changed = []
    for name in pp.VALUE_METHODS:
        theirs, ours = getattr(values.MutexValue, name, None), getattr(pp.LoopValue, name)
        if theirs is None:
            changed.append(f"MutexValue.{name} is gone")
        elif _params(theirs) != _params(ours):
            changed.append(f"MutexValue.{name}{inspect.signature(theirs)}, LoopValue.{name}{inspect.signature(ours)}")
    public = {n for n in vars(values.MutexValue) if not n.startswith("_")}
    if public != set(pp.VALUE_METHODS):
        changed.append(f"MutexValue's methods are now {sorted(public)}, LoopValue has {sorted(pp.VALUE_METHODS)}")
    assert not changed, f"{_version()}:\n" + "\n".join(changed)


def test_a_counter_child_keeps_its_count_in_its_value() -> None:
    child = Counter("c", "c", ["l"], registry=CollectorRegistry()).labels("x")
    fields = vars(child)
    assert all(f in fields for f in pp.COUNTER_FIELDS), f"{_version()}: a Counter child has {sorted(fields)}"
    assert isinstance(child._value, values.MutexValue), f"{_version()}: Counter._value is {type(child._value)}"
    child.inc(2)
    assert child._value.get() == 2, f"{_version()}: Counter.inc no longer counts in `_value`"


def test_a_histogram_child_keeps_a_value_per_bucket_and_one_for_the_sum() -> None:
    child = Histogram("h", "h", ["l"], buckets=(1, 2), registry=CollectorRegistry()).labels("x")
    fields = vars(child)
    assert all(f in fields for f in pp.HISTOGRAM_FIELDS), f"{_version()}: a Histogram child has {sorted(fields)}"
    assert list(child._upper_bounds) == [1, 2, math.inf], f"{_version()}: _upper_bounds is {child._upper_bounds}"
    assert len(child._buckets) == 3 and all(isinstance(b, values.MutexValue) for b in child._buckets)
    child.observe(1.5)
    assert [b.get() for b in child._buckets] == [0, 1, 0] and child._sum.get() == 1.5, (
        f"{_version()}: Histogram.observe no longer counts in the bucket of the first bound >= the value"
    )


def test_the_helpers_write_what_prometheus_clients_own_methods_write() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["l"], registry=registry).labels("x")
    hist = Histogram("h", "h", ["l"], buckets=(1, 2), registry=registry).labels("x")
    pp.loop_values(counter)
    pp.loop_values(hist)
    pp.inc(counter, 2)
    pp.observe(hist, 1.5)
    pp.observe_many(hist, [0.5, 3.0])
    assert isinstance(counter._value, pp.LoopValue) and counter._value.get() == 2
    assert [b.get() for b in hist._buckets] == [1, 1, 1] and hist._sum.get() == 5.0


def test_no_other_module_touches_prometheus_clients_internals() -> None:
    private = set(pp.COUNTER_FIELDS) | set(pp.HISTOGRAM_FIELDS)
    found = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name == "prometheus_private.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            own = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
            if isinstance(node, ast.Attribute) and node.attr in private and not own:  # a class's own: not theirs
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client.values"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: from {node.module}")
    assert not found, "reach prometheus-client's internals through observability/prometheus_private.py:\n" + "\n".join(
        found
    )


def test_prometheus_client_is_held_to_the_minor_version_checked() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (spec,) = [Requirement(d).specifier for d in deps if canonicalize_name(Requirement(d).name) == "prometheus-client"]
    checked = Version(pp.CHECKED)
    assert spec.contains(pp.CHECKED), f"pyproject.toml's prometheus-client{spec} excludes the version checked"
    assert not spec.contains(f"{checked.major}.{checked.minor + 1}.0"), f"prometheus-client{spec} is open above"
