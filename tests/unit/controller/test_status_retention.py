"""RetentionApplied: the operator's wiring plus every worker pod's probe report -> applied or why not,
and what it does to Ready under hints.policy Required and Optional."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import replace
from typing import Any

import pytest

from kvretention.api.models import KvRetentionDeploymentStatus
from kvretention.controller.conditions import PROBLEM_REASONS
from kvretention.controller.probe_reports import check_retention_applied, parse_probe_report
from kvretention.controller.resources.sglang_args import RetentionWiring
from kvretention.controller.status import Fleet, Observed, compute_status, transitions
from kvretention.controller.worker_metrics import HookIncrease
from support.sample_probe_reports import old_engine

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=5)
LABEL = "app.kubernetes.io/component"
GOOD_REPORT: dict[str, Any] = {
    "schema": 1,
    "sglang_version": "0.5.23",
    "kv_hints_parameter": True,
    "dialect": "versioned",
    "usable_for_hints": True,
}
OLD_ENGINE_REPORT = old_engine(GOOD_REPORT)


def deployment(name: str, component: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {LABEL: component}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {LABEL: component}}},
    }


AGGREGATED = [
    deployment("f-frontend", "frontend"),
    deployment("f-router", "router"),
    deployment("f-worker", "worker"),
    deployment("f-mooncake", "mooncake-master"),
]
ALL_READY = {
    m["metadata"]["name"]: {
        "metadata": {"name": m["metadata"]["name"], "generation": 1},
        "status": {
            "replicas": 1,
            "readyReplicas": 1,
            "updatedReplicas": 1,
            "availableReplicas": 1,
            "observedGeneration": 1,
        },
    }
    for m in AGGREGATED
}


def pod(name: str, message: str) -> dict[str, Any]:
    probe = {"name": "probe", "state": {"terminated": {"exitCode": 0, "message": message}}}
    return {"metadata": {"name": name}, "status": {"initContainerStatuses": [probe]}}


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


OLD_PROBE = GOOD_REPORT
"""A usable engine's report from a probe that predates the retention plugin (no retention keys)."""
LOADED = {**GOOD_REPORT, "retention_plugin": "loaded", "retention_target_problems": []}
NOT_INSTALLED = {
    **GOOD_REPORT,
    "retention_plugin": "not_installed",
    "retention_error": "no entry point 'kvretention' in group sglang.srt.plugins",
}
NO_FRAMEWORK = {
    **GOOD_REPORT,
    "retention_plugin": "unsupported",
    "retention_error": "SGLang has no plugin framework here: ModuleNotFoundError",
}
NOT_SELECTED = {
    **GOOD_REPORT,
    "retention_plugin": "not_selected",
    "retention_error": "SGLANG_PLUGINS='vendor' does not list 'kvretention'",
}
LOAD_FAILED = {
    **GOOD_REPORT,
    "retention_plugin": "load_failed",
    "retention_error": "loading the entry point: ImportError: cannot import name 'x'",
}
TARGETS_MISSING = {
    **LOADED,
    "retention_target_problems": [
        "sglang.srt.mem_cache.radix_cache.RadixCache.checkpoint: not found (AttributeError)",
        "sglang.srt.mem_cache.utils.get_eviction_strategy: parameters ('policy',)",
    ],
}
FUTURE_STATE = {**GOOD_REPORT, "retention_plugin": "hot_reloaded"}

HINTS_ON = RetentionWiring(hints=True)
HINTS_OFF = RetentionWiring()
OVERRIDDEN = RetentionWiring(
    hints=True,
    blocked_reason="EvictionPolicyOverridden",
    blocked_message="spec.workers.aggregated.extraArgs sets --radix-eviction-policy lru",
)
DESELECTED = RetentionWiring(
    hints=True,
    blocked_reason="PluginNotSelected",
    blocked_message="spec.workers.pod.env[0] sets SGLANG_PLUGINS to 'vendor'",
)


def pods(*reports: dict[str, Any] | str) -> list[dict[str, Any]]:
    return [
        pod(f"f-worker-{i}", r if isinstance(r, str) else json.dumps(r))
        for i, r in enumerate(reports)
    ]


def verdict(wiring: RetentionWiring, *reports: dict[str, Any] | str) -> tuple[str, str, str]:
    parsed = [parse_probe_report(p) for p in pods(*reports)]
    v = check_retention_applied([r for r in parsed if r is not None], wiring)
    return v.status, v.reason, v.message


