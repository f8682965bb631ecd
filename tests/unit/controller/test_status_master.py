"""The managed master's restart: a new pod template (a soft-pin or eviction setting, an image)
restarts the one process that holds the L3 tier, and ``KvStoreReady`` says so while it happens.

Deployment bodies are shaped as the API server returns them through a ``Recreate`` rollout: the
operator's apply (``generation`` ahead of ``observedGeneration``), the old ReplicaSet scaled down
(its pod still counted, then terminating), the new pod starting, ready.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from fake_kube import fleet_deployment, rolled_out

from kvretention.api.models import KvRetentionDeploymentStatus
from kvretention.controller.conditions import MASTER_RESTARTING, Verdict, check_kvstore
from kvretention.controller.diagnosis import observe_workload
from kvretention.controller.planner import event_type
from kvretention.controller.status import Fleet, Observed, compute_status, transitions

T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
COMPONENT = "app.kubernetes.io/component"
INSTANCE = "app.kubernetes.io/instance"
DROPPED = (
    "the Mooncake master is restarting with a new pod template: the objects and soft pins it "
    "held are dropped (workers stay up and serve without them); "
)


def live(
    *,
    generation: int = 2,
    observed: int | None = 2,
    replicas: int = 1,
    updated: int = 1,
    ready: int = 1,
) -> dict[str, Any]:
    """The master Deployment; ``observed=None``: the Deployment controller has not synced it."""
    status: dict[str, Any] = {
        "replicas": replicas,
        "updatedReplicas": updated,
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    if observed is not None:
        status["observedGeneration"] = observed
    return {"metadata": {"name": "f-mooncake", "generation": generation}, "status": status}


def master_pod(name: str, *, terminating: bool = False, state: str = "running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {INSTANCE: "f", COMPONENT: "mooncake-master"}}
    if terminating:
        meta["deletionTimestamp"] = "2025-01-01T12:00:00Z"
    container_state = {"waiting": {"reason": state}} if state != "running" else {"running": {}}
    return {
        "metadata": meta,
        "status": {
            "phase": "Running" if state == "running" else "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "False"},
            ],
            "containerStatuses": [
                {"name": "mooncake-master", "ready": False, "state": container_state}
            ],
        },
    }


MASTER = fleet_deployment("f-mooncake", "mooncake-master")
OLD_POD_LEAVING = master_pod("f-mooncake-old", terminating=True)
NEW_POD_CREATING = master_pod("f-mooncake-new", state="ContainerCreating")
NEW_POD_RUNNING = master_pod("f-mooncake-new")
NEW_POD_PULL_FAILS = master_pod("f-mooncake-new", state="ImagePullBackOff")

READY = live()
APPLIED = live(generation=3, observed=2)  # the operator's apply, as the API server answers it
OLD_POD_COUNTED = live(updated=0, ready=0)  # Recreate scaled the old ReplicaSet down
NO_POD_COUNTED = live(replicas=0, updated=0, ready=0)  # the old pod terminating, no new one
NEW_POD = live(ready=0)  # the new ReplicaSet's pod starting
FIRST = live(generation=1, observed=None, replicas=0, updated=0, ready=0)


CASES = [
    ("converged", READY, [], False, "PodsReady", "all pods ready (f-mooncake 1/1)"),
    (
        "the operator just applied a new template",
        APPLIED,
        [],
        False,
        MASTER_RESTARTING,
        "Deployment f-mooncake: spec change not seen yet",
    ),
    (
        "the old pod still counted, none updated",
        OLD_POD_COUNTED,
        [],
        False,
        MASTER_RESTARTING,
        "Deployment f-mooncake: 0/1 updated, 0/1 ready, 0/1 available",
    ),
    (
        "the old pod terminating, no new pod yet",
        NO_POD_COUNTED,
        [OLD_POD_LEAVING],
        False,
        MASTER_RESTARTING,
        "Deployment f-mooncake: 0/1 updated, 0/1 ready, 0/1 available",
    ),
    (
        "the new pod starting, after the restart was seen",
        NEW_POD,
        [NEW_POD_CREATING],
        True,
        MASTER_RESTARTING,
        "Deployment f-mooncake: 1/1 updated, 0/1 ready, 0/1 available; "
        "pod f-mooncake-new: container mooncake-master (ContainerCreating)",
    ),
    (
        "the new pod ready ends it",
        READY,
        [],
        True,
        "PodsReady",
        "all pods ready (f-mooncake 1/1)",
    ),
    (
        "a problem still names itself during the restart",
        NEW_POD,
        [NEW_POD_PULL_FAILS],
        True,
        "ImagePullBackOff",
        "Deployment f-mooncake (0/1 ready): pod f-mooncake-new: container mooncake-master: "
        "cannot pull",
    ),
    (
        "a master not ready without a new template is no restart",
        NEW_POD,
        [NEW_POD_RUNNING],
        False,
        "PodsStarting",
        "Deployment f-mooncake: 1/1 updated, 0/1 ready, 0/1 available; "
        "pod f-mooncake-new: container mooncake-master is running, not ready yet",
    ),
    (
        "a first master, not synced yet, is no restart",
        FIRST,
        [],
        False,
        "RollingOut",
        "Deployment f-mooncake: spec change not seen yet",
    ),
    (
        "a first master, its pod not created yet, is no restart",
        live(generation=1, observed=1, replicas=0, updated=0, ready=0),
        [],
        False,
        "RollingOut",
        "Deployment f-mooncake: 0/1 updated, 0/1 ready, 0/1 available",
    ),
    (
        "a first master starting is no restart",
        live(generation=1, observed=1, ready=0),
        [NEW_POD_CREATING],
        False,
        "PodsStarting",
        "Deployment f-mooncake: 1/1 updated, 0/1 ready, 0/1 available; "
        "pod f-mooncake-new: container mooncake-master (ContainerCreating)",
    ),
    (
        "a master deleted mid-restart is not created",
        None,
        [],
        True,
        "NotCreated",
        "Deployment f-mooncake does not exist yet",
    ),
]


@pytest.mark.parametrize(
    ("case", "deployment_", "pods", "was_restarting", "reason", "detail"),
    CASES,
    ids=[c[0] for c in CASES],
)
def test_kvstore_reason_through_a_master_rollout(
    case: str,
    deployment_: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    was_restarting: bool,
    reason: str,
    detail: str,
) -> None:
    verdict = check_kvstore(
        [observe_workload(MASTER, deployment_)], pods, external=None, was_restarting=was_restarting
    )
    assert (verdict.status, verdict.reason) == (
        "True" if reason == "PodsReady" else "False",
        reason,
    ), case
    prefix = DROPPED if reason == MASTER_RESTARTING else ""
    assert verdict.message == prefix + detail


@pytest.mark.parametrize("was_restarting", [False, True])
def test_an_external_master_is_not_ours_to_restart(was_restarting: bool) -> None:
    verdict = check_kvstore(
        [observe_workload(MASTER, APPLIED)],
        [OLD_POD_LEAVING],
        external="m:50051",
        was_restarting=was_restarting,
    )
    assert verdict == Verdict("True", "External", "using the external Mooncake master at m:50051")


# -- the whole status through one restart ----------------------------------------------------------


OTHERS = {name: rolled_out(name) for name in ("f-frontend", "f-router", "f-worker")}
DESIRED = [
    fleet_deployment("f-frontend", "frontend"),
    fleet_deployment("f-router", "router"),
    fleet_deployment("f-worker", "worker"),
    MASTER,
]
FLEET = Fleet(name="f", namespace="ns", generation=1, hints_required=False, desired=DESIRED)
EXTERNAL = Fleet(
    name="f",
    namespace="ns",
    generation=1,
    hints_required=False,
    desired=DESIRED[:3],
    kvstore_external="m:50051",
)

# Each step as the reconcile sees it: the master Deployment and the fleet's pods.
ROLLOUT = [
    (APPLIED, []),
    (OLD_POD_COUNTED, [OLD_POD_LEAVING]),
    (NO_POD_COUNTED, [OLD_POD_LEAVING]),
    (NEW_POD, [NEW_POD_CREATING]),
    (NEW_POD, [NEW_POD_RUNNING]),
]


def condition(status: dict[str, Any], type_: str) -> tuple[str, str]:
    c = next(c for c in status["conditions"] if c["type"] == type_)
    return c["status"], c["reason"]


def test_a_restart_reads_master_restarting_throughout_with_normal_events_on_the_flips() -> None:
    def step(master: dict[str, Any], pods: list[dict[str, Any]], previous: Any) -> Any:
        status = compute_status(
            FLEET,
            Observed(deployments={**OTHERS, "f-mooncake": master}, pods=pods),
            previous=previous,
            now=T0,
        )
        KvRetentionDeploymentStatus.model_validate(status)
        return status

    converged = step(READY, [], None)
    assert condition(converged, "Ready") == ("True", "ReadyWithoutKvHints")

    previous, posted = converged, []
    for master, pods in ROLLOUT:
        status = step(master, pods, previous)
        # Ready follows KvStoreReady (a rollout of any component is not Ready), and Argo CD,
        # kstatus and kubectl see a rollout in progress.
        assert condition(status, "KvStoreReady") == ("False", MASTER_RESTARTING)
        assert condition(status, "Ready") == ("False", MASTER_RESTARTING)
        assert condition(status, "Progressing") == ("True", "RollingOut")
        assert condition(status, "WorkersReady") == ("True", "PodsReady")
        posted += [(c["type"], c["reason"], event_type(c)) for c in transitions(previous, status)]
        previous = status
    # One Event per flip, all on the first step, each Normal: the user asked for the change.
    assert posted == [
        ("Ready", MASTER_RESTARTING, "Normal"),
        ("KvStoreReady", MASTER_RESTARTING, "Normal"),
        ("Progressing", "RollingOut", "Normal"),
    ]

    back = step(READY, [], previous)
    assert condition(back, "KvStoreReady") == ("True", "PodsReady")
    assert condition(back, "Ready") == ("True", "ReadyWithoutKvHints")
    assert [(c["type"], event_type(c)) for c in transitions(previous, back)] == [
        ("Ready", "Normal"),
        ("KvStoreReady", "Normal"),
        ("Progressing", "Normal"),
    ]
    # Converged again, nothing of the restart is left behind.
    assert step(READY, [], back) == back


def test_an_external_master_fleet_never_reads_master_restarting() -> None:
    status = compute_status(
        EXTERNAL,
        Observed(deployments={**OTHERS, "f-mooncake": APPLIED}, pods=[OLD_POD_LEAVING]),
        previous=None,
        now=T0,
    )
    assert condition(status, "KvStoreReady") == ("True", "External")
    assert condition(status, "Ready") == ("True", "ReadyWithoutKvHints")
