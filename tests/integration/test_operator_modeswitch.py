"""Switching an existing fleet between aggregated and disaggregated workers, against the real plane.

The operator must delete what the old mode owned (the aggregated worker Deployment and Service)
and create the new pools, with nothing left behind: no stray Deployment, Service, ReplicaSet or
Pod of the old mode, and the fleet Ready again, in both directions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_fixtures import (
    GOOD_REPORT,
    Fleets,
    Operator,
    load_example,
    own_fleets_fixture,
    start_operator,
)

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources import build_children
from support.controlplane import Cluster, wait_until

pytestmark = pytest.mark.integration

NAME = "switch"
TO_DISAGGREGATED: dict[str, Any] = {
    "workers": {
        "mode": "disaggregated",
        "replicas": 1,  # the decode pool
        "prefill": {"replicas": 1},
        "decode": {},
    }
}
TO_AGGREGATED: dict[str, Any] = {
    "workers": {"mode": "aggregated", "replicas": 2, "prefill": None, "decode": None}
}
POOL_KINDS = ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy")
AGGREGATED_ONLY = {(kind, f"{NAME}-worker") for kind in POOL_KINDS}
DISAGGREGATED_ONLY = {
    (kind, f"{NAME}-{pool}") for kind in POOL_KINDS for pool in ("prefill", "decode")
}


fleets = own_fleets_fixture()


@pytest.fixture
def operator(cluster: Cluster, fleets: Fleets, tmp_path: Path) -> Iterator[Operator]:
    op = start_operator(
        cluster, tmp_path, f"--namespace={fleets.ns}", "--no-leader-elect", "--resync-seconds=3"
    )
    try:
        op.wait_ready()
        yield op
    finally:
        code = op.stop()
        print(f"--- operator (exit {code}) {op.log_path}:\n{op.process.log()[-3000:]}")


def expected_children(fleets: Fleets) -> set[tuple[str, str]]:
    cr = KvRetentionDeployment.from_k8s(fleets.get(NAME))
    return {(m["kind"], m["metadata"]["name"]) for m in build_children(cr)}


def namespace_objects(fleets: Fleets) -> dict[str, set[str]]:
    """Every Deployment, Service, ConfigMap, ReplicaSet and Pod in the namespace, labelled or not."""
    ns = fleets.ns
    return {
        "Deployment": {d.metadata.name for d in fleets.apps.list_namespaced_deployment(ns).items},
        "Service": {s.metadata.name for s in fleets.core.list_namespaced_service(ns).items},
        "ConfigMap": {
            c.metadata.name
            for c in fleets.core.list_namespaced_config_map(ns).items
            if c.metadata.name != "kube-root-ca.crt"
        },
        "ReplicaSet": {
            ref.name
            for rs in fleets.apps.list_namespaced_replica_set(ns).items
            for ref in rs.metadata.owner_references or []
        },
        "Pod": {
            (p.metadata.labels or {}).get("app.kubernetes.io/component", "?")
            for p in fleets.core.list_namespaced_pod(ns).items
        },
    }


def converged(fleets: Fleets, *, worker_components: set[str]) -> dict[str, set[str]] | None:
    """The namespace holds exactly the CR's children (and their ReplicaSets and Pods), or None."""
    want = expected_children(fleets)
    have = namespace_objects(fleets)
    deployments = {n for kind, n in want if kind == "Deployment"}
    ok = (
        set(fleets.children(NAME)) == want
        and have["Deployment"] == deployments
        and have["Service"] == {n for kind, n in want if kind == "Service"}
        and have["ConfigMap"] == {n for kind, n in want if kind == "ConfigMap"}
        and have["ReplicaSet"] == deployments  # no ReplicaSet of a deleted Deployment
        and have["Pod"] == {"frontend", "router", "mooncake-master", *worker_components}
    )
    return have if ok else None


def switch_and_converge(
    fleets: Fleets, patch: dict[str, Any], *, worker_components: set[str]
) -> dict[str, Any]:
    generation = fleets.patch_spec(NAME, patch)["metadata"]["generation"]
    fleets.wait_condition(
        NAME,
        "Ready",
        "True",
        reason="Ready",
        generation=generation,
        timeout_s=45,
        reporting=GOOD_REPORT,
    )
    fleets.wait_condition(
        NAME, "Progressing", "False", reason="Converged", generation=generation, timeout_s=30
    )
    wait_until(
        f"namespace holds only the {sorted(worker_components)} fleet's objects",
        lambda: converged(fleets, worker_components=worker_components),
        timeout_s=30,
    )
    cr = fleets.get(NAME)
    assert cr["status"]["observedGeneration"] == generation
    return cr


def test_switch_aggregated_to_disaggregated_and_back(operator: Operator, fleets: Fleets) -> None:
    fleets.create(load_example("aggregated", name=NAME))
    fleets.wait_condition(
        NAME, "Ready", "True", reason="Ready", timeout_s=45, reporting=GOOD_REPORT
    )
    wait_until(
        "the aggregated fleet's objects",
        lambda: converged(fleets, worker_components={"worker"}),
        timeout_s=30,
    )
    assert set(fleets.children(NAME)) >= AGGREGATED_ONLY
    shared_before = {
        key: obj["metadata"]["uid"]
        for key, obj in fleets.children(NAME).items()
        if key not in AGGREGATED_ONLY
    }
    deletes_before = operator.metric_sum("kvretention_operator_deletes_total")

    cr = switch_and_converge(
        fleets, TO_DISAGGREGATED, worker_components={"worker-prefill", "worker-decode"}
    )
    children = set(fleets.children(NAME))
    assert children >= DISAGGREGATED_ONLY
    assert not AGGREGATED_ONLY & children
    assert cr["status"]["workersReady"] == "2/2"
    assert cr["status"]["replicas"] == 1  # the scale subresource now follows the decode pool
    assert "app.kubernetes.io/component=worker-decode" in cr["status"]["selector"]
    # The operator deleted exactly the aggregated-only children.
    deleted = operator.metric_sum("kvretention_operator_deletes_total") - deletes_before
    assert deleted == len(AGGREGATED_ONLY)
    # What both modes share was updated in place, not recreated.
    for key, uid in shared_before.items():
        assert fleets.children(NAME)[key]["metadata"]["uid"] == uid, key
    for kind, child in sorted(AGGREGATED_ONLY):
        assert f"deleted {kind} {fleets.ns}/{child} " in operator.process.log()

    deletes_before = operator.metric_sum("kvretention_operator_deletes_total")
    cr = switch_and_converge(fleets, TO_AGGREGATED, worker_components={"worker"})
    children = set(fleets.children(NAME))
    assert children >= AGGREGATED_ONLY
    assert not DISAGGREGATED_ONLY & children
    assert cr["status"]["workersReady"] == "2/2"
    assert cr["status"]["replicas"] == 2
    assert "app.kubernetes.io/component=worker," in cr["status"]["selector"] + ","
    deleted = operator.metric_sum("kvretention_operator_deletes_total") - deletes_before
    assert deleted == len(DISAGGREGATED_ONLY)
    for key, uid in shared_before.items():
        assert fleets.children(NAME)[key]["metadata"]["uid"] == uid, key
