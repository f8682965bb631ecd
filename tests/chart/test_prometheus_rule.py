"""The chart's PrometheusRule: off by default, and every series it alerts on is one the operator
exports, with the labels the rule groups by."""

from __future__ import annotations

import re
from typing import Any

import pytest
from chartlib import CHART, Helm, select

from kvretention.controller.metrics import FLEET_LABELS, Metrics


def _rules(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    (rule,) = select(docs, "PrometheusRule")
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


@pytest.mark.parametrize("enabled", [False, True])
def test_prometheus_rule_toggle(helm: Helm, enabled: bool) -> None:
    docs = helm.template(
        {"metrics": {"prometheusRule": {"enabled": enabled, "labels": {"release": "prom"}}}}
    )
    rules = select(docs, "PrometheusRule")
    assert len(rules) == int(enabled)
    if enabled:
        assert rules[0]["apiVersion"] == "monitoring.coreos.com/v1"
        assert rules[0]["metadata"]["labels"]["release"] == "prom"


def test_rule_values_reach_the_alerts(helm: Helm) -> None:
    docs = helm.template(
        {
            "metrics": {
                "prometheusRule": {
                    "enabled": True,
                    "for": "5m",
                    "metricsDownFor": "1h",
                    "severity": "critical",
                }
            }
        }
    )
    rules = _rules(docs)
    assert set(rules) == {"KvRetentionPinsOverBudget", "KvRetentionKvStoreMetricsDown"}
    assert rules["KvRetentionPinsOverBudget"]["for"] == "5m"
    assert rules["KvRetentionKvStoreMetricsDown"]["for"] == "1h"
    assert {r["labels"]["severity"] for r in rules.values()} == {"critical"}


def test_alerts_use_only_series_the_operator_exports(helm: Helm) -> None:
    rules = _rules(helm.template({"metrics": {"prometheusRule": {"enabled": True}}}))
    exported = {family.name for family in Metrics().registry.collect()}
    for rule in rules.values():
        names = set(re.findall(r"\bkvretention_[a-z_]+", rule["expr"]))
        assert names and names <= exported, rule["expr"]
        for grouping in re.findall(r"(?:by|on) \(([^)]*)\)", rule["expr"]):
            assert tuple(x.strip() for x in grouping.split(",")) == FLEET_LABELS
        for text in rule["annotations"].values():
            for label in re.findall(r"\$labels\.([a-z_]+)", text):
                assert label in FLEET_LABELS


@pytest.mark.parametrize(
    "values",
    [
        {"metrics": {"prometheusRule": {"for": "soon"}}},
        {"metrics": {"prometheusRule": {"severity": ""}}},
        {"metrics": {"prometheusRule": {"unknown": True}}},
    ],
    ids=["bad-duration", "empty-severity", "unknown-key"],
)
def test_bad_rule_values_are_rejected(helm: Helm, values: dict[str, Any]) -> None:
    assert "prometheusRule" in helm.template_error(values)


def test_helm_lint_strict_with_the_rule(helm: Helm) -> None:
    done = helm.run("lint", str(CHART), "--strict", "--set", "metrics.prometheusRule.enabled=true")
    assert "0 chart(s) failed" in done.stdout