@pytest.mark.parametrize(
    ("wiring", "reports", "status", "reason", "fragment"),
    [
        (HINTS_OFF, [LOADED], "False", "HintsOff", "no request carries kv.retain"),
        (HINTS_OFF, [], "False", "HintsOff", "every hints.providers switch is off"),
        (OVERRIDDEN, [LOADED], "False", "EvictionPolicyOverridden", "--radix-eviction-policy lru"),
        (DESELECTED, [LOADED], "False", "PluginNotSelected", "SGLANG_PLUGINS to 'vendor'"),
        (HINTS_ON, [], "Unknown", "ProbePending", "no worker pod has reported"),
        (HINTS_ON, ["{not json", LOADED], "Unknown", "ProbeReportInvalid", "f-worker-0"),
        (HINTS_ON, [LOADED, LOADED], "True", "Applied", "--radix-eviction-policy kvretain"),
        (HINTS_ON, [OLD_PROBE], "False", "TransportOnly", "probe predates the retention plugin"),
        (HINTS_ON, [NOT_INSTALLED], "False", "TransportOnly", "plugin is not installed: no entry"),
        (HINTS_ON, [NO_FRAMEWORK], "False", "TransportOnly", "unsupported: SGLang has no plugin"),
        (HINTS_ON, [NOT_SELECTED], "False", "PluginNotSelected", "SGLANG_PLUGINS='vendor'"),
        (HINTS_ON, [LOAD_FAILED], "False", "PluginLoadFailed", "ImportError: cannot import"),
        (HINTS_ON, [TARGETS_MISSING], "False", "HookTargetsMissing", "checkpoint: not found"),
        (HINTS_ON, [TARGETS_MISSING], "False", "HookTargetsMissing", "(and 1 more)"),
        (HINTS_ON, [OLD_ENGINE_REPORT], "False", "KvHintsNotAccepted", "sglang 0.4.9 takes no"),
        (HINTS_ON, [FUTURE_STATE], "Unknown", "UnknownPluginState", "'hot_reloaded'"),
        (HINTS_ON, [LOADED, NOT_INSTALLED], "False", "TransportOnly", "pod f-worker-1"),
    ],
    ids=[
        "hints-off",
        "hints-off-no-pods",
        "policy-overridden",
        "plugin-left-out-by-spec",
        "probe-pending",
        "report-invalid",
        "applied",
        "old-probe",
        "stock-image",
        "no-plugin-framework",
        "left-out-by-image-env",
        "load-failed",
        "targets-missing",
        "targets-missing-counted",
        "no-kv-hints",
        "unknown-state",
        "one-pod-without",
    ],
)
def test_retention_applied(
    wiring: RetentionWiring,
    reports: list[dict[str, Any] | str],
    status: str,
    reason: str,
    fragment: str,
) -> None:
    got_status, got_reason, message = verdict(wiring, *reports)
    assert (got_status, got_reason) == (status, reason)
    assert fragment in message


def fleet(wiring: RetentionWiring, *, required: bool) -> Fleet:
    return Fleet(
        name="f",
        namespace="ns",
        generation=1,
        hints_required=required,
        desired=AGGREGATED,
        retention=wiring,
    )


