"""Why pods are not ready: the pod checks, each Deployment's chain, and what reaches the conditions.

Pod and Deployment bodies are shaped as the API server returns them (the scheduler's
``PodScheduled`` condition, the kubelet's container states, the Deployment controller's
``ReplicaFailure`` / ``Progressing`` conditions).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import replace
from typing import Any

import pytest
from fake_kube import fleet_deployment, live

from kvretention.api.models import KvRetentionDeploymentStatus
from kvretention.controller.conditions import PROBLEM_REASONS
from kvretention.controller.diagnosis import diagnose_pods
from kvretention.controller.status import Fleet, Observed, compute_status, is_problem, transitions

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
T1 = T0 + dt.timedelta(minutes=1)
COMPONENT = "app.kubernetes.io/component"
INSTANCE = "app.kubernetes.io/instance"
NO_GPU = (
    "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are "
    "available: 1 No preemption victims found for incoming pod."
)

# -- bodies ----------------------------------------------------------------------------------------


def cond(type_: str, status: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def waiting(name: str, reason: str, message: str = "", **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "image": "img:1",
        "state": {"waiting": {"reason": reason, "message": message}},
        **extra,
    }


def terminated(name: str, code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    return {"exitCode": code, "reason": reason, "message": message}


def running(name: str, *, ready: bool) -> dict[str, Any]:
    return {"name": name, "ready": ready, "image": "img:1", "state": {"running": {}}}


def done(name: str) -> dict[str, Any]:
    return {"name": name, "ready": False, "state": {"terminated": terminated(name, 0, "Completed")}}


def pod(
    name: str,
    component: str = "worker",
    *,
    ready: bool = False,
    scheduled: dict[str, Any] | None = None,
    init: list[dict[str, Any]] | None = None,
    containers: list[dict[str, Any]] | None = None,
    phase: str = "Pending",
    **status: Any,
) -> dict[str, Any]:
    conditions = [scheduled or cond("PodScheduled", "True")]
    conditions.append(cond("Ready", "True" if ready else "False"))
    body: dict[str, Any] = {
        "metadata": {"name": name, "labels": {INSTANCE: "f", COMPONENT: component}},
        "status": {"phase": phase, "conditions": conditions, **status},
    }
    if init is not None:
        body["status"]["initContainerStatuses"] = init
    if containers is not None:
        body["status"]["containerStatuses"] = containers
    return body


UNSCHEDULABLE_POD = pod(
    "f-worker-a", scheduled=cond("PodScheduled", "False", "Unschedulable", NO_GPU)
)
IMAGE_POD = pod(
    "f-worker-b",
    init=[waiting("probe", "ImagePullBackOff", 'Back-off pulling image "nope:1"')],
    containers=[waiting("worker", "PodInitializing")],
)
ERR_IMAGE_POD = pod(
    "f-worker-c",
    init=[done("probe")],
    containers=[waiting("worker", "ErrImagePull", "rpc error: not found\nmore lines")],
)
CONFIG_POD = pod(
    "f-worker-d",
    init=[done("probe")],
    containers=[waiting("worker", "CreateContainerConfigError", 'secret "hf-token" not found')],
)
INIT_FAILED_POD = pod(
    "f-worker-e",
    init=[
        waiting(
            "probe",
            "CrashLoopBackOff",
            "back-off 10s restarting failed container",
            lastState={
                "terminated": terminated("probe", 127, message="kvretention: not found\ntrace")
            },
        )
    ],
    containers=[waiting("worker", "PodInitializing")],
)
CRASH_POD = pod(
    "f-worker-f",
    phase="Running",
    init=[done("probe")],
    containers=[
        waiting(
            "worker",
            "CrashLoopBackOff",
            "back-off 40s restarting failed container=worker",
            lastState={"terminated": terminated("worker", 1, message="CUDA out of memory")},
        )
    ],
)
EXITED_POD = pod(
    "f-worker-g",
    phase="Running",
    init=[done("probe")],
    containers=[{"name": "worker", "ready": False, "state": {"terminated": terminated("w", 137)}}],
)
EVICTED_POD = pod(
    "f-worker-h",
    phase="Failed",
    reason="Evicted",
    message="The node was low on resource: memory.",
)
PROBING_POD = pod(
    "f-worker-i",
    init=[running("probe", ready=False)],
    containers=[waiting("worker", "PodInitializing")],
)
LOADING_POD = pod(
    "f-worker-j",
    phase="Running",
    init=[done("probe")],
    containers=[running("worker", ready=False)],
)
READY_POD = pod(
    "f-worker-k",
    ready=True,
    phase="Running",
    init=[done("probe")],
    containers=[running("worker", ready=True)],
)


# -- one pod ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "the_pod", "reason", "message"),
    [
        ("unschedulable", UNSCHEDULABLE_POD, "Unschedulable", f"pod f-worker-a: {NO_GPU}"),
        (
            "scheduling gated",
            pod("p", scheduled=cond("PodScheduled", "False", "SchedulingGated", "gated")),
            "SchedulingGated",
            "pod p: gated",
        ),
        (
            "init image pull back-off",
            IMAGE_POD,
            "ImagePullBackOff",
            'pod f-worker-b: init container probe: Back-off pulling image "nope:1"',
        ),
        (
            "main image pull error (first line only)",
            ERR_IMAGE_POD,
            "ErrImagePull",
            "pod f-worker-c: container worker: rpc error: not found",
        ),
        (
            "missing secret",
            CONFIG_POD,
            "CreateContainerConfigError",
            'pod f-worker-d: container worker: secret "hf-token" not found',
        ),
        (
            "init container (the probe) failing",
            INIT_FAILED_POD,
            "InitContainerFailed",
            "pod f-worker-e: init container probe failed, exit code 127 (Error): "
            "kvretention: not found",
        ),
        (
            "crash loop",
            CRASH_POD,
            "CrashLoopBackOff",
            "pod f-worker-f: container worker keeps exiting, last exit code 1 (Error): "
            "CUDA out of memory",
        ),
        (
            "exited, not yet backing off",
            EXITED_POD,
            "ContainerFailed",
            "pod f-worker-g: container worker exit code 137 (Error)",
        ),
        (
            "evicted",
            EVICTED_POD,
            "PodFailed",
            "pod f-worker-h: Evicted: The node was low on resource: memory.",
        ),
        (
            "probe still running",
            PROBING_POD,
            "PodsStarting",
            "pod f-worker-i: init container probe running",
        ),
        (
            "engine loading",
            LOADING_POD,
            "PodsStarting",
            "pod f-worker-j: container worker is running, not ready yet",
        ),
        (
            "scheduled, no statuses yet",
            pod("p"),
            "PodsStarting",
            "pod p: scheduled, containers starting",
        ),
        (
            "not yet looked at by the scheduler",
            {"metadata": {"name": "p"}, "status": {"phase": "Pending"}},
            "PodsStarting",
            "pod p: waiting to be scheduled",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else "",
)
def test_one_pod(case: str, the_pod: dict[str, Any], reason: str, message: str) -> None:
    issue = diagnose_pods([the_pod])
    assert issue is not None, case
    assert (issue.reason, issue.message) == (reason, message)
    # Problems are Warnings, starting pods are not.
    assert (reason in PROBLEM_REASONS) == (reason != "PodsStarting")


def test_ready_and_terminating_pods_say_nothing() -> None:
    deleting = {**UNSCHEDULABLE_POD, "metadata": {"name": "x", "deletionTimestamp": "now"}}
    assert diagnose_pods([READY_POD, deleting]) is None
    assert diagnose_pods([]) is None


def test_the_most_fundamental_problem_wins_across_pods() -> None:
    issue = diagnose_pods([CRASH_POD, LOADING_POD, IMAGE_POD, UNSCHEDULABLE_POD, READY_POD])
    assert issue is not None
    assert issue.reason == "Unschedulable"
    both = diagnose_pods([CRASH_POD, {**CRASH_POD, "metadata": {"name": "f-worker-0"}}])
    assert both is not None
    assert both.message.startswith("pod f-worker-0: container worker keeps exiting")
    assert both.message.endswith("(and 1 more pods)")


def test_a_long_message_is_clipped() -> None:
    long = pod("p", scheduled=cond("PodScheduled", "False", "Unschedulable", "x" * 5000))
    issue = diagnose_pods([long])
    assert issue is not None
    assert len(issue.message) < 320 and issue.message.endswith("...")


# -- a fleet ---------------------------------------------------------------------------------------


DESIRED = [
    fleet_deployment("f-frontend", "frontend", 1),
    fleet_deployment("f-router", "router", 1),
    fleet_deployment("f-worker", "worker", 2),
    fleet_deployment("f-mooncake", "mooncake-master", 1),
]
READY = {
    "f-frontend": live("f-frontend", replicas=1, ready=1),
    "f-router": live("f-router", replicas=1, ready=1),
    "f-worker": live("f-worker", replicas=2, ready=2),
    "f-mooncake": live("f-mooncake", replicas=1, ready=1),
}
FLEET = Fleet(name="f", namespace="ns", generation=1, hints_required=False, desired=DESIRED)
QUOTA = (
    'pods "f-frontend-7d9-x" is forbidden: exceeded quota: q, requested: pods=1, limited: pods=0'
)
DEADLINE = 'ReplicaSet "f-worker-5f" has timed out progressing.'


def status_of(deployments: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Any]:
    status = compute_status(
        FLEET, Observed(deployments=deployments, pods=pods), previous=None, now=T0
    )
    KvRetentionDeploymentStatus.model_validate(status)
    return status


def condition(status: dict[str, Any], type_: str) -> tuple[str, str, str]:
    c = next(c for c in status["conditions"] if c["type"] == type_)
    return c["status"], c["reason"], c["message"]


@pytest.mark.parametrize(
    ("case", "deployments", "pods", "type_", "reason", "message"),
    [
        (
            "workers asking for more GPUs than any node has",
            {**READY, "f-worker": live("f-worker", replicas=2, ready=0)},
            [
                UNSCHEDULABLE_POD,
                {**UNSCHEDULABLE_POD, "metadata": {**UNSCHEDULABLE_POD["metadata"], "name": "z"}},
            ],
            "WorkersReady",
            "Unschedulable",
            f"Deployment f-worker (0/2 ready): pod f-worker-a: {NO_GPU} (and 1 more pods)",
        ),
        (
            "the ReplicaSet controller cannot create the frontend's pods",
            {
                **READY,
                "f-frontend": live(
                    "f-frontend",
                    replicas=0,
                    ready=0,
                    updated=0,
                    conditions=[cond("ReplicaFailure", "True", "FailedCreate", QUOTA)],
                ),
            },
            [],
            "FrontendReady",
            "ReplicaFailure",
            f"Deployment f-frontend cannot create pods (0/1 ready): {QUOTA}",
        ),
        (
            "a rollout past its progress deadline",
            {
                **READY,
                "f-worker": live(
                    "f-worker",
                    replicas=2,
                    ready=1,
                    conditions=[cond("Progressing", "False", "ProgressDeadlineExceeded", DEADLINE)],
                ),
            },
            [READY_POD, LOADING_POD],
            "WorkersReady",
            "ProgressDeadlineExceeded",
            f"Deployment f-worker (2/2 updated, 1/2 ready, 1/2 available): {DEADLINE}; "
            "pod f-worker-j: container worker is running, not ready yet",
        ),
        (
            "the router's image cannot be pulled",
            {**READY, "f-router": live("f-router", replicas=1, ready=0)},
            [
                pod(
                    "f-router-a",
                    "router",
                    containers=[waiting("router", "ImagePullBackOff", "Back-off pulling image")],
                )
            ],
            "RouterReady",
            "ImagePullBackOff",
            "Deployment f-router (0/1 ready): pod f-router-a: container router: "
            "Back-off pulling image",
        ),
        (
            "the master crash-loops",
            {**READY, "f-mooncake": live("f-mooncake", replicas=1, ready=0)},
            [
                pod(
                    "f-mooncake-a",
                    "mooncake-master",
                    containers=[waiting("master", "CrashLoopBackOff")],
                )
            ],
            "KvStoreReady",
            "CrashLoopBackOff",
            "Deployment f-mooncake (0/1 ready): pod f-mooncake-a: container master keeps exiting",
        ),
        (
            "the probe init container fails",
            {**READY, "f-worker": live("f-worker", replicas=2, ready=1)},
            [READY_POD, INIT_FAILED_POD],
            "WorkersReady",
            "InitContainerFailed",
            "Deployment f-worker (1/2 ready): pod f-worker-e: init container probe failed, "
            "exit code 127 (Error): kvretention: not found",
        ),
        (
            "every pod updated, one still loading the model",
            {**READY, "f-worker": live("f-worker", replicas=2, ready=1)},
            [READY_POD, LOADING_POD],
            "WorkersReady",
            "PodsStarting",
            "Deployment f-worker: 2/2 updated, 1/2 ready, 1/2 available; "
            "pod f-worker-j: container worker is running, not ready yet",
        ),
        (
            "a rollout half-way, its new pod probing",
            {**READY, "f-worker": live("f-worker", replicas=3, ready=2, updated=1)},
            [READY_POD, PROBING_POD],
            "WorkersReady",
            "RollingOut",
            "Deployment f-worker: 1/2 updated, 2/2 ready, 2/2 available; "
            "pod f-worker-i: init container probe running",
        ),
        (
            "a ready component ignores an evicted pod its ReplicaSet already replaced",
            READY,
            [READY_POD, EVICTED_POD],
            "WorkersReady",
            "PodsReady",
            "all pods ready (f-worker 2/2)",
        ),
        (
            "another component's broken pod is not the workers' reason",
            {**READY, "f-worker": live("f-worker", replicas=2, ready=1)},
            [pod("f-router-a", "router", containers=[waiting("r", "CrashLoopBackOff")])],
            "WorkersReady",
            "PodsNotReady",
            "Deployment f-worker: 2/2 updated, 1/2 ready, 1/2 available",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) and " " in v else "",
)
def test_component_reasons(
    case: str,
    deployments: dict[str, Any],
    pods: list[dict[str, Any]],
    type_: str,
    reason: str,
    message: str,
) -> None:
    status = status_of(deployments, pods)
    assert condition(status, type_) == (
        "True" if reason == "PodsReady" else "False",
        reason,
        message,
    ), case
    if reason != "PodsReady":
        # Ready names the same reason, and the fleet is not "Converged" while pods are missing.
        assert condition(status, "Ready")[1] == reason
        assert condition(status, "Progressing")[:2] != ("False", "Converged")


def test_unschedulable_workers_keep_progressing_true_and_say_why() -> None:
    status = status_of(
        {**READY, "f-worker": live("f-worker", replicas=2, ready=0)}, [UNSCHEDULABLE_POD]
    )
    assert condition(status, "Progressing") == (
        "True",
        "RollingOut",
        "rolling out: f-worker (2/2 updated, 0/2 ready, 0/2 available, Unschedulable)",
    )
    assert status["workers"]["pools"] == [
        {
            "name": "f-worker",
            "role": "worker",
            "ready": 0,
            "desired": 2,
            "updated": 2,
            "available": 0,
            "reason": "Unschedulable",
            "message": f"Deployment f-worker (0/2 ready): pod f-worker-a: {NO_GPU}",
        }
    ]
    assert status["workersReady"] == "0/2"


def test_a_deadline_the_deployment_controller_declared_stops_progressing() -> None:
    stuck = live(
        "f-worker",
        replicas=2,
        ready=0,
        conditions=[cond("Progressing", "False", "ProgressDeadlineExceeded", DEADLINE)],
    )
    status = status_of({**READY, "f-worker": stuck}, [UNSCHEDULABLE_POD])
    assert condition(status, "Progressing") == (
        "False",
        "ProgressDeadlineExceeded",
        f"Deployment f-worker: {DEADLINE}",
    )
    # The deadline outranks the pods: the Deployment controller has given up on this rollout.
    assert condition(status, "WorkersReady")[1] == "ProgressDeadlineExceeded"


def test_each_worker_pool_has_its_own_reason() -> None:
    desired = [
        fleet_deployment("f-frontend", "frontend", 1),
        fleet_deployment("f-router", "router", 1),
        fleet_deployment("f-prefill", "worker-prefill", 1),
        fleet_deployment("f-decode", "worker-decode", 2),
    ]
    fleet = replace(FLEET, desired=desired, kvstore_external="m:1")
    deployments = {
        "f-frontend": READY["f-frontend"],
        "f-router": READY["f-router"],
        "f-prefill": live("f-prefill", replicas=1, ready=0),
        "f-decode": live("f-decode", replicas=2, ready=1),
    }
    prefill = pod(
        "f-prefill-a",
        "worker-prefill",
        scheduled=cond("PodScheduled", "False", "Unschedulable", NO_GPU),
    )
    decode = {**LOADING_POD, "metadata": {**LOADING_POD["metadata"], "name": "f-decode-a"}}
    decode["metadata"]["labels"] = {INSTANCE: "f", COMPONENT: "worker-decode"}
    status = compute_status(
        fleet,
        Observed(deployments=deployments, pods=[decode, prefill]),
        previous=None,
        now=T0,
    )
    KvRetentionDeploymentStatus.model_validate(status)
    pools = {p["name"]: (p["reason"], p["ready"], p["desired"]) for p in status["workers"]["pools"]}
    assert pools == {
        "f-prefill": ("Unschedulable", 0, 1),
        "f-decode": ("PodsStarting", 1, 2),
    }
    # The pool whose check ranks first (a problem before a pod still starting) names the reason.
    assert condition(status, "WorkersReady")[1] == "Unschedulable"
    assert "f-prefill" in condition(status, "WorkersReady")[2]


# -- events ----------------------------------------------------------------------------------------


def test_a_new_fleet_starting_up_posts_no_event_and_a_problem_posts_a_warning() -> None:
    nothing = compute_status(FLEET, Observed(), previous=None, now=T0)
    assert transitions(None, nothing) == []  # NotCreated, RollingOut: nothing to say yet

    stuck_pods = Observed(
        deployments={**READY, "f-worker": live("f-worker", replicas=2, ready=0)},
        pods=[UNSCHEDULABLE_POD],
    )
    stuck = compute_status(FLEET, stuck_pods, previous=nothing, now=T1)
    posted = {c["type"]: c["reason"] for c in transitions(nothing, stuck)}
    # Frontend, router and master turned ready; the workers stayed False, now for a problem.
    assert posted == {
        "FrontendReady": "PodsReady",
        "RouterReady": "PodsReady",
        "KvStoreReady": "PodsReady",
        "WorkersReady": "Unschedulable",
        "Ready": "Unschedulable",
    }
    warned = [c for c in transitions(nothing, stuck) if is_problem(c)]
    assert {c["type"] for c in warned} == {"WorkersReady", "Ready"}

    # The kubelet's reason moving between problems (ErrImagePull <-> ImagePullBackOff) posts
    # nothing more; recovering flips the status and posts a Normal event.
    other = compute_status(
        FLEET,
        Observed(
            deployments={**READY, "f-worker": live("f-worker", replicas=2, ready=0)},
            pods=[IMAGE_POD],
        ),
        previous=stuck,
        now=T1,
    )
    assert condition(other, "WorkersReady")[1] == "ImagePullBackOff"
    assert transitions(stuck, other) == []
    healthy = compute_status(FLEET, Observed(deployments=READY), previous=other, now=T1)
    back = {c["type"]: c["status"] for c in transitions(other, healthy)}
    assert back == {"WorkersReady": "True", "Ready": "True", "Progressing": "False"}

    # A first status that already shows a problem is worth a Warning, though nothing flipped.
    first = compute_status(FLEET, stuck_pods, previous=None, now=T0)
    assert {c["type"] for c in transitions(None, first) if is_problem(c)} == {
        "WorkersReady",
        "Ready",
    }


def test_a_stuck_fleet_is_a_fixed_point() -> None:
    observed = Observed(
        deployments={**READY, "f-worker": live("f-worker", replicas=2, ready=0)},
        pods=[UNSCHEDULABLE_POD, IMAGE_POD],
    )
    first = compute_status(FLEET, observed, previous=None, now=T0)
    assert compute_status(FLEET, observed, previous=first, now=T1) == first
    assert transitions(first, first) == []
