"""deploy/prometheus/alerts.yaml: valid for Prometheus (`promtool check rules`), each alert
fires on the series that should raise it and not on a healthy system (`promtool test
rules`), and every expression, the dashboard's too, groups, matches and joins only on labels
the metrics carry (parsed with promql-parser, the metrics read from the code)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.promql_labels import defined_metrics, series_labels

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "alerts.test.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "webctx-dashboard.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not installed (Debian: apt-get install prometheus; or the release "
    "tarball from prometheus.io): the alert rules are checked statically only",
)


def alert_rules() -> list[dict[str, str]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def promtool(*args: str) -> str:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=RULES.parent, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    out = promtool("check", "rules", RULES.name)
    assert f"SUCCESS: {len(alert_rules())} rules found" in out


@needs_promtool
def test_each_alert_fires_on_its_trouble_and_not_on_a_healthy_system() -> None:
    promtool("test", "rules", RULES_TEST.name)


def test_the_rules_test_covers_every_alert_firing_and_silent() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    checks = [check for test in tests for check in test["alert_rule_test"]]
    names = {rule["alert"] for rule in alert_rules()}
    assert {c["alertname"] for c in checks if c["exp_alerts"]} == names
    assert {c["alertname"] for c in checks if not c["exp_alerts"]} == names


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_joins_and_matches_only_labels_the_metrics_carry(rule: dict[str, str]) -> None:
    labels = series_labels(rule["expr"], defined_metrics())
    assert labels is not None, "an alert needs a vector"
    for template in rule.get("annotations", {}).values():
        for name in _template_labels(template):
            assert name in labels, f"{name!r} is not a label of the alert's series {labels}"


def test_every_dashboard_query_uses_labels_the_metrics_carry() -> None:
    metrics = defined_metrics()
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            series_labels(target["expr"], metrics)


def test_the_label_check_refuses_the_join_that_could_never_fire() -> None:
    # The "no workers on a queue" alert as first written: a queue label against a stage label.
    old = "webctx_queue_depth > 0 and sum by (stage) (rate(webctx_tasks_total[10m])) == 0"
    with pytest.raises(AssertionError, match="matches on all labels"):
        series_labels(old, defined_metrics())
    with pytest.raises(AssertionError, match="no label 'queue'"):
        series_labels('rate(webctx_source_failures_total{queue="x"}[5m])', defined_metrics())
    with pytest.raises(AssertionError, match=r"on\(stage\)"):
        series_labels("webctx_queue_depth > on (stage) webctx_tasks_total", defined_metrics())


def test_operations_doc_points_at_the_rules_file_instead_of_copying_them() -> None:
    doc = (ROOT / "docs" / "operations.md").read_text()
    assert "deploy/prometheus/alerts.yaml" in doc
    for rule in alert_rules():
        assert rule["alert"] in doc
        assert rule["expr"].strip() not in doc


def _template_labels(template: str) -> list[str]:
    return re.findall(r"\$labels\.(\w+)", template)