@pytest.mark.parametrize(
    ("wiring", "required", "reports", "ready", "retention"),
    [
        (HINTS_ON, True, [LOADED], ("True", "Ready"), ("True", "Applied")),
        (HINTS_ON, False, [LOADED], ("True", "Ready"), ("True", "Applied")),
        (HINTS_ON, True, [NOT_INSTALLED], ("False", "TransportOnly"), ("False", "TransportOnly")),
        (HINTS_ON, False, [NOT_INSTALLED], ("True", "Ready"), ("False", "TransportOnly")),
        (HINTS_ON, True, [TARGETS_MISSING], ("False", "HookTargetsMissing"), None),
        (OVERRIDDEN, True, [LOADED], ("False", "EvictionPolicyOverridden"), None),
        (OVERRIDDEN, False, [LOADED], ("True", "Ready"), None),
        (HINTS_ON, True, [], ("False", "ProbePending"), ("Unknown", "ProbePending")),
        (HINTS_ON, False, [], ("True", "ReadyWithoutKvHints"), ("Unknown", "ProbePending")),
        # The transport check speaks first: its reason is the one that names the cause.
        (HINTS_ON, True, [OLD_ENGINE_REPORT], ("False", "EngineLacksKvHints"), None),
        # A fleet object with policy Required and hints off is impossible (CEL); as a status
        # input it only keeps the transport check.
        (HINTS_OFF, True, [OLD_PROBE], ("True", "Ready"), ("False", "HintsOff")),
    ],
    ids=[
        "required-applied",
        "optional-applied",
        "required-transport-only",
        "optional-transport-only",
        "required-targets-missing",
        "required-overridden",
        "optional-overridden",
        "required-pending",
        "optional-pending",
        "required-no-kv-hints",
        "hints-off",
    ],
)
def test_ready_needs_retention_only_under_required(
    wiring: RetentionWiring,
    required: bool,
    reports: list[dict[str, Any]],
    ready: tuple[str, str],
    retention: tuple[str, str] | None,
) -> None:
    status = compute_status(
        fleet(wiring, required=required),
        Observed(deployments=ALL_READY, worker_pods=pods(*reports)),
        previous=None,
        now=T0,
    )
    got = conditions(status)
    assert got["Ready"] == ready
    if retention is not None:
        assert got["RetentionApplied"] == retention
    KvRetentionDeploymentStatus.model_validate(status)


