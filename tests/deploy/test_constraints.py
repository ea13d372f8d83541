"""constraints.txt pins every dependency the project declares, at versions its ranges allow: CI and
the image install under it, so a stale or missing pin would silently let a fresh machine drift."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin"
            pins[canonicalize_name(name)] = version
    return pins


def test_every_declared_dependency_is_pinned_within_its_range() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]
    pins = _pins()
    for spec in declared:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared in pyproject.toml but not pinned in constraints.txt"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req.name}=={pins[name]} is outside {spec}"


def test_the_installers_use_the_constraints() -> None:
    for script in ("scripts/setup_dev.sh", "scripts/quickstart.sh"):
        assert "-c constraints.txt" in (REPO / script).read_text(), script
