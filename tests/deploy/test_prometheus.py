"""deploy/prometheus with the real promtool: the config and rules load, the alert rules behave as
intended on synthetic series (promtool test rules), and the Grafana dashboard's queries are valid
PromQL (checked by promtool as recording rules)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.deploy._tools import (
    DASHBOARD,
    PROM_DIR,
    alert_rules,
    dashboard_exprs,
    grafana_to_promql,
    load_json,
    promtool,
    run,
)

UNIT_TESTS = Path(__file__).resolve().parent / "promtool" / "alerts_test.yml"


def test_promtool_check_config():
    out = run([promtool(), "check", "config", str(PROM_DIR / "prometheus.yml")])
    assert "SUCCESS" in out.stdout


def test_promtool_check_rules():
    out = run([promtool(), "check", "rules", str(PROM_DIR / "alerts.yml")])
    assert "SUCCESS" in out.stdout


def test_promtool_rule_unit_tests():
    out = run([promtool(), "test", "rules", str(UNIT_TESTS)])
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_unit_test_severity_and_text():
    tested = {
        t["alertname"] for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"] for t in case["alert_rule_test"]
    }
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], rule["alert"]
    untested = {r["alert"] for r in alert_rules()} - tested - {"LLMGatewayEngineQueueHigh", "LLMGatewayOverheadHigh"}
    assert not untested, f"alerts without a promtool unit test: {untested}"


def test_dashboard_queries_are_valid_promql(tmp_path: Path):
    """promtool parses every dashboard query (Grafana variables filled in) as a recording rule."""
    exprs = dashboard_exprs(load_json(DASHBOARD))
    assert len(exprs) >= 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = run([promtool(), "check", "rules", str(path)], check=False)
    assert out.returncode == 0, out.stdout + out.stderr
