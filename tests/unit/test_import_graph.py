"""The plan of the house, checked: every import in llm_gateway points down, and no folders form a circle.

Each module of the product belongs to one layer (the table below, bottom first). A module may import
from a lower layer, or from its own subpackage; an import from the same or a higher layer fails the
test, and so does any circle in the graph of nodes (a subpackage, or a module at the package's top).
Every import counts, including the ones inside functions and under TYPE_CHECKING: a lazy import is
still a dependency. A new module must be placed in the table consciously, or this test fails.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "llm_gateway"

# bottom first; a name is a top-level module or a subpackage of llm_gateway
LAYERS: list[tuple[str, ...]] = [
    ("errors", "types", "exchange", "background"),  # the shared vocabulary, how threads yield to the loop: no imports
    ("wire",),  # client-API wire formats shared by adapters and dialects (SSE bytes, chat events, Anthropic), pure
    ("adapters", "upstream"),  # engine knowledge; the upstream client seam
    ("settings",),  # the config schema (validated against the adapters' registry) and its loader
    ("access",),  # keys, limits and budgets: who may call and how much
    ("state", "observability"),  # the database; metrics, access log, records, the usage ledger
    ("routing",),  # the table and every routing decision, up to dispatch and the probes
    ("service",),  # the request pipeline: runtime, one request's state and steps, the stream relay, reload
    ("http",),  # the HTTP server alone: raw ASGI over the hardened uvicorn protocol, dispatching by a route table
    ("dialects",),  # the client APIs (OpenAI, Anthropic Messages, Responses, ops) and the route table
    ("admin",),  # the control plane: FastAPI admin API (runtime keys, audit log), mounted by the app
    ("app",),  # the composition root
    ("cli",),  # the command line
    ("__main__", "__init__"),  # `python -m llm_gateway`; the package itself imports nothing
]
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def _node(module: str) -> str:
    """llm_gateway.routing.table -> routing; llm_gateway.service.pipeline -> service."""
    parts = module.split(".")
    assert parts[0] == "llm_gateway"
    return parts[1] if len(parts) > 1 else "__init__"


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1] if len(parts) > 2 else [*parts[:-1], "__init__"]
        out[".".join(parts)] = path
    return out


def _imports(path: Path) -> set[str]:
    """Every llm_gateway module this file imports, wherever the import statement stands."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "llm_gateway")
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the house uses absolute imports)"
            if node.module and node.module.split(".")[0] == "llm_gateway":
                found.add(node.module)
    return found


def _edges() -> list[tuple[str, str, str]]:
    """(importing module, imported module, line of reasoning) for every import across nodes."""
    edges = []
    for module, path in _modules().items():
        for target in _imports(path):
            edges.append((module, target, f"{path.relative_to(ROOT.parent)} imports {target}"))
    return edges


def test_every_module_is_placed_in_a_layer():
    unplaced = sorted({_node(m) for m in _modules()} - set(RANK))
    assert not unplaced, f"place these in LAYERS (tests/unit/test_import_graph.py): {unplaced}"


def test_every_import_points_down():
    upward = []
    for src, dst, why in _edges():
        a, b = _node(src), _node(dst)
        if a == b and a != "__init__":
            continue  # inside one subpackage
        if dst == "llm_gateway" or RANK[b] >= RANK[a]:
            upward.append(f"{why} (layer {RANK[a]} -> {RANK.get(b, '?')})")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def test_no_circle_between_folders():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in _edges():
        a, b = _node(src), _node(dst)
        graph.setdefault(a, set())
        if a != b:
            graph[a].add(b)
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"a circle between folders: {' -> '.join(e.args[1])}")


def test_the_check_catches_an_upward_import_and_a_circle(tmp_path, monkeypatch):
    """The checks above can fail: a fake tree with adapters importing the service is caught."""
    pkg = tmp_path / "llm_gateway"
    (pkg / "adapters").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "adapters" / "__init__.py").write_text("")
    (pkg / "adapters" / "base.py").write_text("from llm_gateway.service.pipeline import X\n")
    (pkg / "service.py").write_text("from llm_gateway.adapters.base import Y\n")
    monkeypatch.setattr(f"{__name__}.ROOT", pkg)
    with pytest.raises(AssertionError, match=r"adapters/base\.py imports llm_gateway\.service"):
        test_every_import_points_down()
    with pytest.raises(pytest.fail.Exception, match="circle"):
        test_no_circle_between_folders()


def _module_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for src, dst, _ in _edges():
        # `from llm_gateway.pkg import module` names a module; `from llm_gateway.pkg.module import name` too
        target = dst if dst in modules else dst.rpartition(".")[0]
        if target in modules and target != src and not target.endswith("__init__"):
            graph[src].add(target)
    return graph


def test_no_circle_between_modules():
    """No two files import each other, directly or round a longer circle (lazy and TYPE_CHECKING imports
    count): a file's imports say what it stands on."""
    try:
        tuple(graphlib.TopologicalSorter(_module_graph()).static_order())
    except graphlib.CycleError as e:
        pytest.fail(f"a circle between modules: {' -> '.join(e.args[1])}")