def test_ready_says_when_kv_retain_is_not_applied() -> None:
    observed = Observed(deployments=ALL_READY, worker_pods=pods(NOT_INSTALLED))
    status = compute_status(fleet(HINTS_ON, required=False), observed, previous=None, now=T0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"].endswith("kv.retain is not applied (RetentionApplied TransportOnly)")
    applied = Observed(deployments=ALL_READY, worker_pods=pods(LOADED))
    status = compute_status(fleet(HINTS_ON, required=False), applied, previous=None, now=T0)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"].endswith("accepts kv_hints and applies kv.retain")


def test_engine_status_names_the_plugin_state_and_problems() -> None:
    observed = Observed(deployments=ALL_READY, worker_pods=pods(TARGETS_MISSING))
    status = compute_status(fleet(HINTS_ON, required=False), observed, previous=None, now=T0)
    assert status["engine"]["retentionPlugin"] == "loaded"
    assert status["engine"]["hookTargetProblems"] == TARGETS_MISSING["retention_target_problems"]
    old = Observed(deployments=ALL_READY, worker_pods=pods(OLD_PROBE, FUTURE_STATE))
    status = compute_status(fleet(HINTS_ON, required=False), old, previous=None, now=T0)
    assert "retentionPlugin" not in status["engine"]
    assert "hookTargetProblems" not in status["engine"]


@pytest.mark.parametrize(
    ("reason", "problem"),
    [
        ("TransportOnly", True),
        ("PluginNotSelected", True),
        ("PluginLoadFailed", True),
        ("HookTargetsMissing", True),
        ("EvictionPolicyOverridden", True),
        ("HintsOff", False),
        ("KvHintsNotAccepted", False),  # KvHintsSupported warns already
        ("ProbePending", False),
    ],
)
def test_which_reasons_warn(reason: str, problem: bool) -> None:
    assert (reason in PROBLEM_REASONS) is problem


def test_a_stock_image_warns_once_and_an_upgrade_flips_it() -> None:
    stock = Observed(deployments=ALL_READY, worker_pods=pods(NOT_INSTALLED))
    first = compute_status(fleet(HINTS_ON, required=False), stock, previous=None, now=T0)
    posted = transitions(None, first)
    assert [(c["type"], c["reason"]) for c in posted] == [("RetentionApplied", "TransportOnly")]
    assert (
        transitions(
            first, compute_status(fleet(HINTS_ON, required=False), stock, previous=first, now=T1)
        )
        == []
    )
    upgraded = Observed(deployments=ALL_READY, worker_pods=pods(LOADED))
    after = compute_status(fleet(HINTS_ON, required=False), upgraded, previous=first, now=T1)
    assert [(c["type"], c["reason"]) for c in transitions(first, after)] == [
        ("RetentionApplied", "Applied")
    ]


@pytest.mark.parametrize(
    ("budget", "reports", "enforced"),
    [
        pytest.param(0.5, [LOADED], True, id="plugin-applied-enforces"),
        pytest.param(0.5, [NOT_INSTALLED], False, id="stock-image-observes-only"),
        pytest.param(0.5, [LOADED, NOT_INSTALLED], False, id="one-pod-without-observes-only"),
        pytest.param(0.5, [], None, id="probe-pending-says-nothing"),
        pytest.param(None, [LOADED], None, id="no-budget-nothing-to-enforce"),
    ],
)
def test_kvstore_status_says_whether_the_budget_is_enforced_or_observed(
    budget: float | None, reports: list[dict[str, Any]], enforced: bool | None
) -> None:
    status = compute_status(
        replace(fleet(HINTS_ON, required=False), retention_budget=budget),
        Observed(deployments=ALL_READY, worker_pods=pods(*reports)),
        previous=None,
        now=T0,
    )
    assert status["kvStore"].get("budgetEnforced") == enforced
    KvRetentionDeploymentStatus.model_validate(status)


CHECKPOINT_FAILED = (HookIncrease("f-worker-0", "checkpoint", 2),)


@pytest.mark.parametrize(
    ("wiring", "required", "reports", "failures", "ready", "retention"),
    [
        (
            HINTS_ON,
            False,
            [LOADED],
            CHECKPOINT_FAILED,
            ("True", "Ready"),
            ("False", "HookFailures"),
        ),
        (
            HINTS_ON,
            True,
            [LOADED],
            CHECKPOINT_FAILED,
            ("False", "HookFailures"),
            ("False", "HookFailures"),
        ),
        # Flat counters (no increase since the last reading): applied again.
        (HINTS_ON, False, [LOADED], (), ("True", "Ready"), ("True", "Applied")),
        # A plugin that is not applied says so first: its failures are beside the point.
        (
            HINTS_ON,
            False,
            [NOT_INSTALLED],
            CHECKPOINT_FAILED,
            ("True", "Ready"),
            ("False", "TransportOnly"),
        ),
        (HINTS_OFF, False, [LOADED], CHECKPOINT_FAILED, ("True", "Ready"), ("False", "HintsOff")),
    ],
    ids=["optional", "required", "flat", "not-applied-first", "hints-off"],
)
def test_hook_failures_since_the_last_reading(
    wiring: RetentionWiring,
    required: bool,
    reports: list[dict[str, Any]],
    failures: tuple[HookIncrease, ...],
    ready: tuple[str, str],
    retention: tuple[str, str],
) -> None:
    observed = Observed(deployments=ALL_READY, worker_pods=pods(*reports), hook_failures=failures)
    status = compute_status(fleet(wiring, required=required), observed, previous=None, now=T0)
    got = conditions(status)
    assert got["Ready"] == ready
    assert got["RetentionApplied"] == retention
    KvRetentionDeploymentStatus.model_validate(status)


def test_hook_failures_name_pods_and_hooks_and_warn_once() -> None:
    failing = Observed(
        deployments=ALL_READY,
        worker_pods=pods(LOADED, LOADED),
        hook_failures=(
            HookIncrease("f-worker-0", "checkpoint", 2),
            HookIncrease("f-worker-1", "l3_put", 1),
        ),
    )
    healthy = Observed(deployments=ALL_READY, worker_pods=pods(LOADED, LOADED))
    budgeted = replace(fleet(HINTS_ON, required=False), retention_budget=0.5)
    first = compute_status(budgeted, healthy, previous=None, now=T0)
    failed = compute_status(budgeted, failing, previous=first, now=T1)
    applied = next(c for c in failed["conditions"] if c["type"] == "RetentionApplied")
    assert "pod f-worker-0: checkpoint 2 (KV left unretained)" in applied["message"]
    assert "pod f-worker-1: l3_put 1 (pages written unpinned)" in applied["message"]
    ready = next(c for c in failed["conditions"] if c["type"] == "Ready")
    assert ready["message"].endswith("(RetentionApplied HookFailures)")
    assert [(c["type"], c["reason"]) for c in transitions(first, failed)] == [
        ("RetentionApplied", "HookFailures")
    ]
    # The budget stays enforced: the plugin is wired and loaded, its guard only fell back.
    assert failed["kvStore"]["budgetEnforced"] is True
    again = compute_status(budgeted, healthy, previous=failed, now=T1)
    assert conditions(again)["RetentionApplied"] == ("True", "Applied")
    assert [(c["type"], c["reason"]) for c in transitions(failed, again)] == [
        ("RetentionApplied", "Applied")
    ]


def test_hook_failures_warn() -> None:
    assert "HookFailures" in PROBLEM_REASONS
