"""The gateway's /metrics after real traffic: accepted by `promtool check metrics`, and holding every
series the Grafana dashboard and the alert rules query."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy._tools import (
    DASHBOARD,
    alert_rules,
    dashboard_exprs,
    grafana_to_promql,
    load_json,
    metric_names,
    promtool,
    run,
    samples_by_name,
)

PROMETHEUS_OWN = {"up"}  # made by Prometheus for every target, not exported by the gateway


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_json(DASHBOARD)


def test_promtool_check_metrics_accepts_the_exposition(gateway_metrics_text: str):
    out = run([promtool(), "check", "metrics"], input=gateway_metrics_text, check=False)
    assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), out.stdout + out.stderr


def test_every_metric_family_has_samples_after_the_traffic(gateway_metrics_text: str):
    """The traffic touches every family the gateway declares, so none is silently never exported."""
    samples = samples_by_name(gateway_metrics_text)
    families = re.findall(r"^# TYPE (\S+) (\S+)$", gateway_metrics_text, re.M)
    assert len(families) >= 20
    empty = [name for name, _ in families if not any(s == name or s.startswith(name + "_") for s in samples)]
    assert not empty, f"metric families without samples: {empty}"


def test_dashboard_metrics_exist_in_the_gateway_output(dashboard, gateway_metrics_text: str):
    exported = set(samples_by_name(gateway_metrics_text))
    used: dict[str, set[str]] = {}
    for title, expr in dashboard_exprs(dashboard):
        for name in metric_names(grafana_to_promql(expr)):
            used.setdefault(name, set()).add(title)
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            used.setdefault(re.search(r"label_values\((\w+)", var["definition"]).group(1), set()).add(var["name"])
    unknown = {n: sorted(t) for n, t in used.items() if n not in exported}
    assert not unknown, f"dashboard queries series the gateway does not export: {unknown}"
    assert len(used) >= 15


def test_alert_rule_metrics_exist_in_the_gateway_output(gateway_metrics_text: str):
    exported = set(samples_by_name(gateway_metrics_text)) | PROMETHEUS_OWN
    for rule in alert_rules():
        unknown = metric_names(rule["expr"]) - exported
        assert not unknown, f"{rule['alert']} reads series the gateway does not export: {unknown}"


def test_dashboard_has_the_panels_operators_need(dashboard):
    exprs = [grafana_to_promql(e) for _, e in dashboard_exprs(dashboard)]

    def has(*parts: str) -> bool:
        return any(all(p in e for p in parts) for e in exprs)

    assert has("rate(gateway_requests_total")
    assert has('status_class="5xx"') and has('outcome!="success"')
    for q in ("0.5", "0.95"):
        assert has(f"histogram_quantile({q}", "gateway_time_to_first_token_seconds_bucket")
        assert has(f"histogram_quantile({q}", "gateway_inter_token_latency_seconds_bucket")
    for q in ("0.5", "0.99"):
        assert has(f"histogram_quantile({q}", "gateway_overhead_seconds_bucket")
    assert has("sum by (model, backend) (rate(gateway_completion_tokens_total")
    assert has("sum by (backend) (gateway_in_flight_requests")
    assert has("gateway_backend_requests_waiting") and has("gateway_deployment_queue_length")
    assert has("gateway_ratelimit_rejections_total")
    assert has("gateway_backend_state") and has("gateway_backend_up")
    assert has("gateway_breaker_state")


def test_dashboard_is_well_formed(dashboard):
    assert dashboard["uid"] == "llm-gateway" and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids: list[int] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            ids.append(p["id"])
            g = p["gridPos"]
            assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
            if p["type"] != "row":
                assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
                assert p["targets"], p["title"]
                for t in p["targets"]:
                    assert t["datasource"] == p["datasource"], p["title"]
                    for var in re.findall(r"\$\{?(\w+)", t["expr"]):
                        assert var.startswith("__") or var in variables, f"{p['title']}: unknown variable ${var}"
            walk(p.get("panels", []))

    walk(dashboard["panels"])
    assert len(ids) == len(set(ids)), "panel ids must be unique"
