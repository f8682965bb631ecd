"""``kvretention_operator_fleet_condition``: one series per fleet and condition type, labelled with
its current status and reason; a change replaces the series, a deleted fleet leaves none."""

from __future__ import annotations

from typing import Any

import pytest

from kvretention.controller.metrics import Metrics

NAME = "kvretention_operator_fleet_condition"


def series(metrics: Metrics) -> set[tuple[str, ...]]:
    (family,) = [f for f in metrics.registry.collect() if f.name == NAME]
    return {
        tuple(s.labels[k] for k in ("fleet_namespace", "fleet", "type", "status", "reason"))
        for s in family.samples
        if s.value == 1
    }


def cond(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "m"}


@pytest.mark.parametrize(
    ("first", "then", "expected"),
    [
        (
            [cond("RetentionApplied", "True", "Applied")],
            [cond("RetentionApplied", "False", "EvictionPolicyOverridden")],
            {("ns", "a", "RetentionApplied", "False", "EvictionPolicyOverridden")},
        ),
        (
            [cond("Ready", "True", "Ready"), cond("KvHintsSupported", "Unknown", "ProbePending")],
            [cond("Ready", "True", "Ready"), cond("KvHintsSupported", "False", "NoKvHints")],
            {
                ("ns", "a", "Ready", "True", "Ready"),
                ("ns", "a", "KvHintsSupported", "False", "NoKvHints"),
            },
        ),
        (
            [cond("Ready", "True", "Ready"), cond("Progressing", "True", "RollingOut")],
            [cond("Ready", "True", "Ready")],
            {("ns", "a", "Ready", "True", "Ready")},
        ),
    ],
    ids=["status-flips", "reason-changes", "type-disappears"],
)
def test_a_change_replaces_the_series(
    first: list[dict[str, Any]], then: list[dict[str, Any]], expected: set[tuple[str, ...]]
) -> None:
    metrics = Metrics()
    metrics.observe_conditions("ns", "b", [cond("Ready", "False", "WorkersNotReady")])
    metrics.observe_conditions("ns", "a", first)
    metrics.observe_conditions("ns", "a", then)
    assert series(metrics) == expected | {("ns", "b", "Ready", "False", "WorkersNotReady")}


def test_a_deleted_fleet_leaves_no_series() -> None:
    metrics = Metrics()
    metrics.observe_conditions("ns", "a", [cond("Ready", "True", "Ready")])
    metrics.observe_conditions("ns", "b", [cond("Ready", "True", "Ready")])
    metrics.forget_conditions("ns", "a")
    assert series(metrics) == {("ns", "b", "Ready", "True", "Ready")}
