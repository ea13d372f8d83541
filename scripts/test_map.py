"""Which tests cover a module: every test file that imports it (directly, lazily or by name in a string).

    .venv/bin/python scripts/test_map.py                      # the whole map, module by module
    .venv/bin/python scripts/test_map.py routing/dispatch.py  # the tests of one module

A module no test file imports is listed under "(no test imports it)": it is still covered through the
modules that use it, but a change to it deserves a look at who does.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "llm_gateway"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_by(test: Path) -> set[str]:
    found: set[str] = set()
    tree = ast.parse(test.read_text(), str(test))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("llm_gateway."):
            found.add(node.value.rsplit(".", 1)[0])
            found.add(node.value)
    return {f for f in found if f.startswith("llm_gateway")}


def test_map() -> dict[str, list[str]]:
    modules = {module_name(p): p for p in sorted(PKG.rglob("*.py")) if "migrations" not in p.parts}
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    out: dict[str, list[str]] = {m: [] for m in modules}
    for t in tests:
        for name in imported_by(t):
            if name in out:
                out[name].append(str(t.relative_to(ROOT)))
    return out


def main(argv: list[str]) -> int:
    found = test_map()
    if argv:
        wanted = module_name((PKG / argv[0]).resolve()) if argv[0].endswith(".py") else argv[0]
        for t in found.get(wanted, []):
            print(t)
        return 0 if wanted in found else 1
    orphans = []
    for module, tests in found.items():
        if tests:
            print(f"{module}\n  " + "\n  ".join(tests))
        else:
            orphans.append(module)
    print("(no test imports it)\n  " + "\n  ".join(orphans))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
