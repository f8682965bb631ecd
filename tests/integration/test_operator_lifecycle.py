"""The operator process's life: SIGKILL mid-reconcile, leader election, losing the Lease.

Each test starts its own operator(s), watching only the test's namespace.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
from kubernetes import client
from operator_fixtures import (
    CRD_PATH,
    Fleets,
    Operator,
    load_example,
    operators_fixture,
    replica_sets_per_deployment,
    start_leader_and_standby,
    start_operator,
)

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from support.controlplane import ApplyCrd, Cluster, wait_until
from support.held_operator import HOLD_LOG

pytestmark = pytest.mark.integration

HELD = 4
"""Applies the first operator gets through before its launcher (support.held_operator) holds the
rest."""


@pytest.fixture
def fleets(k8s: client.ApiClient, namespace: str, apply_crd: ApplyCrd) -> Fleets:
    apply_crd(CRD_PATH)
    return Fleets(k8s, namespace)


operators = operators_fixture()


def expected_children(ns: str, name: str) -> set[tuple[str, str]]:
    cr = KvRetentionDeployment.from_k8s(load_example("aggregated", name=name, namespace=ns))
    return {(m["kind"], m["metadata"]["name"]) for m in build_children(cr)}


def test_sigkill_mid_reconcile_then_restart_converges_without_duplicates(
    cluster: Cluster, fleets: Fleets, operators: list[Operator], tmp_path: Path
) -> None:
    args = (f"--namespace={fleets.ns}", "--no-leader-elect", "--resync-seconds=3")
    # The held operator lets exactly HELD applies through and holds every later one, so the kill
    # lands mid-reconcile by construction (seen in the API server), not by timing.
    first = start_operator(cluster, tmp_path, *args, name="first", hold_after_applies=HELD)
    operators.append(first)
    first.wait_ready()
    names = ["kill-a", "kill-b", "kill-c"]
    for name in names:
        fleets.create(load_example("aggregated", name=name))
    first.process.wait_for_log(HOLD_LOG, timeout_s=30)
    wait_until(
        f"{HELD} children in the cluster",
        lambda: sum(len(fleets.children(n)) for n in names) == HELD,
    )
    first.kill()  # SIGKILL: no cleanup, whatever was in flight is cut off
    partial = sum(len(fleets.children(n)) for n in names)
    assert partial == HELD < sum(len(expected_children(fleets.ns, n)) for n in names)

    second = start_operator(cluster, tmp_path, *args, name="second")
    operators.append(second)
    second.wait_ready()
    for name in names:
        fleets.wait_condition(name, "WorkersReady", "True")
        fleets.wait_condition(name, "Progressing", "False", reason="Converged")
        assert set(fleets.children(name)) == expected_children(fleets.ns, name)

    # No duplicate or churned rollouts: one ReplicaSet per Deployment.
    owners = replica_sets_per_deployment(fleets)
    assert owners and set(owners.values()) == {1}, owners


def test_two_replicas_with_leader_election_do_not_both_act(
    cluster: Cluster, fleets: Fleets, operators: list[Operator], tmp_path: Path
) -> None:
    a, b = start_leader_and_standby(cluster, tmp_path, operators, fleets.ns)

    lease = client.CoordinationV1Api(fleets.core.api_client).read_namespaced_lease(
        "kvretention-operator", fleets.ns
    )
    assert lease.spec is not None
    assert lease.spec.holder_identity == a.readyz()["identity"]

    fleets.create(load_example("aggregated", name="elected"))
    fleets.wait_condition("elected", "WorkersReady", "True")
    # (the counter moves just after the status write the condition came from)
    wait_until("a counts reconciles", lambda: a.metric_sum("kvretention_operator_reconciles_total"))
    assert b.metric_sum("kvretention_operator_reconciles_total") == 0
    assert b.metric_sum("kvretention_operator_leader") == 0

    # A clean stop releases the Lease: the standby takes over at once and carries on.
    assert a.stop() == 0
    b.wait_ready(role="leader", timeout_s=20)
    fleets.patch_spec("elected", {"frontend": {"replicas": 2}})

    def frontend_desired() -> bool:
        status = fleets.get("elected").get("status") or {}
        return bool((status.get("frontend") or {}).get("desired") == 2)

    wait_until("the new leader reconciles", frontend_desired, timeout_s=30)
    wait_until("b counts reconciles", lambda: b.metric_sum("kvretention_operator_reconciles_total"))


def test_losing_the_lease_exits_non_zero(
    cluster: Cluster, fleets: Fleets, operators: list[Operator], tmp_path: Path
) -> None:
    op = start_operator(
        cluster,
        tmp_path,
        f"--namespace={fleets.ns}",
        f"--leader-election-namespace={fleets.ns}",
        name="usurped",
    )
    operators.append(op)
    op.wait_ready(role="leader")
    coordination = client.CoordinationV1Api(fleets.core.api_client)
    lease = coordination.read_namespaced_lease("kvretention-operator", fleets.ns)
    assert lease.spec is not None
    lease.spec.holder_identity = "someone-else"
    lease.spec.lease_duration_seconds = 3600
    lease.spec.renew_time = dt.datetime.now(dt.UTC)
    coordination.replace_namespaced_lease("kvretention-operator", fleets.ns, lease)

    def exited() -> bool:
        return not op.process.alive()

    wait_until("operator exits after losing its Lease", exited, timeout_s=40)
    assert op.process.proc.returncode == 1
    assert "exiting so a standby can lead" in op.process.log()
