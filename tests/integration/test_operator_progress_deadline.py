"""A worker Deployment's progress deadline, on the real Deployment controller.

Worker Deployments get ``progressDeadlineSeconds`` from ``workers.startupTimeoutSeconds`` (or
``workers.rollout.progressDeadlineSeconds``), so a worker loading a large model is not a stuck
rollout. Here the real kube-controller-manager runs the clock: a fleet with the shortest deadline
the schema allows and a worker the scheduler cannot place (more GPUs than kwok's node has) must
reach the fleet's status as ``ProgressDeadlineExceeded``, and recover once the workers fit. One
operator (all namespaces, a 3 s resync) serves the module; each test has its own namespace.
"""

from __future__ import annotations

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
    body = load_example("aggregated", name="stuck")
    workers = body["spec"]["workers"]
    workers["startupTimeoutSeconds"] = SHORTEST_STARTUP_S
    workers["rollout"] = {"progressDeadlineSeconds": SHORTEST_DEADLINE_S}
    workers.setdefault("aggregated", {})["tensorParallelSize"] = (
        most_gpus_on_a_node(fleets.core) + 1
    )
    fleets.create(body)

    # The operator renders and owns the deadline and the startup probe it derives from the spec.
    wait_until(
        "the worker Deployment",
        lambda: ("Deployment", "stuck-worker") in fleets.children("stuck"),
    )
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
            for e in fleets.core.list_namespaced_event(
                fleets.ns, field_selector="involvedObject.name=stuck"
            ).items
            if e.reporting_component == "kvretention-operator"
            and e.type == "Warning"
            and e.message.startswith("WorkersReady is False")
        }

    assert wait_until("a WorkersReady warning", workers_warnings) <= {
        "Unschedulable",
        "ProgressDeadlineExceeded",
    }

    # Workers that fit: a new ReplicaSet makes progress, the Deployment controller clears its
    # verdict, and the fleet serves.
    fleets.patch_spec("stuck", {"workers": {"aggregated": {"tensorParallelSize": 1}}})
    for type_, status, reason in (
        ("WorkersReady", "True", "PodsReady"),
        ("Ready", "True", None),
        ("Progressing", "False", "Converged"),
    ):
        fleets.wait_condition(
            "stuck",
            type_,
            status,
            reason=reason,
            timeout_s=DEADLINE_WAIT_S,
            while_waiting=still_running(operator),
        )
