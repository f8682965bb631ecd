"""compute_status: observed children + probe reports + previous conditions -> the CR's status."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest
from fake_kube import fleet_deployment, live

from kvretention.api.models import KvRetentionDeploymentStatus
from kvretention.api.names import CONDITION_TYPES
from kvretention.controller.diagnosis import observe_workload
from kvretention.controller.probe_reports import (
    PodReport,
    ProbeFailure,
    check_kv_hints,
    parse_probe_report,
)
from kvretention.controller.status import (
    Endpoint,
    Fleet,
    Observed,
    Scale,
    compute_invalid_status,
    compute_status,
    transitions,
)
from support.sample_probe_reports import HINTS_REPORT, old_engine

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=5)
LABEL = "app.kubernetes.io/component"

GOOD_REPORT = HINTS_REPORT
OLD_ENGINE_REPORT = old_engine(GOOD_REPORT)


def pod(name: str, message: str | None, *, in_last_state: bool = False) -> dict[str, Any]:
    terminated = {"exitCode": 0, "message": message} if message is not None else {}
    state = {"terminated": terminated} if terminated else {"running": {}}
    container: dict[str, Any] = {"name": "probe", "state": state}
    if in_last_state:
        container = {"name": "probe", "state": {"running": {}}, "lastState": state}
    return {"metadata": {"name": name}, "status": {"initContainerStatuses": [container]}}


AGGREGATED = [
    fleet_deployment("f-frontend", "frontend"),
    fleet_deployment("f-router", "router"),
    fleet_deployment("f-worker", "worker", 2),
    fleet_deployment("f-mooncake", "mooncake-master"),
    {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "f-frontend", "labels": {LABEL: "frontend"}},
        "spec": {"ports": [{"name": "http", "port": 8000}]},
    },
]
DISAGGREGATED = [
    fleet_deployment("f-frontend", "frontend"),
    fleet_deployment("f-router", "router"),
    fleet_deployment("f-prefill", "worker-prefill", 1),
    fleet_deployment("f-decode", "worker-decode", 3),
]


WORKER_SELECTOR = "app.kubernetes.io/component=worker,app.kubernetes.io/instance=f"
DECODE_SELECTOR = "app.kubernetes.io/component=worker-decode,app.kubernetes.io/instance=f"
FRONTEND = Endpoint(service="f-frontend", url="http://f-frontend.ns.svc:8000")
"""What the builders say of AGGREGATED's frontend Service (the planner's tests check they agree)."""
WORKERS = Scale(workload="f-worker", selector=WORKER_SELECTOR)


def all_ready(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {}
    for m in manifests:
        if m["kind"] == "Deployment":
            n = m["spec"]["replicas"]
            out[m["metadata"]["name"]] = live(m["metadata"]["name"], replicas=n, ready=n)
    return out


def fleet(
    desired: list[dict[str, Any]] = AGGREGATED,
    *,
    required: bool = True,
    external: str | None = None,
    generation: int = 1,
    endpoint: Endpoint | None = FRONTEND,
    scale: Scale | None = WORKERS,
) -> Fleet:
    return Fleet(
        name="f",
        namespace="ns",
        generation=generation,
        hints_required=required,
        desired=desired,
        kvstore_external=external,
        endpoint=endpoint,
        scale=scale,
    )


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


GOOD_PODS = [pod("f-worker-a", json.dumps(GOOD_REPORT)), pod("f-worker-b", json.dumps(GOOD_REPORT))]


@pytest.mark.parametrize(
    ("case", "the_fleet", "deployments", "pods", "expected"),
    [
        (
            "everything ready",
            fleet(),
            all_ready(AGGREGATED),
            GOOD_PODS,
            {"Ready": ("True", "Ready"), "Progressing": ("False", "Converged")},
        ),
        (
            "nothing exists yet",
            fleet(),
            {},
            [],
            {
                "Ready": ("False", "NotCreated"),
                "FrontendReady": ("False", "NotCreated"),
                "KvHintsSupported": ("Unknown", "ProbePending"),
                "Progressing": ("True", "RollingOut"),
            },
        ),
        (
            "worker pods not ready",
            fleet(),
            {**all_ready(AGGREGATED), "f-worker": live("f-worker", replicas=2, ready=1)},
            GOOD_PODS,
            {
                "Ready": ("False", "PodsNotReady"),
                "WorkersReady": ("False", "PodsNotReady"),
                "FrontendReady": ("True", "PodsReady"),
                # As kubectl rollout status, kstatus and Argo CD count it: not all available yet.
                "Progressing": ("True", "RollingOut"),
            },
        ),
        (
            "a spec change the controller has not seen",
            fleet(),
            {**all_ready(AGGREGATED), "f-router": live("f-router", generation=2, observed=1)},
            GOOD_PODS,
            {"RouterReady": ("False", "RollingOut"), "Progressing": ("True", "RollingOut")},
        ),
        (
            "old pods still terminating",
            fleet(),
            {**all_ready(AGGREGATED), "f-worker": live("f-worker", replicas=3, ready=2, updated=2)},
            GOOD_PODS,
            {"WorkersReady": ("False", "RollingOut"), "Ready": ("False", "RollingOut")},
        ),
        (
            "engine without kv_hints under Required",
            fleet(),
            all_ready(AGGREGATED),
            [pod("f-worker-a", json.dumps(OLD_ENGINE_REPORT))],
            {
                "Ready": ("False", "EngineLacksKvHints"),
                "KvHintsSupported": ("False", "EngineLacksKvHints"),
                "WorkersReady": ("True", "PodsReady"),
            },
        ),
        (
            "engine without kv_hints under Optional",
            fleet(required=False),
            all_ready(AGGREGATED),
            [pod("f-worker-a", json.dumps(OLD_ENGINE_REPORT))],
            {
                "Ready": ("True", "ReadyWithoutKvHints"),
                "KvHintsSupported": ("False", "EngineLacksKvHints"),
            },
        ),
        (
            "hints failure outranks pods still starting",
            fleet(),
            {**all_ready(AGGREGATED), "f-frontend": live("f-frontend", ready=0)},
            [pod("f-worker-a", json.dumps(OLD_ENGINE_REPORT))],
            {"Ready": ("False", "EngineLacksKvHints")},
        ),
        (
            "probe pending under Required",
            fleet(),
            all_ready(AGGREGATED),
            [],
            {"Ready": ("False", "ProbePending"), "KvHintsSupported": ("Unknown", "ProbePending")},
        ),
        (
            "probe pending under Optional",
            fleet(required=False),
            all_ready(AGGREGATED),
            [],
            {"Ready": ("True", "ReadyWithoutKvHints")},
        ),
        (
            "garbage probe message",
            fleet(),
            all_ready(AGGREGATED),
            [pod("f-worker-a", "Traceback (most recent call last)")],
            {"KvHintsSupported": ("False", "ProbeReportInvalid")},
        ),
        (
            "external Mooncake",
            fleet([m for m in AGGREGATED if m["metadata"]["name"] != "f-mooncake"], external="m:1"),
            all_ready(AGGREGATED),
            GOOD_PODS,
            {"KvStoreReady": ("True", "External"), "Ready": ("True", "Ready")},
        ),
        (
            "managed Mooncake master down",
            fleet(),
            {**all_ready(AGGREGATED), "f-mooncake": live("f-mooncake", ready=0)},
            GOOD_PODS,
            {"KvStoreReady": ("False", "PodsNotReady"), "Ready": ("False", "PodsNotReady")},
        ),
        (
            "workers scaled to zero",
            fleet([*AGGREGATED[:2], fleet_deployment("f-worker", "worker", 0), *AGGREGATED[3:]]),
            {**all_ready(AGGREGATED), "f-worker": live("f-worker", replicas=0, ready=0)},
            [],
            {
                "WorkersReady": ("False", "ScaledToZero"),
                "Ready": ("False", "ScaledToZero"),
                "FrontendReady": ("True", "PodsReady"),
                "Progressing": ("False", "Converged"),
            },
        ),
        (
            "frontend scaled to zero",
            fleet([fleet_deployment("f-frontend", "frontend", 0), *AGGREGATED[1:]]),
            {**all_ready(AGGREGATED), "f-frontend": live("f-frontend", replicas=0, ready=0)},
            GOOD_PODS,
            {
                "FrontendReady": ("False", "ScaledToZero"),
                "Ready": ("False", "ScaledToZero"),
                "WorkersReady": ("True", "PodsReady"),
            },
        ),
        (
            "prefill pool scaled to zero",
            fleet(
                [
                    *DISAGGREGATED[:2],
                    fleet_deployment("f-prefill", "worker-prefill", 0),
                    DISAGGREGATED[3],
                ],
                external="m:1",
            ),
            {**all_ready(DISAGGREGATED), "f-prefill": live("f-prefill", replicas=0, ready=0)},
            GOOD_PODS,
            {"WorkersReady": ("False", "ScaledToZero"), "Ready": ("False", "ScaledToZero")},
        ),
        (
            "disaggregated, decode pool short",
            fleet(DISAGGREGATED, external="m:1"),
            {**all_ready(DISAGGREGATED), "f-decode": live("f-decode", replicas=3, ready=2)},
            GOOD_PODS,
            {"WorkersReady": ("False", "PodsNotReady")},
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_conditions(
    case: str,
    the_fleet: Fleet,
    deployments: dict[str, Any],
    pods: list[dict[str, Any]],
    expected: dict[str, tuple[str, str]],
) -> None:
    status = compute_status(
        the_fleet, Observed(deployments=deployments, worker_pods=pods), previous=None, now=T0
    )
    got = conditions(status)
    assert [c["type"] for c in status["conditions"]] == list(CONDITION_TYPES)
    for type_, want in expected.items():
        assert got[type_] == want, f"{case}: {type_}"
    # Whatever we write must be valid under the CRD's own status model.
    KvRetentionDeploymentStatus.model_validate(status)


def test_counts_endpoint_engine_and_scale() -> None:
    deployments = {**all_ready(AGGREGATED), "f-worker": live("f-worker", replicas=2, ready=1)}
    status = compute_status(
        fleet(), Observed(deployments=deployments, worker_pods=GOOD_PODS), previous=None, now=T0
    )
    assert status["observedGeneration"] == 1
    assert status["frontend"] == {"ready": 1, "desired": 1, "updated": 1, "available": 1}
    assert status["workers"] == {
        "ready": 1,
        "desired": 2,
        "updated": 2,
        "available": 1,
        "pools": [
            {
                "name": "f-worker",
                "role": "worker",
                "ready": 1,
                "desired": 2,
                "updated": 2,
                "available": 1,
                "reason": "PodsNotReady",
                "message": "Deployment f-worker: 2/2 updated, 1/2 ready, 1/2 available",
            }
        ],
    }
    assert status["kvStore"] == {"ready": 1, "desired": 1, "updated": 1, "available": 1}
    assert status["workersReady"] == "1/2"
    assert status["endpoint"] == "http://f-frontend.ns.svc:8000"
    assert status["engine"] == {
        "sglangVersion": "0.5.23",
        "dialect": "versioned",
        "kvHintsParameter": True,
        "storageBackends": ["file", "mooncake"],
        "mooncakeImportable": True,
    }
    assert status["replicas"] == 2
    assert status["selector"] == WORKER_SELECTOR


def test_scale_targets_the_decode_pool_when_disaggregated() -> None:
    status = compute_status(
        fleet(DISAGGREGATED, external="m:1", scale=Scale("f-decode", DECODE_SELECTOR)),
        Observed(deployments=all_ready(DISAGGREGATED)),
        previous=None,
        now=T0,
    )
    assert status["replicas"] == 3
    assert status["selector"] == DECODE_SELECTOR
    workers = status["workers"]
    assert {k: workers[k] for k in ("ready", "desired", "updated", "available")} == {
        "ready": 4,
        "desired": 4,
        "updated": 4,
        "available": 4,
    }
    assert [(p["name"], p["role"], p["desired"], p["reason"]) for p in workers["pools"]] == [
        ("f-prefill", "worker-prefill", 1, "PodsReady"),
        ("f-decode", "worker-decode", 3, "PodsReady"),
    ]
    assert status["kvStore"] == {"ready": 0, "desired": 0, "updated": 0, "available": 0}


def test_transition_time_moves_only_on_a_flip() -> None:
    observed = Observed(deployments=all_ready(AGGREGATED), worker_pods=[])
    first = compute_status(fleet(), observed, previous=None, now=T0)
    # Same observation later, and a new generation: no flip, times stay, generation moves.
    again = compute_status(fleet(generation=2), observed, previous=first, now=T1)
    stamp0 = T0.strftime("%Y-%m-%dT%H:%M:%SZ")
    stamp1 = T1.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert {c["lastTransitionTime"] for c in again["conditions"]} == {stamp0}
    assert {c["observedGeneration"] for c in again["conditions"]} == {2}
    # The probe report arrives: KvHintsSupported and Ready flip, the rest keep their time.
    flipped = compute_status(
        fleet(generation=2),
        Observed(deployments=all_ready(AGGREGATED), worker_pods=GOOD_PODS),
        previous=again,
        now=T1,
    )
    times = {c["type"]: c["lastTransitionTime"] for c in flipped["conditions"]}
    assert times["KvHintsSupported"] == stamp1
    assert times["Ready"] == stamp1
    assert times["WorkersReady"] == stamp0
    assert [c["type"] for c in transitions(again, flipped)] == ["Ready", "KvHintsSupported"]


def test_converged_status_is_a_fixed_point() -> None:
    observed = Observed(deployments=all_ready(AGGREGATED), worker_pods=GOOD_PODS)
    first = compute_status(fleet(), observed, previous=None, now=T0)
    assert compute_status(fleet(), observed, previous=first, now=T1) == first
    assert transitions(first, first) == []


def test_invalid_spec_status() -> None:
    status = compute_invalid_status(
        generation=3, problems=["a is wrong", "b too"], previous=None, now=T0
    )
    got = conditions(status)
    assert got["Ready"] == ("False", "InvalidSpec")
    assert got["Progressing"] == ("False", "InvalidSpec")
    assert got["WorkersReady"] == ("Unknown", "InvalidSpec")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "a is wrong; b too"
    assert set(status) == {"observedGeneration", "conditions"}
    KvRetentionDeploymentStatus.model_validate(status)


@pytest.mark.parametrize(
    ("the_pod", "expected"),
    [
        (pod("p", None), None),
        ({"metadata": {"name": "p"}, "status": {}}, None),
        (pod("p", json.dumps(GOOD_REPORT)), PodReport),
        (pod("p", json.dumps(GOOD_REPORT), in_last_state=True), PodReport),
        (pod("p", "{not json"), ProbeFailure),
        (pod("p", json.dumps({**GOOD_REPORT, "schema": 2})), ProbeFailure),
        (pod("p", json.dumps([1, 2])), ProbeFailure),
    ],
)
def test_parse_probe_report(the_pod: dict[str, Any], expected: type | None) -> None:
    report = parse_probe_report(the_pod)
    if expected is None:
        assert report is None
    else:
        assert isinstance(report, expected)


@pytest.mark.parametrize(
    ("report", "reason"),
    [
        ({**GOOD_REPORT}, "EngineAcceptsKvHints"),
        ({**GOOD_REPORT, "dialect": "flat"}, "EngineAcceptsKvHints"),
        (OLD_ENGINE_REPORT, "EngineLacksKvHints"),
        (
            {**GOOD_REPORT, "mooncake_store_importable": False, "mooncake_error": "no libcuda"},
            "EngineAcceptsKvHints",  # reported, not required (docs/probe.md)
        ),
        ({**GOOD_REPORT, "usable_for_hints": False}, "EngineUnusableForHints"),
    ],
)
def test_kv_hints_reasons(report: dict[str, Any], reason: str) -> None:
    parsed = parse_probe_report(pod("p", json.dumps(report)))
    assert parsed is not None
    assert check_kv_hints([parsed]).reason == reason


def test_one_bad_pod_among_good_ones_fails_the_check() -> None:
    reports = [
        parse_probe_report(p)
        for p in (*GOOD_PODS, pod("f-worker-z", json.dumps(OLD_ENGINE_REPORT)))
    ]
    verdict = check_kv_hints([r for r in reports if r is not None])
    assert (verdict.status, verdict.reason) == ("False", "EngineLacksKvHints")
    assert "f-worker-z" in verdict.message


def test_observe_workload_defaults_replicas_to_one_and_reads_live_status() -> None:
    manifest = fleet_deployment("d", "router")
    del manifest["spec"]["replicas"]
    assert observe_workload(manifest, None).desired == 1
    w = observe_workload(fleet_deployment("d", "router", 2), live("d", replicas=2, ready=2))
    assert (w.exists, w.ready, w.rolled_out) == (True, 2, True)


@pytest.mark.parametrize(("live_replicas", "ready", "healthy"), [(3, 3, True), (3, 2, False)])
def test_an_autoscaled_workload_wants_what_its_hpa_set(
    live_replicas: int, ready: int, healthy: bool
) -> None:
    manifest = fleet_deployment("d", "worker")
    del manifest["spec"]["replicas"]  # as the operator applies an autoscaled pool
    body = live("d", replicas=live_replicas, ready=ready)
    body["spec"] = {"replicas": live_replicas}
    w = observe_workload(manifest, body)
    assert (w.desired, w.healthy) == (live_replicas, healthy)


def test_refused_writes_outrank_everything_else() -> None:
    observed = Observed(
        deployments=all_ready(AGGREGATED),
        worker_pods=GOOD_PODS,
        apply_errors=["Deployment f-router: forbidden"],
    )
    status = compute_status(fleet(), observed, previous=None, now=T0)
    got = conditions(status)
    assert got["Ready"] == ("False", "ApplyFailed")
    assert got["Progressing"] == ("False", "ApplyFailed")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "f-router: forbidden" in ready["message"]


def test_mooncake_import_failure_is_named_in_the_message() -> None:
    report = {**GOOD_REPORT, "mooncake_store_importable": False, "mooncake_error": "no libcuda"}
    parsed = parse_probe_report(pod("f-worker-a", json.dumps(report)))
    assert parsed is not None
    verdict = check_kv_hints([parsed])
    assert verdict.status == "True"
    assert "mooncake.store does not import in pod f-worker-a: no libcuda" in verdict.message


@pytest.mark.parametrize(
    ("reported", "shown"),
    [("cpu", "cpu"), ("cuda", "cuda"), ("tpu", None), (None, None)],
    ids=["cpu", "cuda", "unknown-device", "not-measured"],
)
def test_engine_says_where_the_workers_engine_runs(reported: str | None, shown: str | None) -> None:
    report = {**GOOD_REPORT, "engine_device": reported}
    pods = [pod("f-worker-a", json.dumps(report))]
    status = compute_status(
        fleet(),
        Observed(deployments=all_ready(AGGREGATED), worker_pods=pods),
        previous=None,
        now=T0,
    )
    assert status["engine"].get("device") == shown
    KvRetentionDeploymentStatus.model_validate(status)
