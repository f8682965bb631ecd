"""Why a fleet is not ready, from the real cluster: the scheduler's and the controllers' own words.

The local plane runs the real kube-scheduler and kube-controller-manager, and kwok's fake node
advertises a fixed number of ``nvidia.com/gpu``: a worker that asks for more GPUs than that is
refused by the scheduler exactly as on a GPU cluster, and a ResourceQuota that forbids pods makes
the ReplicaSet controller fail exactly as a real one does. One operator (all namespaces, a 3 s
resync) serves the module; each test has its own namespace.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from operator_fixtures import (
    GPU,
    Fleets,
    Operator,
    fleets_fixture,
    load_example,
    most_gpus_on_a_node,
    operator_fixture,
)

from support.controlplane import wait_until

pytestmark = pytest.mark.integration

RESYNC_S = 3.0


operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def our_events(fleets: Fleets, name: str) -> list[Any]:
    events = fleets.core.list_namespaced_event(
        fleets.ns, field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.reporting_component == "kvretention-operator"]


def test_workers_asking_for_more_gpus_than_a_node_has_say_so_and_recover(
    operator: Operator, fleets: Fleets
) -> None:
    too_many = most_gpus_on_a_node(fleets.core) + 1
    body = load_example("aggregated", name="greedy")
    body["spec"]["workers"].setdefault("aggregated", {})["tensorParallelSize"] = too_many
    fleets.create(body)
    wait_until(
        "the worker Deployment",
        lambda: ("Deployment", "greedy-worker") in fleets.children("greedy"),
    )
    limits = fleets.deployment("greedy-worker")["spec"]["template"]["spec"]["containers"][0][
        "resources"
    ]["limits"]
    assert limits[GPU] == str(too_many)  # what the scheduler is asked for

    # The scheduler's own message reaches the component condition and Ready.
    workers = fleets.wait_condition("greedy", "WorkersReady", "False", reason="Unschedulable")
    assert f"Insufficient {GPU}" in workers["message"], workers
    assert workers["message"].startswith("Deployment greedy-worker (0/2 ready): pod greedy-worker-")
    ready = fleets.wait_condition("greedy", "Ready", "False", reason="Unschedulable")
    assert f"Insufficient {GPU}" in ready["message"]
    # The rest of the fleet is up; only the workers are stuck, and the fleet is not "Converged".
    fleets.wait_condition("greedy", "FrontendReady", "True")
    progressing = fleets.conditions("greedy")["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut"), progressing
    assert (
        "greedy-worker (2/2 updated, 0/2 ready, 0/2 available, Unschedulable)"
        in (progressing["message"])
    )

    status = fleets.get("greedy")["status"]
    assert status["workersReady"] == "0/2"
    (pool,) = status["workers"]["pools"]
    assert (pool["name"], pool["role"], pool["reason"]) == (
        "greedy-worker",
        "worker",
        "Unschedulable",
    )
    assert (pool["desired"], pool["updated"], pool["ready"], pool["available"]) == (2, 2, 0, 0)
    assert f"Insufficient {GPU}" in pool["message"]
    assert status["frontend"] == {"ready": 1, "desired": 1, "updated": 1, "available": 1}

    # One Warning per condition that turned into the problem, and no more over later resyncs.
    def warnings() -> list[str]:
        return sorted(
            e.message.split(":")[0]
            for e in our_events(fleets, "greedy")
            if e.type == "Warning" and e.reason == "Unschedulable"
        )

    wait_until("Unschedulable warnings", lambda: len(warnings()) == 2)
    assert warnings() == ["Ready is False", "WorkersReady is False"]
    time.sleep(2 * RESYNC_S + 1)
    assert warnings() == ["Ready is False", "WorkersReady is False"]
    # A fleet coming up warns about nothing else (NotCreated, RollingOut are not problems).
    assert {e.reason for e in our_events(fleets, "greedy") if e.type == "Warning"} == {
        "Unschedulable"
    }

    # Ask for what fits: the workers schedule, kwok runs them, the fleet serves.
    fleets.patch_spec("greedy", {"workers": {"aggregated": {"tensorParallelSize": 1}}})
    fleets.wait_condition("greedy", "WorkersReady", "True", reason="PodsReady", timeout_s=120)
    fleets.wait_condition("greedy", "Ready", "True")
    fleets.wait_condition("greedy", "Progressing", "False", reason="Converged")
    (pool,) = fleets.get("greedy")["status"]["workers"]["pools"]
    assert (pool["reason"], pool["ready"], pool["available"]) == ("PodsReady", 2, 2)
    normal = {(e.reason, e.type) for e in our_events(fleets, "greedy")}
    assert ("PodsReady", "Normal") in normal  # WorkersReady flipped to True


def test_pods_the_replicaset_controller_cannot_create_are_a_replica_failure(
    operator: Operator, fleets: Fleets
) -> None:
    fleets.core.create_namespaced_resource_quota(
        fleets.ns,
        {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}},
    )
    fleets.create(load_example("aggregated", name="quota"))

    # Before this, the fleet read "rolling out 0/1" forever: now the controller's message shows.
    frontend = fleets.wait_condition("quota", "FrontendReady", "False", reason="ReplicaFailure")
    assert frontend["message"].startswith(
        "Deployment quota-frontend cannot create pods (0/1 ready): "
    )
    assert "quota" in frontend["message"], frontend
    ready = fleets.wait_condition("quota", "Ready", "False", reason="ReplicaFailure")
    assert "cannot create pods" in ready["message"]

    def pool() -> dict[str, Any] | None:
        (only,) = fleets.get("quota")["status"]["workers"]["pools"]
        return only if only["reason"] == "ReplicaFailure" else None

    worker_pool = wait_until("the worker pool's ReplicaFailure", pool)
    assert "quota" in worker_pool["message"], worker_pool
    assert fleets.get("quota")["status"]["frontend"]["ready"] == 0
    wait_until(
        "a ReplicaFailure warning",
        lambda: any(
            e.type == "Warning" and e.reason == "ReplicaFailure"
            for e in our_events(fleets, "quota")
        ),
    )
