"""docker-compose.yml: valid against the official Compose Specification schema, accepted by Docker
Compose v2 itself for every profile, and consistent with config/docker-compose.yaml (service names,
ports, engine flags, model names), deploy/prometheus and deploy/grafana."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from llm_gateway.settings.loader import load_config
from tests.deploy._tools import (
    COMPOSE_CONFIG,
    COMPOSE_FILE,
    DEPLOY,
    REPO,
    SCHEMAS,
    compose_cmd,
    image_data_dir,
    load_json,
    load_yaml,
    need_module,
    run,
)

KEY_DIGEST = hashlib.sha256(b"sk-compose-test").hexdigest()
CPU_ENGINES = {"llama-server", "ollama"}
GPU_ENGINES = {"vllm", "sglang", "lmdeploy", "tabbyapi"}
ALWAYS = {"gateway", "redis", "prometheus", "grafana"}
# where each engine listens inside its container (the flag that says so, or the engine's default)
PORT_FLAGS = {
    "llama-server": r"--port\s+\"?(\d+)",
    "vllm": r"--port\s+\"?(\d+)",
    "sglang": r"--port\s+(\d+)",
    "lmdeploy": r"--server-port\s+(\d+)",
    "tabbyapi": r"--port\s+(\d+)",
}
DEFAULT_PORTS = {"ollama": 11434}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return load_yaml(COMPOSE_FILE)


@pytest.fixture(scope="module")
def gw_config():
    return load_config(COMPOSE_CONFIG, env={})


def command_text(svc: dict[str, Any]) -> str:
    cmd = svc.get("command", [])
    return " ".join(cmd) if isinstance(cmd, list) else str(cmd)


# -- the Compose Specification schema (vendored from a registry package: schemas/README.md) ----------


def compose_schema() -> dict[str, Any]:
    return load_json(SCHEMAS / "compose-spec.json")


def test_compose_file_validates_against_the_compose_spec_schema(compose):
    jsonschema = need_module("jsonschema", "jsonschema")
    validator = jsonschema.Draft7Validator(compose_schema())
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_misspelt_field(compose):
    """Negative control: the validator is really strict (unknown service keys are errors)."""
    jsonschema = need_module("jsonschema", "jsonschema")
    bad = copy.deepcopy(compose)
    bad["services"]["gateway"]["helthcheck"] = bad["services"]["gateway"].pop("healthcheck")
    assert not jsonschema.Draft7Validator(compose_schema()).is_valid(bad)


def test_vendored_schema_is_the_one_recorded_in_its_readme():
    readme = (SCHEMAS / "README.md").read_text()
    digest = hashlib.sha256((SCHEMAS / "compose-spec.json").read_bytes()).hexdigest()
    assert digest in readme, "schemas/compose-spec.json changed: update its provenance in schemas/README.md"


# -- Docker Compose v2 itself --------------------------------------------------------------------------


def compose_config(*args: str, env: dict[str, str] | None = None, check: bool = True, tmp: Path) -> Any:
    empty_env_file = tmp / "empty.env"  # never read a developer's .env
    empty_env_file.write_text("")
    base = {k: v for k, v in os.environ.items() if not k.startswith("COMPOSE_")}
    base.pop("GATEWAY_KEY_SHA256", None)
    full_env = {**base, **(env if env is not None else {"GATEWAY_KEY_SHA256": KEY_DIGEST})}
    cmd = [*compose_cmd(), "--project-directory", str(REPO), "-f", str(COMPOSE_FILE), "--env-file", str(empty_env_file)]
    out = run([*cmd, *args, "config", "--format", "json"], env=full_env, check=check, cwd=REPO)
    return out if not check else json.loads(out.stdout)


@pytest.mark.parametrize(
    ("profiles", "expected"),
    [
        ((), ALWAYS),
        (("cpu",), ALWAYS | CPU_ENGINES | {"ollama-init"}),
        (("gpu",), ALWAYS | GPU_ENGINES),
        (("vllm",), ALWAYS | {"vllm"}),
        (("cpu", "gpu"), ALWAYS | CPU_ENGINES | GPU_ENGINES | {"ollama-init"}),
    ],
    ids=lambda v: "+".join(v) if isinstance(v, tuple) else None,
)
def test_docker_compose_accepts_every_profile(profiles, expected, tmp_path):
    """`docker compose --profile cpu up` must not need the GPU services: the gateway's dependencies on
    engines are optional (required: false); a required one on an inactive profile is an error."""
    args = [a for p in profiles for a in ("--profile", p)]
    project = compose_config(*args, tmp=tmp_path)
    assert set(project["services"]) == expected


def test_docker_compose_refuses_to_start_without_the_api_key_digest(tmp_path):
    out = compose_config("--profile", "cpu", env={}, check=False, tmp=tmp_path)
    assert out.returncode != 0
    assert "GATEWAY_KEY_SHA256" in out.stderr


def test_the_gateway_gets_exactly_the_environment_its_config_reads(tmp_path, monkeypatch):
    """Load config/docker-compose.yaml with the environment compose gives the gateway container."""
    project = compose_config("--profile", "cpu", tmp=tmp_path)
    gw = project["services"]["gateway"]
    env = {k: v or "" for k, v in gw["environment"].items()}
    assert env["GATEWAY_KEY_SHA256"] == KEY_DIGEST
    mounts = {m["target"]: m for m in gw["volumes"]}
    mount = mounts[env["GATEWAY_CONFIG"]]
    assert mount["read_only"] is True
    assert Path(mount["source"]) == COMPOSE_CONFIG
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    cfg = load_config(mount["source"])
    assert [k.sha256 for k in cfg.auth.keys] == [KEY_DIGEST]
    assert all(b.api_key is None for b in cfg.backends)  # no engine key set: none sent
    redis = urlsplit(cfg.limits.redis_url.get_secret_value())
    assert redis.hostname == "redis" and redis.port == 6379
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", COMPOSE_CONFIG.read_text()))
    assert referenced <= set(env), f"the config reads variables compose does not pass: {referenced - set(env)}"


# -- topology: config/docker-compose.yaml <-> services ---------------------------------------------------


def test_every_backend_is_a_compose_service_listening_where_the_config_says(compose, gw_config):
    services = compose["services"]
    for b in gw_config.backends:
        url = urlsplit(b.url)
        assert url.hostname in services, f"backend {b.name}: no compose service {url.hostname}"
        svc = services[url.hostname]
        if b.engine in PORT_FLAGS:
            m = re.search(PORT_FLAGS[b.engine], command_text(svc))
            assert m, f"{url.hostname}: no port flag in its command"
            port = int(m.group(1))
        else:
            port = DEFAULT_PORTS[b.engine]
        assert url.port == port, f"backend {b.name}: config says port {url.port}, the engine listens on {port}"
        assert set(svc["profiles"]) & ({"cpu"} if b.engine in CPU_ENGINES else {"gpu"})
        assert b.engine in svc["profiles"] or url.hostname in svc["profiles"]


def test_engines_are_started_with_their_metrics_and_served_model_names(compose, gw_config):
    s = compose["services"]
    assert "--metrics" in s["llama-server"]["command"]
    assert "--enable-metrics" in command_text(s["sglang"])
    assert "--disable-metrics" not in command_text(s["lmdeploy"])
    models = {(d.backend, d.model) for m in gw_config.models for d in m.deployments}
    alias = s["llama-server"]["command"][s["llama-server"]["command"].index("--alias") + 1]
    assert ("llama-server", alias) in models
    assert ("ollama", "local-gguf") in models and "ollama create local-gguf" in command_text(s["ollama-init"])
    vllm = s["vllm"]["command"]
    assert ("vllm", vllm[vllm.index("--served-model-name") + 1]) in models
    sglang = shlex.split(command_text(s["sglang"]))
    assert ("sglang", sglang[sglang.index("--served-model-name") + 1]) in models
    lmdeploy = shlex.split(command_text(s["lmdeploy"]))
    assert ("lmdeploy", lmdeploy[lmdeploy.index("--model-name") + 1]) in models


def test_gpu_engines_reserve_a_gpu_and_cpu_engines_do_not(compose):
    for name, svc in compose["services"].items():
        devices = svc.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        if name in GPU_ENGINES:
            assert devices and devices[0]["capabilities"] == ["gpu"], name
        else:
            assert not devices, name


def test_healthchecks_and_dependencies(compose, gw_config):
    s = compose["services"]
    for name in (ALWAYS | CPU_ENGINES | GPU_ENGINES) - {"ollama-init"}:
        assert s[name]["healthcheck"]["test"][0] == "CMD", name
    deps = s["gateway"]["depends_on"]
    assert deps["redis"] == {"condition": "service_healthy"}
    for engine in CPU_ENGINES | GPU_ENGINES:
        assert deps[engine].get("required") is False, f"gateway must not require {engine}"
    assert s["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"
    # the gateway's own healthcheck and stop grace period
    assert "/healthz" in " ".join(s["gateway"]["healthcheck"]["test"])
    grace = int(s["gateway"]["stop_grace_period"].rstrip("s"))
    assert grace > gw_config.server.graceful_shutdown_s
    assert s["gateway"]["stop_signal"] == "SIGTERM"


def test_gateway_container_is_locked_down(compose):
    gw = compose["services"]["gateway"]
    assert gw["read_only"] is True
    assert gw["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in gw["security_opt"]
    assert gw["build"]["dockerfile"] == "deploy/Dockerfile"
    assert (REPO / gw["build"]["context"] / gw["build"]["dockerfile"]).is_file()


def test_bind_mounted_paths_exist(compose):
    for name, svc in compose["services"].items():
        for v in svc.get("volumes", []):
            src = v["source"] if isinstance(v, dict) else v.split(":")[0]
            if src.startswith(("./", "/")) and "$" not in src:
                assert (REPO / src).exists(), f"{name}: {src} does not exist"


def test_prometheus_scrapes_the_gateway_metrics_port_and_the_engines_with_metrics(compose, gw_config):
    prom = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    targets = {j["job_name"]: [t for sc in j["static_configs"] for t in sc["targets"]] for j in prom["scrape_configs"]}
    assert targets["llm-gateway"] == [f"gateway:{gw_config.server.metrics_port}"]
    assert "9464" in [str(p) for p in compose["services"]["gateway"]["expose"]]
    backends = {urlsplit(b.url).hostname: b for b in gw_config.backends}
    for job in ("llama-server", "vllm", "sglang", "lmdeploy"):
        (target,) = targets[job]
        host, port = target.split(":")
        assert host in compose["services"]
        assert int(port) == urlsplit(backends[host].url).port
    assert "ollama" not in targets and "tabbyapi" not in targets  # no /metrics there
    mount = compose["services"]["prometheus"]["volumes"][0]
    assert mount.startswith("./deploy/prometheus:/etc/prometheus")
    assert "--config.file=/etc/prometheus/prometheus.yml" in compose["services"]["prometheus"]["command"]


def test_grafana_provisioning_matches_the_mounts(compose):
    g = compose["services"]["grafana"]
    mounts = dict(v.split(":")[:2] for v in g["volumes"] if v.startswith("./"))
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    dash_dir = mounts["./deploy/grafana/dashboards"]
    provider = load_yaml(DEPLOY / "grafana/provisioning/dashboards/llm-gateway.yml")["providers"][0]
    assert provider["options"]["path"] == dash_dir
    home = g["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(dash_dir + "/")
    assert (DEPLOY / "grafana/dashboards" / Path(home).name).is_file()
    ds = load_yaml(DEPLOY / "grafana/provisioning/datasources/prometheus.yml")["datasources"][0]
    assert urlsplit(ds["url"]).hostname == "prometheus" and urlsplit(ds["url"]).port == 9090
    assert ds["type"] == "prometheus"


def test_the_gateway_data_dir_is_a_named_volume(compose, gw_config):
    """The root filesystem is read-only: the SQLite database (stored responses) needs a writable mount at
    the image's data dir, and a named volume (not tmpfs, not the container's layer) to survive restarts.
    One gateway replica, so SQLite there is right and no database.url (shared Postgres) is set."""
    gw = compose["services"]["gateway"]
    data_dir = gw.get("environment", {}).get("GATEWAY_SERVER__DATA_DIR") or image_data_dir()
    mounts = {m["target"]: m for m in gw["volumes"] if isinstance(m, dict)}
    mounts |= {v.split(":")[1]: {"source": v.split(":")[0]} for v in gw["volumes"] if isinstance(v, str)}
    assert data_dir in mounts, f"nothing is mounted at the gateway's data dir {data_dir}"
    mount = mounts[data_dir]
    assert mount.get("type", "volume") == "volume" and not mount.get("read_only")
    assert mount["source"] in compose["volumes"], "a named volume, declared at the top level"
    assert data_dir not in [t.split(":")[0] for t in gw.get("tmpfs", [])]
    assert gw["read_only"] is True
    assert gw.get("deploy", {}).get("replicas", 1) == 1 and "scale" not in gw
    assert gw_config.database.url is None and "DATABASE_URL" not in gw["environment"]
