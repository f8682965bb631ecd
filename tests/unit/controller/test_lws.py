"""Multinode worker pools: ``nodesPerReplica`` validation, the LeaderWorkerSet each such pool
renders, its status (a group ready only when every rank is), and a cluster without the LWS CRD."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from fake_kube import (
    FakeKube,
    condition_messages,
    fake,
    load_example,
    make_ready,
    master_only_controller,
    reconcile_unserved,
)

from kvretention.api.models import KvRetentionDeployment, SpecError
from kvretention.controller import kinds
from kvretention.controller.cache import CR_KIND
from kvretention.controller.conditions import check_workloads
from kvretention.controller.diagnosis import LEADER_WORKER_SET_MISSING, observe_group_workload
from kvretention.controller.resources import build_children, check_spec
from kvretention.controller.resources.lws import DIST_INIT_PORT, WORKER_INDEX_LABEL
from kvretention.controller.status import lws_missing_message
from support.uneven_splits import UNEVEN_SPLITS

__all__ = ["fake"]


def _cr(workers: dict[str, Any], *, name: str = "qwen") -> KvRetentionDeployment:
    body = load_example("aggregated")
    body["metadata"]["name"] = name
    body["spec"]["workers"] = {**body["spec"].get("workers", {}), **workers}
    return KvRetentionDeployment.from_k8s(body)


def _kinds(children: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(c["kind"], c["metadata"]["name"]) for c in children]


def _lws(children: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(
        c for c in children if c["kind"] == "LeaderWorkerSet" and c["metadata"]["name"] == name
    )


MULTINODE = {"replicas": 2, "nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 16}}


# -- spec --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("workers", "error"),
    [
        *UNEVEN_SPLITS,
        ({"aggregated": {"tensorParallelSize": 4, "nodesPerReplica": 3}}, "aggregated"),
        (
            {
                "mode": "disaggregated",
                "nodesPerReplica": 2,
                "prefill": {"tensorParallelSize": 2},
                "decode": {},
            },
            "workers.decode.tensorParallelSize",
        ),
        ({"nodesPerReplica": 0}, "greater than or equal to 1"),
        ({"nodesPerReplica": 65, "aggregated": {"tensorParallelSize": 64}}, "less than or equal"),
    ],
)
def test_tensor_parallel_size_must_split_evenly_across_the_nodes(
    workers: dict[str, Any], error: str
) -> None:
    with pytest.raises(SpecError, match=error):
        _cr(workers)


@pytest.mark.parametrize(
    "workers",
    [
        {"nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 16}},
        {"aggregated": {"tensorParallelSize": 8, "nodesPerReplica": 4}},
        {"nodesPerReplica": 4, "aggregated": {"tensorParallelSize": 2, "nodesPerReplica": 1}},
        {
            "mode": "disaggregated",
            "nodesPerReplica": 2,
            "prefill": {"tensorParallelSize": 8},
            "decode": {"tensorParallelSize": 1, "nodesPerReplica": 1},
        },
    ],
)
def test_specs_whose_ranks_split_evenly_are_accepted(workers: dict[str, Any]) -> None:
    _cr(workers)


def test_the_crd_carries_the_same_rules_as_cel() -> None:
    from kvretention.api.crd import build_crd

    schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    workers = schema["properties"]["spec"]["properties"]["workers"]
    rules = [r["rule"] for r in workers["x-kubernetes-validations"]]
    assert any("self.aggregated.tensorParallelSize %" in r for r in rules)
    assert any("self.prefill.tensorParallelSize %" in r for r in rules)
    assert any("self.decode.tensorParallelSize %" in r for r in rules)
    assert workers["properties"]["nodesPerReplica"]["default"] == 1
    pool = workers["properties"]["aggregated"]["properties"]["nodesPerReplica"]
    assert (pool["minimum"], pool["maximum"]) == (1, 64)


# -- render ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "workers",
    [
        {"nodesPerReplica": 1},
        {"aggregated": {"nodesPerReplica": 1}},
        {"nodesPerReplica": 1, "aggregated": {}},
    ],
)
def test_one_node_per_replica_renders_exactly_todays_deployments(workers: dict[str, Any]) -> None:
    assert build_children(_cr(workers)) == build_children(_cr({}))


def test_a_multinode_pool_is_a_leader_worker_set_with_the_routers_service_on_leaders() -> None:
    children = build_children(_cr(MULTINODE))
    rendered = _kinds(children)
    assert ("LeaderWorkerSet", "qwen-worker-lws") in rendered
    assert ("Deployment", "qwen-worker") not in rendered
    assert ("PodDisruptionBudget", "qwen-worker") in rendered
    service = next(c for c in children if _kinds([c]) == [("Service", "qwen-worker")])
    assert service["spec"]["selector"][WORKER_INDEX_LABEL] == "0"
    assert service["spec"]["clusterIP"] == "None"
    lws = _lws(children, "qwen-worker-lws")
    spec = lws["spec"]
    assert spec["replicas"] == 2
    assert spec["leaderWorkerTemplate"]["size"] == 2
    assert spec["leaderWorkerTemplate"]["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert spec["rolloutStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdateConfiguration": {"maxSurge": 0, "maxUnavailable": 1},
    }


@pytest.mark.parametrize("template", ["leaderTemplate", "workerTemplate"])
def test_every_rank_has_the_probe_hicache_mooncake_and_multinode_flags(template: str) -> None:
    cr = _cr(MULTINODE)
    pod = _lws(build_children(cr), "qwen-worker-lws")["spec"]["leaderWorkerTemplate"][template]
    spec = pod["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["probe"]
    (worker,) = spec["containers"]
    command = worker["command"]
    args = command[command.index("--") + 1 :]
    at = args.index("--nnodes")
    assert args[at : at + 6] == [
        "--nnodes",
        "2",
        "--node-rank",
        "$(LWS_WORKER_INDEX)",
        "--dist-init-addr",
        f"$(LWS_LEADER_ADDRESS):{DIST_INIT_PORT}",
    ]
    assert args[args.index("--tp-size") + 1] == "16"
    assert "--enable-hierarchical-cache" in args
    assert args[args.index("--hicache-storage-backend") + 1] == "mooncake"
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 8  # 16 ranks over 2 nodes
    assert {m["name"] for m in worker["volumeMounts"]} >= {"mooncake-config", "dshm"}
    assert "kvretention.io/config-hash" in pod["metadata"]["annotations"]
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["matchLabelKeys"] == ["leaderworkerset.sigs.k8s.io/group-key"]


def test_only_the_leader_serves_the_workers_http_and_the_other_ranks_report_sglangs_health() -> (
    None
):
    lws = _lws(build_children(_cr(MULTINODE)), "qwen-worker-lws")
    template = lws["spec"]["leaderWorkerTemplate"]
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    rank = template["workerTemplate"]["spec"]["containers"][0]
    leader_args = leader["command"][leader["command"].index("--") + 1 :]
    rank_args = rank["command"][rank["command"].index("--") + 1 :]
    assert "--port" not in leader_args
    assert rank_args[rank_args.index("--port") + 1] == "8002"
    assert rank_args[rank_args.index("--host") + 1] == "0.0.0.0"
    assert leader["readinessProbe"]["httpGet"]["path"] == "/readyz"
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert rank[probe]["httpGet"] == {"path": "/health", "port": 8002}


def test_only_the_leader_declares_a_metrics_port() -> None:
    """The PodMonitor scrapes the port named ``metrics``: a rank whose worker never serves it
    (it stays in SGLang's schedulers) declares none, so it is no failing target."""
    lws = _lws(build_children(_cr(MULTINODE)), "qwen-worker-lws")
    template = lws["spec"]["leaderWorkerTemplate"]
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    rank = template["workerTemplate"]["spec"]["containers"][0]
    assert [p["name"] for p in leader["ports"]] == ["http", "metrics"]
    assert [p["name"] for p in rank["ports"]] == ["http"]


def test_pools_choose_their_own_nodes_per_replica() -> None:
    cr = _cr(
        {
            "mode": "disaggregated",
            "nodesPerReplica": 2,
            "prefill": {"tensorParallelSize": 8, "replicas": 1},
            "decode": {"tensorParallelSize": 2, "nodesPerReplica": 1},
        }
    )
    kinds = _kinds(build_children(cr))
    assert ("LeaderWorkerSet", "qwen-prefill-lws") in kinds
    assert ("Deployment", "qwen-decode") in kinds
    assert ("Deployment", "qwen-prefill") not in kinds


def test_a_user_affinity_keeps_its_node_rules_and_gains_one_rank_per_node() -> None:
    node_rule = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    cr = _cr({**MULTINODE, "pod": {"affinity": node_rule}})
    spec = _lws(build_children(cr), "qwen-worker-lws")["spec"]["leaderWorkerTemplate"]
    affinity = spec["leaderTemplate"]["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node_rule["nodeAffinity"]
    assert "podAntiAffinity" in affinity


# -- check_spec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "problem"),
    [
        (8, None),
        (16, "is 16 across 2 nodes (32 in all) but tensorParallelSize is 16"),
        (4, "is 4 across 2 nodes (8 in all)"),
    ],
)
def test_a_gpu_limit_given_by_hand_counts_per_node(gpus: int, problem: str | None) -> None:
    workers = copy.deepcopy(MULTINODE)
    workers["aggregated"]["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    problems = [p for p in check_spec(_cr(workers)) if "nvidia.com/gpu" in p]
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]


def test_a_name_too_long_for_the_groups_pod_hostnames_is_refused() -> None:
    assert check_spec(_cr(MULTINODE, name="q" * 40)) == []
    problems = check_spec(_cr(MULTINODE, name="q" * 54))
    assert len(problems) == 1
    assert problems[0].startswith("metadata.name:")
    assert "qwen" not in problems[0] and "-worker-lws-1-1" in problems[0]


# -- status ------------------------------------------------------------------------------------


def _workload(live_status: dict[str, Any] | None, *, unserved: bool = False) -> Any:
    from dataclasses import replace

    lws = _lws(build_children(_cr(MULTINODE)), "qwen-worker-lws")
    live = None if live_status is None else {**lws, "status": live_status}
    w = observe_group_workload(lws, live)
    return replace(w, unserved=lws_missing_message(w.name)) if unserved else w


@pytest.mark.parametrize(
    ("live", "unserved", "status", "reason", "says"),
    [
        (None, True, "False", LEADER_WORKER_SET_MISSING, "prerequisite only for multinode"),
        (None, False, "False", "NotCreated", "LeaderWorkerSet qwen-worker-lws does not exist"),
        (
            {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "conditions": [{}]},
            False,
            "False",
            "PodsNotReady",
            "1/2 ready",
        ),
        (
            {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 1, "conditions": [{}]},
            False,
            "False",
            "RollingOut",
            "1/2 updated",
        ),
        (
            {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "conditions": [{}]},
            False,
            "True",
            "PodsReady",
            "qwen-worker-lws 2/2",
        ),
    ],
)
def test_a_group_counts_as_ready_only_when_the_lws_controller_says_every_rank_is(
    live: dict[str, Any] | None, unserved: bool, status: str, reason: str, says: str
) -> None:
    verdict = check_workloads([_workload(live, unserved=unserved)], what="worker")
    assert (verdict.status, verdict.reason) == (status, reason)
    assert says in verdict.message


def test_an_autoscaled_multinode_pool_wants_what_its_hpa_set() -> None:
    lws = _lws(build_children(_cr(MULTINODE)), "qwen-worker-lws")
    spec = {k: v for k, v in lws["spec"].items() if k != "replicas"}  # applied without replicas
    desired = {**lws, "spec": spec}
    live = {
        **desired,
        "spec": {**spec, "replicas": 3},
        "status": {"replicas": 3, "readyReplicas": 3, "updatedReplicas": 3, "conditions": [{}]},
    }
    w = observe_group_workload(desired, live)
    assert (w.desired, w.healthy) == (3, True)


# -- the executor, with and without the LWS CRD --------------------------------------------------


def _multinode_fleet(fake: FakeKube) -> None:
    body = load_example("aggregated")
    body["spec"]["workers"] = {**body["spec"].get("workers", {}), **MULTINODE}
    fake.put(CR_KIND, body)


async def test_without_the_lws_crd_status_says_so_and_the_rest_of_the_fleet_is_applied(
    fake: FakeKube,
) -> None:
    _multinode_fleet(fake)
    fake.unserve(kinds.LEADER_WORKER_SET)
    await reconcile_unserved(fake, master_only_controller(fake), "LeaderWorkerSet")
    conditions = condition_messages(fake.cr())
    assert conditions["WorkersReady"][:2] == ("False", LEADER_WORKER_SET_MISSING)
    assert conditions["Ready"][:2] == ("False", LEADER_WORKER_SET_MISSING)
    assert "LeaderWorkerSet CRD is not installed" in conditions["Ready"][2]
    assert ("deployments", "qwen-router") in fake.children()
    assert ("poddisruptionbudgets", "qwen-worker") in fake.children()


async def test_with_the_crd_the_lws_is_applied_and_its_groups_make_the_workers_ready(
    fake: FakeKube,
) -> None:
    _multinode_fleet(fake)
    c = master_only_controller(fake)
    await c.reconcile(("ns", "qwen"))
    assert ("leaderworkersets", "qwen-worker-lws") in fake.children()
    assert condition_messages(fake.cr())["WorkersReady"][0] == "False"
    make_ready(fake)
    lws = fake.objects[("leaderworkersets", "ns", "qwen-worker-lws")]
    lws["status"] = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "conditions": [{}]}
    await c.reconcile(("ns", "qwen"))
    status = fake.cr()["status"]
    assert condition_messages(fake.cr())["WorkersReady"][:2] == ("True", "PodsReady")
    (pool,) = status["workers"]["pools"]
    assert (pool["name"], pool["nodesPerReplica"], pool["ready"]) == ("qwen-worker-lws", 2, 2)
    assert status["replicas"] == 2
    assert WORKER_INDEX_LABEL + "=0" in status["selector"]


def test_render_prints_the_leader_worker_set() -> None:
    from pathlib import Path

    import yaml
    from click.testing import CliRunner

    from kvretention.cli import main

    example = Path(__file__).resolve().parents[3] / "examples" / "multinode.yaml"
    result = CliRunner().invoke(main, ["render", "-f", str(example)])
    assert result.exit_code == 0, result.stderr
    kinds = [(d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(result.stdout)]
    assert ("LeaderWorkerSet", "qwen-235b-worker-lws") in kinds
    assert ("Deployment", "qwen-235b-worker") not in kinds
