"""The chart's PrometheusRule: off by default, values reach the alerts, and every series it alerts on
is one a kvretention process exports, with the labels the rule groups by (the alerts' behaviour is
evaluated by promtool in test_alert_rules.py)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chartlib import ALERTS, CHART, Helm, metrics_toggle, select

from kvretention.controller.metrics import FLEET_LABELS
from support.metric_registries import DATA_PLANE_LABELS, exported_series


def _rules(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = select(docs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


@pytest.mark.parametrize("enabled", [False, True])
def test_prometheus_rule_toggle(helm: Helm, enabled: bool) -> None:
    rules = select(metrics_toggle(helm, "prometheusRule", enabled=enabled), "PrometheusRule")
    assert len(rules) == int(enabled)
    if enabled:
        assert rules[0]["apiVersion"] == "monitoring.coreos.com/v1"
        assert rules[0]["metadata"]["labels"]["release"] == "prom"


@pytest.mark.parametrize(
    ("key", "value", "alert", "field"),
    [
        ("for", "5m", "KvRetentionPinsOverBudget", "for"),
        ("metricsDownFor", "1h", "KvRetentionKvStoreMetricsDown", "for"),
        ("noReadyWorkersFor", "30s", "KvRetentionNoReadyWorkers", "for"),
        ("errorRatioFor", "20m", "KvRetentionErrorRatioHigh", "for"),
        ("hintsUnsupportedFor", "2h", "KvRetentionHintsUnsupported", "for"),
        ("retentionNotAppliedFor", "45m", "KvRetentionRetentionNotApplied", "for"),
        ("hookFailuresFor", "20m", "KvRetentionHookFailures", "for"),
        ("criticalSeverity", "page", "KvRetentionNoReadyWorkers", "severity"),
    ],
)
def test_rule_values_reach_the_alerts(
    helm: Helm, key: str, value: str, alert: str, field: str
) -> None:
    rules = _rules(helm.template({"metrics": {"prometheusRule": {"enabled": True, key: value}}}))
    assert set(rules) == ALERTS
    got = rules[alert]["labels"]["severity"] if field == "severity" else rules[alert][field]
    assert got == value


def test_severity_reaches_every_alert_but_the_critical_one(helm: Helm) -> None:
    values = {"enabled": True, "severity": "ticket", "errorRatio": 0.2}
    rules = _rules(helm.template({"metrics": {"prometheusRule": values}}))
    severities = {name: r["labels"]["severity"] for name, r in rules.items()}
    assert severities == {
        **dict.fromkeys(ALERTS - {"KvRetentionNoReadyWorkers"}, "ticket"),
        "KvRetentionNoReadyWorkers": "critical",
    }
    assert rules["KvRetentionErrorRatioHigh"]["expr"].rstrip().endswith("> 0.2")


def test_alerts_use_only_series_the_processes_export(helm: Helm) -> None:
    rules = _rules(helm.template({"metrics": {"prometheusRule": {"enabled": True}}}))
    exported = exported_series()
    for rule in rules.values():
        names = set(re.findall(r"\bkvretention_[a-z0-9_]+", rule["expr"]))
        assert names and names <= set(exported), rule["expr"]
        carried = set().union(*(exported[name] for name in names))
        grouped = set(FLEET_LABELS)
        for grouping in re.findall(r"(?:by|on) \(([^)]*)\)", rule["expr"]):
            labels = tuple(x.strip() for x in grouping.split(","))
            # per fleet, and further only by labels its series carry (a worker's fast path)
            assert labels[: len(FLEET_LABELS)] == FLEET_LABELS, rule["expr"]
            assert set(labels[len(FLEET_LABELS) :]) <= carried, rule["expr"]
            grouped |= set(labels)
        for name in names:  # fleet labels: the operator's own, or the PodMonitor's relabelings
            assert set(FLEET_LABELS) <= exported[name] | set(DATA_PLANE_LABELS), name
        for text in rule["annotations"].values():
            for label in re.findall(r"\$labels\.([a-z_]+)", text):
                assert label in grouped


@pytest.mark.parametrize(
    "values",
    [
        {"metrics": {"prometheusRule": {"for": "soon"}}},
        {"metrics": {"prometheusRule": {"severity": ""}}},
        {"metrics": {"prometheusRule": {"unknown": True}}},
        {"metrics": {"prometheusRule": {"errorRatio": 0}}},
        {"metrics": {"prometheusRule": {"errorRatio": 1.5}}},
        {"metrics": {"prometheusRule": {"noReadyWorkersFor": "a while"}}},
    ],
    ids=["bad-duration", "empty-severity", "unknown-key", "zero-ratio", "ratio-over-1", "bad-for"],
)
def test_bad_rule_values_are_rejected(helm: Helm, values: dict[str, Any]) -> None:
    assert "prometheusRule" in helm.template_error(values)


def test_helm_lint_strict_with_the_rule(helm: Helm) -> None:
    done = helm.run("lint", str(CHART), "--strict", "--set", "metrics.prometheusRule.enabled=true")
    assert "0 chart(s) failed" in done.stdout
