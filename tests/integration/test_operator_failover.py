"""Leader failover after SIGKILL: the standby takes the Lease once it has expired and carries on.

Two operator processes with leader election and a short Lease (``--lease-duration-seconds``); the
leader is killed outright (no Lease release, as on a node loss or OOM kill), a change is made while
nobody leads, and the standby must take over within about one lease duration and reconcile it,
without duplicating or churning what the first leader created.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_fixtures import (
    Fleets,
    Operator,
    load_example,
    operators_fixture,
    own_fleets_fixture,
    replica_sets_per_deployment,
    start_leader_and_standby,
)

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.leader import LEASE_NAME, election_timings
from kvretention.controller.resources import build_children
from support.controlplane import Cluster, wait_until

pytestmark = pytest.mark.integration

LEASE_S = 4
RETRY_S = election_timings(LEASE_S)[1]


fleets = own_fleets_fixture()
operators = operators_fixture()


def lease_spec(fleets: Fleets) -> dict[str, Any]:
    coordination = client.CoordinationV1Api(fleets.core.api_client)
    response = coordination.read_namespaced_lease(LEASE_NAME, fleets.ns, _preload_content=False)
    spec: dict[str, Any] = json.loads(response.data)["spec"]
    return spec


def expected_children(fleets: Fleets, name: str) -> set[tuple[str, str]]:
    cr = KvRetentionDeployment.from_k8s(fleets.get(name))
    return {(m["kind"], m["metadata"]["name"]) for m in build_children(cr)}


def test_standby_takes_over_after_the_leader_is_sigkilled(
    cluster: Cluster, fleets: Fleets, operators: list[Operator], tmp_path: Path
) -> None:
    a, b = start_leader_and_standby(
        cluster, tmp_path, operators, fleets.ns, f"--lease-duration-seconds={LEASE_S}"
    )

    spec = lease_spec(fleets)
    assert spec["holderIdentity"] == a.readyz()["identity"]
    assert spec["leaseDurationSeconds"] == LEASE_S
    transitions = int(spec.get("leaseTransitions") or 0)

    name = "failover"
    fleets.create(load_example("aggregated", name=name))
    fleets.wait_condition(name, "WorkersReady", "True", timeout_s=30)
    fleets.wait_condition(name, "Progressing", "False", reason="Converged", timeout_s=30)
    before = {key: obj["metadata"]["uid"] for key, obj in fleets.children(name).items()}
    assert set(before) == expected_children(fleets, name)
    assert b.metric_sum("kvretention_operator_reconciles_total") == 0

    a.kill()  # SIGKILL: the Lease is not released; b must wait for it to expire
    killed_at = time.monotonic()
    # A change made while nobody leads.
    fleets.patch_spec(name, {"frontend": {"replicas": 2}})

    b_identity = b.readyz()["identity"]
    wait_until(
        "b holds the Lease",
        lambda: lease_spec(fleets).get("holderIdentity") == b_identity,
        timeout_s=LEASE_S * 4,
    )
    took = time.monotonic() - killed_at
    print(f"b took the Lease {took:.1f}s after the SIGKILL")
    # Not before the Lease could have expired (b never steals a live Lease), and not much later:
    # one lease duration after the last renewal it saw plus a poll (slack for a loaded machine).
    assert LEASE_S - 2 * RETRY_S - 0.5 <= took <= 2 * LEASE_S + 2, took
    spec = lease_spec(fleets)
    assert int(spec["leaseTransitions"]) == transitions + 1
    assert spec["leaseDurationSeconds"] == LEASE_S

    b.wait_ready(role="leader", timeout_s=20)

    def frontend_scaled() -> bool:
        status = fleets.get(name).get("status") or {}
        return bool((status.get("frontend") or {}).get("desired") == 2)

    wait_until("the new leader reconciles the change", frontend_scaled, timeout_s=20)
    generation = fleets.get(name)["metadata"]["generation"]
    fleets.wait_condition(name, "Ready", "True", generation=generation, timeout_s=20)
    assert b.metric_sum("kvretention_operator_reconciles_total") > 0
    assert b.metric_sum("kvretention_operator_leader") == 1

    # The same children (same uids: updated in place, nothing deleted and recreated), no extras,
    # and no churned rollout (a replica count change makes no new ReplicaSet).
    after = {key: obj["metadata"]["uid"] for key, obj in fleets.children(name).items()}
    assert after == before
    rs = replica_sets_per_deployment(fleets)
    assert set(rs) == {n for kind, n in before if kind == "Deployment"}
    assert set(rs.values()) == {1}, rs
    assert fleets.deployment(f"{name}-frontend")["spec"]["replicas"] == 2
