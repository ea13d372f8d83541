"""Every gateway config the deployments mount, and every file under config/, loads with the gateway's
own loader and passes `llm-gateway check-config`; the container's environment contract holds."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from llm_gateway.settings.loader import load_config
from llm_gateway.state.database import DB_FILE, database_url
from tests.deploy._tools import COMPOSE_CONFIG, K8S_CONFIG, K8S_DIR, REPO, image_data_dir, load_yaml_docs

CONFIG_FILES = sorted([*REPO.glob("config/*.yaml"), *REPO.glob("config/*.yml")])


def test_the_deployment_configs_are_under_config():
    assert COMPOSE_CONFIG in CONFIG_FILES
    assert K8S_CONFIG in CONFIG_FILES


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
def test_every_config_file_loads_with_the_gateway_loader(path: Path):
    cfg = load_config(path, env={})  # ${VAR:-default} only: no secret needed to validate
    assert cfg.models and cfg.backends


@pytest.mark.parametrize("path", [COMPOSE_CONFIG, K8S_CONFIG], ids=lambda p: p.name)
def test_check_config_cli_passes(path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "llm_gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{path}: OK" in out.stdout


def test_kubernetes_configmap_loads_with_the_secret_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The ConfigMap's file, with the example Secret's variables (digests made valid), as a pod sees it."""
    cm = next(d for d in load_yaml_docs(K8S_DIR / "configmap.yaml") if d["kind"] == "ConfigMap")
    path = tmp_path / "gateway.yaml"
    path.write_text(cm["data"]["gateway.yaml"])
    secret = next(d for d in load_yaml_docs(K8S_DIR / "secret.example.yaml") if d["kind"] == "Secret")
    env = {
        k: (hashlib.sha256(k.encode()).hexdigest() if k.endswith("_SHA256") else v)
        for k, v in secret["stringData"].items()
    }
    env["VLLM_API_KEY"] = "sk-engine"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = load_config(path)
    assert {k.sha256 for k in cfg.auth.keys} == {v for k, v in env.items() if k.endswith("_SHA256")}
    assert {b.name for b in cfg.backends if b.api_key is not None} == {"vllm-0", "vllm-1"}
    assert cfg.limits.redis_url is not None
    assert cfg.limits.redis_url.get_secret_value() == "redis://llm-gateway-redis:6379/0"
    assert cfg.database.url is not None
    assert cfg.database.url.get_secret_value() == env["DATABASE_URL"]


def test_image_environment_overrides_the_listen_host_and_is_otherwise_ignored(monkeypatch: pytest.MonkeyPatch):
    """deploy/Dockerfile sets GATEWAY_CONFIG and GATEWAY_SERVER__HOST=0.0.0.0: the first is not a config
    field (it must not trip extra="forbid"), the second wins over the file's host."""
    monkeypatch.setenv("GATEWAY_CONFIG", "/etc/llm-gateway/gateway.yaml")
    monkeypatch.setenv("GATEWAY_SERVER__HOST", "0.0.0.0")
    cfg = load_config(REPO / "config" / "gateway.yaml")  # says host: 127.0.0.1
    assert cfg.server.host == "0.0.0.0"


@pytest.mark.parametrize("path", [COMPOSE_CONFIG, K8S_CONFIG], ids=lambda p: p.name)
def test_deployment_configs_listen_everywhere_with_metrics_port_and_redis(path: Path):
    cfg = load_config(path, env={})
    assert cfg.server.host == "0.0.0.0"
    assert cfg.server.port == 8080
    assert cfg.server.metrics_port == 9464
    assert cfg.auth.mode == "keys"
    assert cfg.limits.store == "redis"
    # the placeholder digests are no key's digest: nothing is open until the secret is provided
    assert all(len(set(k.sha256)) <= 2 for k in cfg.auth.keys)


@pytest.mark.parametrize("path", [COMPOSE_CONFIG, K8S_CONFIG], ids=lambda p: p.name)
def test_the_image_data_dir_wins_and_holds_the_sqlite_file(path: Path, monkeypatch: pytest.MonkeyPatch):
    """Without database.url the database is <data_dir>/llm-gateway.db: in the image, the /data of
    GATEWAY_SERVER__DATA_DIR (the mount point compose and Kubernetes give a volume), whatever the file says."""
    data_dir = image_data_dir()
    monkeypatch.setenv("GATEWAY_SERVER__DATA_DIR", data_dir)
    cfg = load_config(path, env={})
    assert cfg.database.url is None
    assert database_url(cfg) == f"sqlite+aiosqlite:///{data_dir}/{DB_FILE}"
