"""Why a fleet is not ready, from the real cluster: the scheduler's and the controllers' own words.

The local plane runs the real kube-scheduler and kube-controller-manager, and kwok's fake node
advertises a fixed number of ``nvidia.com/gpu``: a worker that asks for more GPUs than that is
refused by the scheduler exactly as on a GPU cluster, and a ResourceQuota that forbids pods makes
the ReplicaSet controller fail exactly as a real one does.

Worker Deployments get ``progressDeadlineSeconds`` from ``workers.startupTimeoutSeconds`` (or
``workers.rollout.progressDeadlineSeconds``), so a worker loading a large model is not a stuck
rollout. The real kube-controller-manager runs that clock too: a fleet with the shortest deadline
the schema allows and a worker the scheduler cannot place must reach the fleet's status as
``ProgressDeadlineExceeded``, and recover once the workers fit. One operator (all namespaces, a
3 s resync) serves the module; each test has its own namespace.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from operator_fixtures import (
    CRD_PATH,
    GPU,
    Fleets,
    Operator,
    fleets_fixture,
    load_example,
    most_gpus_on_a_node,
    operator_fixture,
)

from kvretention.api.names import FIELD_MANAGER
from support.controlplane import ApplyCrd, wait_until

pytestmark = pytest.mark.integration

RESYNC_S = 3.0
SHORTEST_STARTUP_S = 60
SHORTEST_DEADLINE_S = SHORTEST_STARTUP_S + 1
DEADLINE_WAIT_S = SHORTEST_DEADLINE_S + 240.0
"""The deadline itself, then generous room for a loaded machine's controller and operator."""


operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def our_events(fleets: Fleets, name: str) -> list[Any]:
    events = fleets.core.list_namespaced_event(
        fleets.ns, field_selector=f"involvedObject.name={name}"
    ).items
    return [e for e in events if e.reporting_component == "kvretention-operator"]


def create_unschedulable(fleets: Fleets, name: str, **workers: Any) -> int:
    """Create fleet ``name`` (with these ``spec.workers`` fields) whose workers ask for one GPU
    more than any node has, and wait for its worker Deployment; returns the GPUs asked for."""
    too_many = most_gpus_on_a_node(fleets.core) + 1
    body = load_example("aggregated", name=name)
    body["spec"]["workers"].update(workers)
    body["spec"]["workers"].setdefault("aggregated", {})["tensorParallelSize"] = too_many
    fleets.create(body)
    wait_until(
        "the worker Deployment",
        lambda: ("Deployment", f"{name}-worker") in fleets.children(name),
    )
    return too_many


def fit_the_workers(fleets: Fleets, name: str, **wait: Any) -> None:
    """Ask for what fits and wait (``wait``: :meth:`Fleets.wait_condition`'s options) until the
    workers are ready, the fleet serves and its rollout is over."""
    fleets.patch_spec(name, {"workers": {"aggregated": {"tensorParallelSize": 1}}})
    for type_, status, reason in (
        ("WorkersReady", "True", "PodsReady"),
        ("Ready", "True", None),
        ("Progressing", "False", "Converged"),
    ):
        fleets.wait_condition(name, type_, status, reason=reason, **wait)


def owns(deployment: dict[str, Any], manager: str, field: str) -> bool:
    """Whether ``manager``'s server-side apply entry owns ``spec.<field>``."""
    return any(
        entry.get("manager") == manager
        and f"f:{field}" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})
        for entry in deployment["metadata"].get("managedFields") or []
    )


def still_running(operator: Operator) -> Callable[[], None]:
    """A ``while_waiting`` hook: an operator that exited fails the wait now, with its log, instead
    of at the end of a long timeout."""

    def check() -> None:
        if not operator.process.alive():
            raise AssertionError(f"the operator exited:\n{operator.process.log()[-4000:]}")

    return check


