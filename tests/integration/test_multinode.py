"""Multinode fleets on the real plane with the real LeaderWorkerSet controller (sigs.k8s.io/lws,
built by scripts/build-lws.sh and started by ``localcluster.lws``): a fleet whose workers span two
nodes becomes Ready, a rank's pod deleted restarts its whole group, a template change rolls the
groups one at a time, and the operator never writes a pod the LWS controller owns.

kwok runs no containers, so every pod turns Ready once scheduled: what is tested here is the
wiring between the operator, the LWS controller (and its webhooks), the scheduler and status.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from lws_fixtures import GROUP, lws_running, second_node
from operator_fixtures import (
    GOOD_REPORT,
    Fleets,
    Operator,
    fleets_fixture,
    load_example,
    operator_fixture,
)

from kvretention.api.names import FIELD_MANAGER
from support.controlplane import Cluster, wait_until
from support.uneven_splits import UNEVEN_SPLITS

RESYNC_S = 30.0
WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"


@pytest.fixture(scope="module", autouse=True)
def lws_controller(
    cluster: Cluster, k8s: client.ApiClient, tmp_path_factory: Any
) -> Iterator[None]:
    """The LWS controller and a second kwok node (one rank per node), for this module only."""
    with second_node(k8s), lws_running(cluster, tmp_path_factory):
        yield


# The LWS controller is started (above) before the operator, so its informer finds the CRD.
operator = operator_fixture(resync_s=RESYNC_S)
fleets = fleets_fixture()


def _multinode(name: str) -> dict[str, Any]:
    body = load_example("aggregated", name=name)
    body["spec"]["workers"].update(
        {"replicas": 2, "nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 2}}
    )
    return body


def _lws(fleets: Fleets, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = fleets.custom.get_namespaced_custom_object(
        GROUP, "v1", fleets.ns, "leaderworkersets", f"{name}-worker-lws"
    )
    return obj


def _pods(fleets: Fleets, name: str) -> list[dict[str, Any]]:
    return [p for p in fleets.worker_pods(name) if not p["metadata"].get("deletionTimestamp")]


def _ready_fleet(fleets: Fleets, name: str) -> dict[str, Any]:
    fleets.create(_multinode(name))
    fleets.wait_condition(name, "WorkersReady", "True", timeout_s=120)
    fleets.wait_condition(
        name, "Ready", "True", reason="Ready", timeout_s=120, reporting=GOOD_REPORT
    )
    return fleets.get(name)


def test_a_two_node_fleet_becomes_ready_with_one_rank_per_node(
    operator: Operator, fleets: Fleets
) -> None:
    name = "mn"
    cr = _ready_fleet(fleets, name)
    status = cr["status"]
    pools = [
        (p["name"], p["reason"], p["ready"], p["nodesPerReplica"])
        for p in status["workers"]["pools"]
    ]
    assert pools == [(f"{name}-worker-lws", "PodsReady", 2, 2)]
    assert status["workersReady"] == "2/2"
    assert status["replicas"] == 2
    assert f"{WORKER_INDEX}=0" in status["selector"]

    lws_obj = _lws(fleets, name)
    (owner,) = lws_obj["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == (
        "KvRetentionDeployment",
        name,
        True,
    )
    assert lws_obj["status"]["readyReplicas"] == 2
    pods = _pods(fleets, name)
    assert len(pods) == 4
    by_group: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        by_group.setdefault(pod["metadata"]["labels"][GROUP_INDEX], []).append(pod)
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        # The LWS pod webhook gave each rank its index and its leader's address.
        assert env["LWS_WORKER_INDEX"] == pod["metadata"]["labels"][WORKER_INDEX]
        assert env["LWS_LEADER_ADDRESS"].startswith(f"{name}-worker-lws-")
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["probe"]
    for group in by_group.values():
        assert sorted(p["metadata"]["labels"][WORKER_INDEX] for p in group) == ["0", "1"]
        assert len({p["spec"]["nodeName"] for p in group}) == 2, "one rank per node"

    # The router's Service selects the leaders only.
    service = fleets.core.read_namespaced_service(f"{name}-worker", fleets.ns)
    assert service.spec.selector[WORKER_INDEX] == "0"


def test_a_deleted_rank_restarts_its_whole_group_and_status_follows(
    operator: Operator, fleets: Fleets
) -> None:
    name = "mn-restart"
    _ready_fleet(fleets, name)
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(fleets, name)}
    leader, rank = f"{name}-worker-lws-0", f"{name}-worker-lws-0-1"
    assert {leader, rank} <= pods.keys()

    fleets.core.delete_namespaced_pod(rank, fleets.ns)

    def group_recreated() -> dict[str, str] | None:
        now = {p["metadata"]["name"]: p["metadata"]["uid"] for p in _pods(fleets, name)}
        if now.get(leader) not in (None, pods[leader]) and now.get(rank) not in (None, pods[rank]):
            return now
        return None

    now = wait_until("group 0's leader and rank recreated", group_recreated, timeout_s=120)
    # Group 1 was not touched.
    assert now[f"{name}-worker-lws-1"] == pods[f"{name}-worker-lws-1"]
    fleets.wait_condition(name, "WorkersReady", "True", timeout_s=120)


def _partitions_since(fleets: Fleets, name: str, resource_version: str) -> list[int]:
    """Every partition the LWS controller wrote on the leader StatefulSet since
    ``resource_version``, in order: a watch replays the history, so no step is missed by sampling."""
    events = watch.Watch().stream(
        fleets.apps.list_namespaced_stateful_set,
        fleets.ns,
        field_selector=f"metadata.name={name}-worker-lws",
        resource_version=resource_version,
        timeout_seconds=2,
    )
    seen: list[int] = []
    for event in events:
        partition = event["object"].spec.update_strategy.rolling_update.partition
        if not seen or seen[-1] != partition:
            seen.append(partition)
    return seen


def test_a_template_change_rolls_the_groups_one_at_a_time(
    operator: Operator, fleets: Fleets
) -> None:
    name = "mn-roll"
    _ready_fleet(fleets, name)
    leaders = {
        p["metadata"]["name"]: p["metadata"]["uid"]
        for p in _pods(fleets, name)
        if p["metadata"]["labels"][WORKER_INDEX] == "0"
    }
    assert len(leaders) == 2
    strategy = _lws(fleets, name)["spec"]["rolloutStrategy"]["rollingUpdateConfiguration"]
    assert (strategy["maxUnavailable"], strategy["maxSurge"]) == (1, 0)
    before = fleets.apps.read_namespaced_stateful_set(f"{name}-worker-lws", fleets.ns)
    assert before.metadata.resource_version

    generation = fleets.patch_spec(name, {"workers": {"drainSeconds": 45}})["metadata"][
        "generation"
    ]
    deadline = time.monotonic() + 180
    while True:
        lws_obj = _lws(fleets, name)
        template = lws_obj["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
        rolled = template["terminationGracePeriodSeconds"] == 10 + 45 + 15
        lws_status = lws_obj.get("status") or {}
        now = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in _pods(fleets, name)
            if p["metadata"]["labels"][WORKER_INDEX] == "0"
        }
        replaced = all(now.get(n) not in (None, uid) for n, uid in leaders.items())
        done = lws_status.get("updatedReplicas") == 2 and lws_status.get("readyReplicas") == 2
        if rolled and replaced and done:
            break
        assert time.monotonic() < deadline, f"rollout did not finish: {lws_status}"
        time.sleep(0.1)
    # maxUnavailable 1, maxSurge 0: the controller opens the partition one group at a time
    # (2 -> 1 -> 0); both at once would go 2 -> 0. LWS's readyReplicas is not sampled here: it
    # is computed from the controller's informer cache and can read 0 for a moment under load.
    partitions = _partitions_since(fleets, name, before.metadata.resource_version)
    assert partitions[-1] == 0, partitions
    assert 1 in partitions[: partitions.index(0)], partitions
    fleets.wait_condition(name, "WorkersReady", "True", generation=generation, timeout_s=120)


def test_the_operator_never_writes_a_pod_the_lws_controller_owns(
    operator: Operator, fleets: Fleets
) -> None:
    name = "mn-hands-off"
    _ready_fleet(fleets, name)
    pods = _pods(fleets, name)
    assert pods
    for pod in pods:
        (owner,) = pod["metadata"]["ownerReferences"]
        assert owner["kind"] == "StatefulSet", owner
        managers = {e["manager"] for e in pod["metadata"].get("managedFields") or []}
        assert FIELD_MANAGER not in managers, (pod["metadata"]["name"], managers)
    writes = operator.metric_sum("kvretention_operator_apply_writes_total")
    time.sleep(3)  # a quiet fleet: no further writes of any kind
    assert operator.metric_sum("kvretention_operator_apply_writes_total") == writes


@pytest.mark.parametrize(("workers", "message"), UNEVEN_SPLITS)
def test_the_api_server_refuses_ranks_that_do_not_split_across_the_nodes(
    operator: Operator, fleets: Fleets, workers: dict[str, Any], message: str
) -> None:
    body = load_example("aggregated", name="mn-bad")
    body["spec"]["workers"] = {**body["spec"]["workers"], **workers}
    with pytest.raises(ApiException) as err:
        fleets.create(body)
    assert err.value.status == 422
    assert message in str(err.value.body)
