"""A multinode fleet where the LeaderWorkerSet CRD is not installed: status says so by name, the
rest of the fleet is created, and installing the LWS controller later is enough (no edit, no
restart of the operator). The module deletes the CRD first, so it holds whichever module ran
before it on the session's plane."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from lws_fixtures import delete_lws_crd, second_node, start_lws, stop_lws
from operator_fixtures import (
    GOOD_REPORT,
    Fleets,
    Operator,
    fleets_fixture,
    load_example,
    operator_fixture,
)

from support.controlplane import Cluster

RESYNC_S = 30.0


@pytest.fixture(scope="module", autouse=True)
def no_lws(k8s: client.ApiClient) -> Iterator[None]:
    """No LWS API when the operator starts, and a second node for when it comes."""
    delete_lws_crd(k8s)
    with second_node(k8s):
        yield


operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def test_status_names_the_missing_crd_until_lws_is_installed(
    operator: Operator, fleets: Fleets, cluster: Cluster, tmp_path_factory: Any
) -> None:
    name = "mn-no-lws"
    body = load_example("aggregated", name=name)
    body["spec"]["workers"].update({"nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 2}})
    fleets.create(body)

    ready = fleets.wait_condition(
        name,
        "Ready",
        "False",
        reason="LeaderWorkerSetMissing",
        timeout_s=120,
        while_waiting=lambda: fleets.inject_probe_reports(name, GOOD_REPORT),
    )
    assert f"LeaderWorkerSet {name}-worker-lws cannot be created" in ready["message"]
    assert "prerequisite only for multinode fleets" in ready["message"]
    workers = fleets.conditions(name)["WorkersReady"]
    assert (workers["status"], workers["reason"]) == ("False", "LeaderWorkerSetMissing")
    children = fleets.children(name)
    for child in (
        ("Deployment", f"{name}-router"),
        ("Deployment", f"{name}-frontend"),
        ("Service", f"{name}-worker"),
        ("PodDisruptionBudget", f"{name}-worker"),
    ):
        assert child in children, child
    events = fleets.core.list_namespaced_event(fleets.ns).items
    assert any(e.reason == "LeaderWorkerSetMissing" and e.type == "Warning" for e in events), [
        (e.type, e.reason) for e in events
    ]

    state_dir = start_lws(cluster, tmp_path_factory)
    try:
        fleets.wait_condition(name, "WorkersReady", "True", timeout_s=180)
        fleets.wait_condition(name, "Ready", "True", timeout_s=120, reporting=GOOD_REPORT)
    finally:
        stop_lws(cluster, state_dir)
