"""What `pip install .` ships: exactly one importable package, the one the Docker image copies, and an
import of it that pulls in no optional backend (redis) the config does not ask for.

The wheel is built for real (pip wheel, as the Dockerfile's builder stage does) and its top-level
names read from the archive; the import checks run in a fresh interpreter so nothing this test
process already imported can hide a dependency.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


#: what the Docker build context holds (.dockerignore lets only these in): the wheel is built from them alone
CONTEXT = ("pyproject.toml", "constraints.txt", "README.md", "llm_gateway")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Built from a copy of the Docker build context, as the image's builder stage builds it: not in the checkout,
    where setuptools' `build/` of an earlier build would ship a module since moved or deleted."""
    out, src = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("context")
    for name in CONTEXT:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(REPO / name, src / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check", "-w", str(out), "."],
        cwd=src,
        check=True,
        timeout=300,
    )
    (found,) = out.glob("llm_gateway-*.whl")
    return found


def test_the_wheel_installs_exactly_one_top_level_package(wheel: Path):
    names = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    packages = {n for n in names if not n.endswith(".dist-info")}
    assert packages == {"llm_gateway"}
    assert not any("emulators" in n for n in zipfile.ZipFile(wheel).namelist())


def test_the_wheel_ships_what_the_docker_image_copies(wheel: Path):
    dockerfile = (REPO / "deploy" / "Dockerfile").read_text()
    copied = {line.split()[1] for line in dockerfile.splitlines() if line.startswith("COPY ") and "./" in line}
    sources = {c for c in copied if (REPO / c).is_dir()}
    assert sources == {"llm_gateway"}
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    on_disk = {str(p.relative_to(REPO)) for p in (REPO / "llm_gateway").rglob("*.py")}
    assert shipped == on_disk


CONFIG = """
server: {{access_log: false}}
limits: {limits}
backends:
  - {{name: a, engine: vllm, url: "http://127.0.0.1:9"}}
models:
  - name: m
    deployments: [{{backend: a, model: m, format: safetensors}}]
"""

PROBE = """
import sys
from llm_gateway.settings.loader import parse_config
from llm_gateway.app import create_app
import llm_gateway.cli, llm_gateway.http.server
create_app(parse_config(sys.argv[1], "t.yaml", {}), probes=False)
print("redis" in sys.modules)
"""


@pytest.mark.parametrize(
    ("limits", "imports_redis"),
    [("{store: memory}", False), ('{store: redis, redis_url: "redis://127.0.0.1:9/0"}', True)],
)
def test_redis_is_imported_only_when_the_redis_store_is_configured(limits: str, imports_redis: bool):
    out = subprocess.run(
        [sys.executable, "-c", PROBE, CONFIG.format(limits=limits)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == str(imports_redis), out.stderr


def test_the_wheel_is_built_from_what_the_docker_context_holds() -> None:
    allowed = [
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    assert sorted(allowed) == sorted(CONTEXT)
