"""The chart's alerts, evaluated by a real Prometheus rule engine (``promtool test rules``): each
alert fires on its condition, with its labels and rendered annotations, and stays quiet otherwise.

The rules are the chart's own PrometheusRule, rendered with the default values; the input series
are named and labelled as the processes export them (checked against the registries in
tests/observability/test_dashboards.py and test_prometheus_rule.py).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from chartlib import ALERTS, Helm, select

from support.prometheus_bin import prometheus_binary

NS, FLEET = "team-a", "chat"
AT = f'fleet_namespace="{NS}", fleet="{FLEET}"'
LABELS = {"fleet_namespace": NS, "fleet": FLEET}

BUDGET_DESCRIPTION = (
    "Soft-pinned objects hold about {pct} of the pool, past "
    "spec.kvStore.mooncake.master.softPin.budgetRatio. With allowEviction false, pins that reach "
    "the high watermark leave no room for new KV pages. See status.kvStore and the RetentionBudget "
    "condition."
)
NO_WORKERS = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: the router has no ready worker in a pool",
    "description": "Requests are refused with 503 no_workers. See the fleet's Ready condition and "
    f"its worker pods (kubectl get pods -l app.kubernetes.io/instance={FLEET}).",
}
HINTS = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: KV hints are sent but no engine takes them",
    "description": "The frontend attaches kv_hints, and no worker passed one to its engine. See "
    "the KvHintsSupported condition and status.engine; the workers answer kv_hints_unsupported "
    "where the engine's dialect cannot carry the hint.",
}


def healthy(role: str, values: str) -> tuple[str, str]:
    return f'kvretention_router_healthy_workers{{{AT}, role="{role}"}}', values


def requests(outcome: str, values: str) -> tuple[str, str]:
    series = (
        f'kvretention_frontend_requests_total{{{AT}, endpoint="openai_chat", outcome="{outcome}"}}'
    )
    return series, values


def hints(values: str) -> tuple[str, str]:
    series = (
        f'kvretention_frontend_kv_hints_total{{{AT}, endpoint="openai_chat", ttl_seconds="300"}}'
    )
    return series, values


def passed(dialect: str, values: str) -> tuple[str, str]:
    series = (
        f'kvretention_worker_kv_hints_passed_total{{{AT}, component="worker", dialect="{dialect}"}}'
    )
    return series, values


def condition(type_: str, status: str, reason: str, values: str) -> tuple[str, str]:
    series = (
        f'kvretention_operator_fleet_condition{{{AT}, type="{type_}", status="{status}", '
        f'reason="{reason}"}}'
    )
    return series, values


NOT_APPLIED = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: retention hints are not applied",
    "description": "The RetentionApplied condition is False: the workers take kv_hints but do not "
    "retain what they ask for. Its reason and message say why (EvictionPolicyOverridden, "
    "PluginNotSelected, or the plugin failed to load).",
}


def hook_failures(hook: str, fallback: str, values: str) -> tuple[str, str]:
    series = (
        f'kvretention_retention_hook_failures_total{{{AT}, component="worker", hook="{hook}", '
        f'fallback="{fallback}"}}'
    )
    return series, values


HOOK_FAILURES = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: the retention plugin's hooks fail and fall "
    "back",
    "description": "Requests are served, but kv.retain is not applied to them: their KV is evicted "
    "as plain LRU or written to Mooncake unpinned. kvretention_retention_hook_failures_total on "
    "the workers says which hook; the worker log has the exception.",
}


def master_restarts(values: str) -> tuple[str, str]:
    return f'kvretention_l3_master_restarts_total{{{AT}, component="worker"}}', values


MASTER_RESTARTED = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: its Mooncake master restarted and the soft "
    "pins are lost",
    "description": "The workers saw the master's counters go back: every object and soft pin "
    "written before is gone (kvretention_l3_pins_lost_total counts the pinned pages). Prefixes "
    "the workers still hold in GPU or host memory are not written to Mooncake again until SGLang "
    "computes them anew. See the master pod's restarts and the RetentionBudget condition.",
}


def hop_refusals(component: str, reason: str, values: str) -> tuple[str, str]:
    return (
        f'kvretention_{component}_hop_refusals_total{{{AT}, component="{component}", '
        f'reason="{reason}"}}',
        values,
    )


HOP_REFUSED = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: requests reached a router or worker without "
    "the frontend's signature on their tenant",
    "description": "kvretention_router_hop_refusals_total / kvretention_worker_hop_refusals_total "
    "by reason: missing or invalid means a peer inside the cluster called the router or a worker "
    "directly (or a frontend without the hop key); stale means a clock more than 60 s off; "
    "invalid on every request means keys out of step (docs/auth.md, rotating the hop key).",
}


def pins_dropped(pod: str, values: str) -> tuple[str, str]:
    return f'kvretention_worker_radix_pins_dropped_total{{{AT}, pod="{pod}"}}', values


PINS_DROPPED = {
    "summary": f"KvRetentionDeployment {NS}/{FLEET}: the workers' radix pin budget leaves "
    "retained prefixes out",
    "description": "kv.retain holds did not fit the pins' budget "
    '(kvretention_worker_radix_pinned_tokens kind="budget", half the KV pool by default) and are '
    "evicted as LRU evicts them. Raise spec.workers.radixPinRatio, give the workers "
    "a larger KV pool, or shorten the retention TTLs (docs/retention.md).",
}


def fast_path(pod: str, path: str, values: str) -> tuple[str, str]:
    return f'kvretention_worker_fast_path_enabled{{{AT}, pod="{pod}", path="{path}"}}', values


def fast_path_off(path: str) -> dict[str, Any]:
    """The alert for one path: it carries the path among its labels."""
    return {
        "labels": {**LABELS, "path": path, "severity": "warning"},
        "annotations": {
            "summary": f"KvRetentionDeployment {NS}/{FLEET}: a worker turned its {path} fast "
            "path off",
            "description": f"A worker's {path} fast path differed from the exact path it stands "
            "in for and is off until the worker restarts: answers stay exact, each agent turn "
            "costs more CPU (token_reuse: the whole prompt tokenized every turn; "
            "compiled_template: the chat template rendered by Jinja2). The worker's log has the "
            "first difference; report it with the model's chat template.",
        },
    }


@dataclass(frozen=True)
class Case:
    id: str
    alert: str
    series: list[tuple[str, str]]
    eval_time: str
    fires: list[dict[str, Any]] = field(default_factory=list)
    """Expected alerts: ``{"labels": ..., "annotations": ...}``; empty: must not fire."""


def firing(severity: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {"labels": {**LABELS, "severity": severity}, "annotations": annotations}


CASES = [
    Case(
        "pins-over-budget",
        "KvRetentionPinsOverBudget",
        [
            (f"kvretention_kvstore_pinned_ratio{{{AT}}}", "0.5x30"),
            (f"kvretention_kvstore_budget_ratio{{{AT}}}", "0.3x30"),
        ],
        "15m",
        [
            firing(
                "warning",
                {
                    "summary": f"KvRetentionDeployment {NS}/{FLEET}: soft pins hold more of the "
                    "Mooncake pool than its retention budget",
                    "description": BUDGET_DESCRIPTION.format(pct="50%"),
                },
            )
        ],
    ),
    Case(
        "pins-within-budget",
        "KvRetentionPinsOverBudget",
        [
            (f"kvretention_kvstore_pinned_ratio{{{AT}}}", "0.2x30"),
            (f"kvretention_kvstore_budget_ratio{{{AT}}}", "0.3x30"),
        ],
        "15m",
    ),
    Case(
        "pins-over-budget-not-yet-for-long",
        "KvRetentionPinsOverBudget",
        [
            (f"kvretention_kvstore_pinned_ratio{{{AT}}}", "0.2x20 0.5x10"),
            (f"kvretention_kvstore_budget_ratio{{{AT}}}", "0.3x30"),
        ],
        "25m",
    ),
    Case(
        "store-metrics-down",
        "KvRetentionKvStoreMetricsDown",
        [(f"kvretention_kvstore_metrics_up{{{AT}}}", "0x30")],
        "20m",
        [
            firing(
                "warning",
                {
                    "summary": f"KvRetentionDeployment {NS}/{FLEET}: the operator cannot read its "
                    "Mooncake master's metrics",
                    "description": "The retention budget is not being checked. The "
                    "RetentionBudget condition's message says why.",
                },
            )
        ],
    ),
    Case(
        "store-metrics-up",
        "KvRetentionKvStoreMetricsDown",
        [(f"kvretention_kvstore_metrics_up{{{AT}}}", "1x30")],
        "20m",
    ),
    Case(
        "aggregated-pool-empty",
        "KvRetentionNoReadyWorkers",
        [healthy("aggregated", "0x10"), healthy("prefill", "0x10"), healthy("decode", "0x10")],
        "5m",
        [firing("critical", NO_WORKERS)],
    ),
    Case(
        "decode-pool-empty",
        "KvRetentionNoReadyWorkers",
        [healthy("aggregated", "0x10"), healthy("prefill", "2x10"), healthy("decode", "0x10")],
        "5m",
        [firing("critical", NO_WORKERS)],
    ),
    Case(
        "aggregated-pool-ready",
        "KvRetentionNoReadyWorkers",
        [healthy("aggregated", "1x10"), healthy("prefill", "0x10"), healthy("decode", "0x10")],
        "5m",
    ),
    Case(
        "both-disaggregated-pools-ready",
        "KvRetentionNoReadyWorkers",
        [healthy("aggregated", "0x10"), healthy("prefill", "1x10"), healthy("decode", "3x10")],
        "5m",
    ),
    Case(
        "one-in-six-requests-fails",
        "KvRetentionErrorRatioHigh",
        [requests("ok", "0+10x40"), requests("error", "0+2x40")],
        "30m",
        [
            firing(
                "warning",
                {
                    "summary": f"KvRetentionDeployment {NS}/{FLEET}: 16.67% of requests fail",
                    "description": "More than 0.05 of the frontend's finished requests ended in "
                    "an error (a worker or router failure, not a rejected request). The "
                    "frontend's and router's logs say which.",
                },
            )
        ],
    ),
    Case(
        "one-in-a-hundred-fails",
        "KvRetentionErrorRatioHigh",
        [requests("ok", "0+99x40"), requests("error", "0+1x40")],
        "30m",
    ),
    Case(
        "rejections-are-not-errors",
        "KvRetentionErrorRatioHigh",
        [requests("ok", "0+5x40"), requests("rejected", "0+5x40"), requests("error", "0x40")],
        "30m",
    ),
    Case(
        "hints-sent-none-passed",
        "KvRetentionHintsUnsupported",
        [hints("0+10x40"), passed("none", "0x40")],
        "30m",
        [firing("warning", HINTS)],
    ),
    Case(
        "hints-sent-and-passed",
        "KvRetentionHintsUnsupported",
        [hints("0+10x40"), passed("versioned", "0+10x40")],
        "30m",
    ),
    Case(
        "engine-takes-no-hints",
        "KvRetentionHintsUnsupported",
        [condition("KvHintsSupported", "False", "NoKvHintsParameter", "1x40")],
        "30m",
        [firing("warning", HINTS)],
    ),
    Case(
        "engine-takes-hints",
        "KvRetentionHintsUnsupported",
        [condition("KvHintsSupported", "True", "Supported", "1x40")],
        "30m",
    ),
    Case(
        "retention-not-applied",
        "KvRetentionRetentionNotApplied",
        [condition("RetentionApplied", "False", "EvictionPolicyOverridden", "1x40")],
        "30m",
        [firing("warning", NOT_APPLIED)],
    ),
    Case(
        "retention-applied",
        "KvRetentionRetentionNotApplied",
        [condition("RetentionApplied", "True", "Applied", "1x40")],
        "30m",
    ),
    Case(
        "retention-not-applied-briefly",
        "KvRetentionRetentionNotApplied",
        [
            condition("RetentionApplied", "False", "PluginNotSelected", "1x5"),
            condition("RetentionApplied", "True", "Applied", "_x5 1x30"),
        ],
        "30m",
    ),
    Case(
        "checkpoint-hook-fails",
        "KvRetentionHookFailures",
        [hook_failures("checkpoint", "unretained", "0x5 0+2x20")],
        "20m",
        [firing("warning", HOOK_FAILURES)],
    ),
    Case(
        "hook-failed-once-long-ago",
        "KvRetentionHookFailures",
        [hook_failures("l3_put", "unpinned", "0x5 1x40")],
        "40m",
    ),
    Case(
        "no-hook-fails",
        "KvRetentionHookFailures",
        [hook_failures("checkpoint", "unretained", "0x40")],
        "30m",
    ),
    Case(
        "master-restarted",
        "KvRetentionMooncakeMasterRestarted",
        [master_restarts("0x5 1x10")],
        "10m",
        [firing("warning", MASTER_RESTARTED)],
    ),
    Case(
        "master-restarted-long-ago",
        "KvRetentionMooncakeMasterRestarted",
        [master_restarts("0x5 1x40")],
        "40m",
    ),
    Case(
        "master-never-restarted",
        "KvRetentionMooncakeMasterRestarted",
        [master_restarts("0x40")],
        "30m",
    ),
    Case(
        "forged-tenant-at-a-worker",
        "KvRetentionHopRefusals",
        [hop_refusals("worker", "invalid", "0x5 1x10")],
        "10m",
        [firing("warning", HOP_REFUSED)],
    ),
    Case(
        "unsigned-at-the-router",
        "KvRetentionHopRefusals",
        [hop_refusals("router", "missing", "0x5 3x10")],
        "10m",
        [firing("warning", HOP_REFUSED)],
    ),
    Case(
        "no-hop-refusals",
        "KvRetentionHopRefusals",
        [hop_refusals("router", "missing", "0x40"), hop_refusals("worker", "stale", "0x40")],
        "30m",
    ),
    Case(
        "pins-left-out-at-one-worker",
        "KvRetentionRadixPinsDropped",
        [pins_dropped("worker-0", "0x40"), pins_dropped("worker-1", "0x5 2x10")],
        "10m",
        [firing("warning", PINS_DROPPED)],
    ),
    Case(
        "pins-left-out-long-ago",
        "KvRetentionRadixPinsDropped",
        [pins_dropped("worker-0", "0x5 3x40")],
        "40m",
    ),
    Case(
        "every-pin-fits",
        "KvRetentionRadixPinsDropped",
        [pins_dropped("worker-0", "0x40")],
        "30m",
    ),
    Case(
        "one-worker-stopped-reusing-tokens",
        "KvRetentionWorkerFastPathOff",
        [
            fast_path("worker-0", "token_reuse", "1x40"),
            fast_path("worker-1", "token_reuse", "1x5 0x35"),
            fast_path("worker-1", "compiled_template", "1x40"),
        ],
        "10m",
        [fast_path_off("token_reuse")],
    ),
    Case(
        "fast-paths-serving",
        "KvRetentionWorkerFastPathOff",
        [
            fast_path("worker-0", "token_reuse", "1x40"),
            fast_path("worker-0", "compiled_template", "1x40"),
        ],
        "30m",
    ),
    Case(
        "no-hints-sent",
        "KvRetentionHintsUnsupported",
        [hints("0x40"), passed("versioned", "0x40")],
        "30m",
    ),
]


@pytest.fixture(scope="module")
def promtool() -> Path:
    return prometheus_binary("promtool")


@pytest.fixture(scope="module")
def rule_groups(helm: Helm) -> dict[str, Any]:
    docs = helm.template({"metrics": {"prometheusRule": {"enabled": True}}})
    (rule,) = select(docs, "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


@pytest.fixture(scope="module")
def rules_dir(rule_groups: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rules")
    (folder / "rules.yaml").write_text(yaml.safe_dump(rule_groups, sort_keys=False))
    return folder


def promtool_test(promtool: Path, folder: Path, case: Case, fires: list[dict[str, Any]]) -> str:
    """Run ``promtool test rules`` on one case expecting ``fires``; '' when it passed."""
    spec = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series],
                "alert_rule_test": [
                    {
                        "eval_time": case.eval_time,
                        "alertname": case.alert,
                        "exp_alerts": [
                            {"exp_labels": a["labels"], "exp_annotations": a["annotations"]}
                            for a in fires
                        ],
                    }
                ],
            }
        ],
    }
    path = folder / f"test-{case.id}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = subprocess.run(
        [str(promtool), "test", "rules", path.name],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_the_rules_pass_promtool_check(promtool: Path, rules_dir: Path) -> None:
    done = subprocess.run(
        [str(promtool), "check", "rules", "rules.yaml"],
        cwd=rules_dir,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_alert_fires_only_on_its_condition(promtool: Path, rules_dir: Path, case: Case) -> None:
    failed = promtool_test(promtool, rules_dir, case, case.fires)
    assert not failed, failed
    # The same evaluation with the opposite expectation must fail: promtool really evaluated it.
    opposite = [] if case.fires else [firing("warning", {})]
    assert promtool_test(promtool, rules_dir, case, opposite), "the opposite expectation passed"


def test_every_alert_has_a_firing_and_a_quiet_case(rule_groups: dict[str, Any]) -> None:
    alerts = {r["alert"] for g in rule_groups["groups"] for r in g["rules"]}
    assert alerts == ALERTS
    assert {c.alert for c in CASES if c.fires} == alerts
    assert {c.alert for c in CASES if not c.fires} == alerts