def deployment_condition(deployment: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in (deployment.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            found: dict[str, Any] = cond
            return found
    return {}


def test_workers_asking_for_more_gpus_than_a_node_has_say_so_and_recover(
    operator: Operator, fleets: Fleets
) -> None:
    too_many = create_unschedulable(fleets, "greedy")
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
    # The Deployment controller counts the updated pods after the scheduler has refused them: the
    # message follows once its status does.
    stuck = "greedy-worker (2/2 updated, 0/2 ready, 0/2 available, Unschedulable)"
    progressing = wait_until(
        "Progressing to name the stuck rollout",
        lambda: (c := fleets.conditions("greedy")["Progressing"]) and stuck in c["message"] and c,
    )
    assert (progressing["status"], progressing["reason"]) == ("True", "RollingOut"), progressing

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
    fit_the_workers(fleets, "greedy", timeout_s=120)
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


def test_the_api_server_checks_the_startup_window_and_the_deadline(
    fleets: Fleets, apply_crd: ApplyCrd
) -> None:
    apply_crd(CRD_PATH)
    cases = [
        (
            {"startupTimeoutSeconds": 120, "rollout": {"progressDeadlineSeconds": 120}},
            "workers.rollout.progressDeadlineSeconds must exceed workers.startupTimeoutSeconds",
        ),
        # The defaulted startup window (1800 s) counts too.
        (
            {"rollout": {"progressDeadlineSeconds": 600}},
            "workers.rollout.progressDeadlineSeconds must exceed workers.startupTimeoutSeconds",
        ),
        ({"startupTimeoutSeconds": SHORTEST_STARTUP_S - 1}, "greater than or equal to 60"),
        ({"startupTimeoutSeconds": 86401}, "less than or equal to 86400"),
    ]
    for workers, message in cases:
        body = load_example("aggregated", name="refused")
        body["spec"]["workers"].update(workers)
        with pytest.raises(ApiException) as err:
            fleets.create(body)
        assert err.value.status == 422, workers
        assert message in str(err.value.body), err.value.body

    # null is "unset" (the schema is nullable, as every optional field is): the rule lets it pass.
    body = load_example("aggregated", name="derived")
    body["spec"]["workers"]["rollout"] = {"progressDeadlineSeconds": None}
    created = fleets.create(body)
    assert created["spec"]["workers"]["startupTimeoutSeconds"] == 1800  # the API server's default


def test_an_unschedulable_worker_past_its_deadline_says_so_and_recovers(
    operator: Operator, fleets: Fleets
) -> None:
    create_unschedulable(
        fleets,
        "stuck",
        startupTimeoutSeconds=SHORTEST_STARTUP_S,
        rollout={"progressDeadlineSeconds": SHORTEST_DEADLINE_S},
    )

    # The operator renders and owns the deadline and the startup probe it derives from the spec.
    worker = fleets.deployment("stuck-worker")
    assert worker["spec"]["progressDeadlineSeconds"] == SHORTEST_DEADLINE_S
    (container,) = worker["spec"]["template"]["spec"]["containers"]
    assert container["startupProbe"]["periodSeconds"] == 10
    assert container["startupProbe"]["failureThreshold"] == SHORTEST_STARTUP_S // 10
    assert owns(worker, FIELD_MANAGER, "progressDeadlineSeconds"), worker["metadata"]
    # The frontend does not load a model: it keeps the API server's default deadline.
    assert fleets.deployment("stuck-frontend")["spec"]["progressDeadlineSeconds"] == 600

    # The Deployment controller's clock runs out, and its verdict reaches the fleet's status:
    # ahead of the pods' Unschedulable, with the scheduler's message still quoted.
    workers_ready = fleets.wait_condition(
        "stuck",
        "WorkersReady",
        "False",
        reason="ProgressDeadlineExceeded",
        timeout_s=DEADLINE_WAIT_S,
        while_waiting=still_running(operator),
    )
    progressing = deployment_condition(fleets.deployment("stuck-worker"), "Progressing")
    assert (progressing["status"], progressing["reason"]) == (
        "False",
        "ProgressDeadlineExceeded",
    ), progressing
    assert workers_ready["message"].startswith("Deployment stuck-worker ("), workers_ready
    assert "has timed out progressing" in workers_ready["message"], workers_ready
    assert f"Insufficient {GPU}" in workers_ready["message"], workers_ready
    ready = fleets.wait_condition("stuck", "Ready", "False", reason="ProgressDeadlineExceeded")
    assert "stuck-worker" in ready["message"], ready
    fleet_progressing = fleets.wait_condition(
        "stuck", "Progressing", "False", reason="ProgressDeadlineExceeded"
    )
    assert "Deployment stuck-worker" in fleet_progressing["message"], fleet_progressing
    (pool,) = fleets.get("stuck")["status"]["workers"]["pools"]
    assert (pool["name"], pool["reason"]) == ("stuck-worker", "ProgressDeadlineExceeded"), pool

    # One Warning when WorkersReady turned into a problem: Unschedulable as a rule, since the
    # operator sees the pending pods before the deadline passes; a later change of the problem's
    # reason posts no second one (docs/operator.md).
    def workers_warnings() -> set[str]:
        return {
            e.reason
            for e in our_events(fleets, "stuck")
            if e.type == "Warning" and e.message.startswith("WorkersReady is False")
        }

    assert wait_until("a WorkersReady warning", workers_warnings) <= {
        "Unschedulable",
        "ProgressDeadlineExceeded",
    }

    # Workers that fit: a new ReplicaSet makes progress, the Deployment controller clears its
    # verdict, and the fleet serves.
    fit_the_workers(
        fleets, "stuck", timeout_s=DEADLINE_WAIT_S, while_waiting=still_running(operator)
    )
