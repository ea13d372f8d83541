"""deploy/kubernetes: every manifest valid against the Kubernetes OpenAPI schemas bundled in the PyPI
package kubernetes-validate (strict: unknown fields are errors), the Prometheus Operator objects
against the operator's CRD models (PyPI cloudcoil-models-prometheus-operator), and the wiring between
them and config/kubernetes.yaml (ports, probes, grace period, selectors, secrets)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from llm_gateway.settings.loader import load_config
from tests.deploy._tools import (
    DEPLOY,
    K8S_CONFIG,
    K8S_DIR,
    PROM_DIR,
    image_data_dir,
    load_yaml,
    load_yaml_docs,
    need_module,
)

# the oldest Kubernetes minor still commonly run, and the newest the package knows
K8S_VERSIONS = ("1.29.0", "latest")
MONITORING = K8S_DIR / "monitoring"
CORE_FILES = sorted(p for p in K8S_DIR.glob("*.yaml") if p.name != "kustomization.yaml")
ALL_DOCS = [(p, d) for p in CORE_FILES for d in load_yaml_docs(p)]
WORKLOADS = ("Deployment", "StatefulSet")
POSTGRES = "StatefulSet/llm-gateway-postgres"


def doc_id(item: tuple[Path, dict[str, Any]]) -> str:
    path, doc = item
    return f"{path.name}:{doc['kind']}/{doc['metadata']['name']}"


def kinds() -> dict[str, dict[str, Any]]:
    return {f"{d['kind']}/{d['metadata']['name']}": d for _, d in ALL_DOCS}


@pytest.fixture(scope="module")
def gw_config():
    return load_config(K8S_CONFIG, env={})


@pytest.fixture(scope="module")
def deployment() -> dict[str, Any]:
    return kinds()["Deployment/llm-gateway"]


@pytest.fixture(scope="module")
def container(deployment) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


# -- schemas ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("item", ALL_DOCS, ids=doc_id)
def test_manifest_validates_against_the_kubernetes_schema(item, version):
    kv = need_module("kubernetes_validate", "kubernetes-validate")
    _, doc = item
    version = kv.latest_version() if version == "latest" else version
    try:
        kv.validate(doc, version, strict=True)
    except kv.ValidationError as e:
        pytest.fail(f"{'.'.join(map(str, e.path))}: {e.message} (Kubernetes {e.version})")


def test_strict_validation_catches_a_misspelt_field():
    """Negative control: strict mode rejects unknown fields, so a typo cannot pass as valid."""
    kv = need_module("kubernetes_validate", "kubernetes-validate")
    pdb = copy.deepcopy(kinds()["PodDisruptionBudget/llm-gateway"])
    pdb["spec"]["maxUnavailabel"] = pdb["spec"].pop("maxUnavailable")
    with pytest.raises(kv.ValidationError):
        kv.validate(pdb, kv.latest_version(), strict=True)


def _operator_models():
    need_module("cloudcoil.models.prometheus_operator.v1", "cloudcoil-models-prometheus-operator")
    from cloudcoil.models.prometheus_operator import v1

    return v1


def test_prometheus_operator_objects_match_the_crds():
    """Validated by models generated from the operator's CRDs; dumping back must give the same
    document, so a field the CRD does not know (dropped by the model) fails too."""
    v1 = _operator_models()
    for path in sorted(MONITORING.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_yaml_docs(path):
            model = {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}[doc["kind"]]
            obj = model.model_validate(doc)
            assert obj.model_dump(mode="json", by_alias=True, exclude_unset=True) == doc, path.name


def test_prometheusrule_carries_the_alert_rules_of_deploy_prometheus():
    (rule,) = load_yaml_docs(MONITORING / "prometheusrule.yaml")
    assert rule["spec"]["groups"] == load_yaml(PROM_DIR / "alerts.yml")["groups"]


# -- kustomizations -----------------------------------------------------------------------------------


def test_kustomizations_list_every_manifest():
    core = load_yaml(K8S_DIR / "kustomization.yaml")
    assert set(core["resources"]) == {p.name for p in CORE_FILES} - {"secret.example.yaml"}
    assert core["namespace"] == "llm-gateway"
    images = {i["name"] for i in core["images"]}
    assert {
        c["image"].split(":")[0]
        for _, d in ALL_DOCS
        if d["kind"] in WORKLOADS
        for c in d["spec"]["template"]["spec"]["containers"]
        if "llm-gateway" in c["image"]
    } <= images
    mon = load_yaml(MONITORING / "kustomization.yaml")
    assert set(mon["resources"]) == {p.name for p in MONITORING.glob("*.yaml")} - {"kustomization.yaml"}
    for _, d in ALL_DOCS:
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "llm-gateway", doc_id((Path(), d))


# -- the gateway Deployment -------------------------------------------------------------------------------


def test_configmap_is_config_kubernetes_yaml_verbatim():
    cm = kinds()["ConfigMap/llm-gateway-config"]
    assert cm["data"]["gateway.yaml"] == K8S_CONFIG.read_text(), (
        "deploy/kubernetes/configmap.yaml is out of date: regenerate it from config/kubernetes.yaml"
    )


def test_three_replicas_with_a_rolling_update_that_keeps_capacity(deployment):
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_config_is_mounted_from_the_configmap_where_the_gateway_reads_it(deployment, container):
    pod = deployment["spec"]["template"]["spec"]
    args = container["args"]
    config_path = args[args.index("--config") + 1]
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/")]
    assert mount.get("readOnly") is True
    assert "subPath" not in mount, "a subPath mount never sees ConfigMap updates (no hot reload)"
    assert volumes[mount["name"]]["configMap"]["name"] == "llm-gateway-config"
    assert config_path[len(mount["mountPath"]) + 1 :] in kinds()["ConfigMap/llm-gateway-config"]["data"]


def test_ports_probes_and_metrics_annotations_match_the_config(deployment, container, gw_config):
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": gw_config.server.port, "metrics": gw_config.server.metrics_port}
    args = container["args"]
    assert int(args[args.index("--port") + 1]) == gw_config.server.port
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"]["path"] == "/healthz"
    ann = deployment["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == gw_config.server.metrics_port
    assert ann["prometheus.io/path"] == "/metrics"
    assert gw_config.server.metrics_on_main_port is False  # /metrics only on the metrics port


def test_termination_grace_period_outlasts_prestop_and_graceful_shutdown(deployment, container, gw_config):
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    pre = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre[0] == "sleep"
    assert grace > int(pre[1]) + gw_config.server.graceful_shutdown_s


def test_security_context_non_root_read_only_no_capabilities(deployment):
    workloads = [d for _, d in ALL_DOCS if d["kind"] in WORKLOADS]
    assert {"Deployment/llm-gateway", "Deployment/llm-gateway-redis", POSTGRES} <= {
        f"{d['kind']}/{d['metadata']['name']}" for d in workloads
    }
    for d in workloads:
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        assert pod["automountServiceAccountToken"] is False
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            res = c["resources"]
            assert {"cpu", "memory"} <= res["requests"].keys() and {"cpu", "memory"} <= res["limits"].keys()
            assert c["readinessProbe"] and c["livenessProbe"], c["name"]
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001  # the image's user


def test_secrets_come_from_the_secret_as_environment(container):
    (ref,) = container["envFrom"]
    secret = next(d for d in load_yaml_docs(K8S_DIR / "secret.example.yaml") if d["kind"] == "Secret")
    assert ref["secretRef"]["name"] == secret["metadata"]["name"]
    referenced = set(re.findall(r"\$\{([A-Z0-9_]+)", K8S_CONFIG.read_text()))
    provided = {k for k in secret["stringData"]}
    assert provided <= referenced, f"the Secret example sets variables the config never reads: {provided - referenced}"
    assert {k for k in referenced if k.endswith("_SHA256")} <= provided
    env_values = [e.get("value", "") for e in container.get("env", [])]
    assert not [v for v in env_values if re.search(r"sk-|[0-9a-f]{64}", v)], "no secret inline in the Deployment"


def test_service_pdb_and_servicemonitor_select_the_gateway_pods(deployment):
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    svc = kinds()["Service/llm-gateway"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert {p["name"]: p["targetPort"] for p in svc["spec"]["ports"]} == {"http": "http", "metrics": "metrics"}
    pdb = kinds()["PodDisruptionBudget/llm-gateway"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["spec"]["maxUnavailable"] == 1
    (sm,) = load_yaml_docs(MONITORING / "servicemonitor.yaml")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {e["port"] for e in sm["spec"]["endpoints"]} == {"metrics"}
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    # the operator names the job after the Service: the alert rules' up{job="llm-gateway"}
    assert svc["metadata"]["name"] == "llm-gateway"


def test_redis_service_is_the_config_default_and_only_gateways_reach_it(gw_config, deployment):
    url = urlsplit(gw_config.limits.redis_url.get_secret_value())
    svc = kinds()[f"Service/{url.hostname}"]
    assert url.port == svc["spec"]["ports"][0]["port"]
    redis_pods = kinds()["Deployment/llm-gateway-redis"]["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= redis_pods.items()
    np = kinds()["NetworkPolicy/llm-gateway-redis"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= redis_pods.items()
    (rule,) = np["spec"]["ingress"]
    gw_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= gw_labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": url.port}]


# -- the database: a shared Postgres, and the SQLite fallback's writable /data ------------------------------

TEST_DB_URL = "postgresql+asyncpg://llm_gateway:pw@llm-gateway-postgres:5432/llm_gateway"


def test_gateway_mounts_a_writable_data_dir(deployment, container):
    """The root filesystem is read-only: without DATABASE_URL the gateway opens its SQLite file in the
    image's data dir, which must be a writable volume (not the image's directory), owned through fsGroup."""
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    data_dir = env.get("GATEWAY_SERVER__DATA_DIR") or image_data_dir()
    pod = deployment["spec"]["template"]["spec"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert data_dir in mounts, f"nothing is mounted at the gateway's data dir {data_dir}"
    assert not mounts[data_dir].get("readOnly") and "subPath" not in mounts[data_dir]
    volume = {v["name"]: v for v in pod["volumes"]}[mounts[data_dir]["name"]]
    assert "emptyDir" in volume or "persistentVolumeClaim" in volume, volume
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]


def test_gateway_database_url_comes_from_database_url(gw_config):
    """Unset: the SQLite fallback (each pod its own); set from the Secret: the shared Postgres."""
    assert gw_config.database.url is None
    assert load_config(K8S_CONFIG, env={"DATABASE_URL": ""}).database.url is None
    cfg = load_config(K8S_CONFIG, env={"DATABASE_URL": TEST_DB_URL})
    assert cfg.database.url is not None and cfg.database.url.get_secret_value() == TEST_DB_URL
    header = K8S_CONFIG.read_text().split("\nserver:", 1)[0]
    assert "DATABASE_URL" in header, "the Secret comment block of config/kubernetes.yaml documents DATABASE_URL"
    assert "DATABASE_URL" in (DEPLOY / "README.md").read_text()


def _postgres_env(sts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e for e in c["env"]}


def test_postgres_is_one_pinned_non_root_statefulset_with_a_volume_claim():
    docs = kinds()
    assert {POSTGRES, "Service/llm-gateway-postgres"} <= docs.keys()
    sts = docs[POSTGRES]
    spec = sts["spec"]
    assert spec["replicas"] == 1
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    name, _, tag = c["image"].partition(":")
    assert name == "postgres" and re.match(r"\d+\.\d+", tag), "the official image at a pinned version"
    assert pod["securityContext"]["runAsUser"] == 999 and pod["securityContext"]["fsGroup"] == 999
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert c[probe]["exec"]["command"][0] == "pg_isready", probe
    # PGDATA lives on the claim, one level down (initdb wants a directory it owns, mode 0700)
    (claim,) = spec["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["resources"]["requests"]["storage"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    pgdata = _postgres_env(sts)["PGDATA"]["value"]
    assert pgdata.startswith(mounts[claim["metadata"]["name"]] + "/")
    # read-only root filesystem: the socket directory and /tmp are volumes
    assert {"/var/run/postgresql", "/tmp"} <= set(mounts.values())
    # the password from a Secret key, never inline
    ref = _postgres_env(sts)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    secrets = {d["metadata"]["name"]: d for d in load_yaml_docs(K8S_DIR / "secret.example.yaml")}
    assert ref["key"] in secrets[ref["name"]]["stringData"]
    assert not [e for e in _postgres_env(sts).values() if "PASSWORD" in e["name"] and "value" in e]


def test_postgres_service_matches_database_url_and_only_gateways_reach_it(deployment):
    sts = kinds()[POSTGRES]
    secret = next(d for d in load_yaml_docs(K8S_DIR / "secret.example.yaml") if d["kind"] == "Secret")
    url = urlsplit(secret["stringData"]["DATABASE_URL"])
    assert url.scheme == "postgresql+asyncpg"
    svc = kinds()[f"Service/{url.hostname}"]
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    pg_pods = sts["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pg_pods.items()
    (port,) = svc["spec"]["ports"]
    (c,) = sts["spec"]["template"]["spec"]["containers"]
    assert url.port == port["port"] == {p["name"]: p["containerPort"] for p in c["ports"]}[port["targetPort"]]
    env = _postgres_env(sts)
    assert url.username == env["POSTGRES_USER"]["value"] and url.path == "/" + env["POSTGRES_DB"]["value"]
    np = kinds()["NetworkPolicy/llm-gateway-postgres"]
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pg_pods.items()
    (rule,) = np["spec"]["ingress"]
    gw_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= gw_labels.items()
    assert rule["ports"] == [{"protocol": "TCP", "port": url.port}]
