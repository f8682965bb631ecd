"""The HPAs of autoscaled worker pools: one per autoscaled pool, on that pool's workload (its own
scale subresource), reading the pool's outstanding requests per worker; the workload leaves
``replicas`` to the HPA, and a pool that is not autoscaled keeps its replicas and gets no HPA."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from kvretention.api.models import API_VERSION, KvRetentionDeployment
from kvretention.controller.kinds import kind_of
from kvretention.controller.resources import build_children
from kvretention.controller.resources.autoscaling import EXTERNAL_METRIC

SCALED = {"minReplicas": 2, "maxReplicas": 6, "target": 8}


def cr(workers: dict[str, Any]) -> KvRetentionDeployment:
    return KvRetentionDeployment.from_k8s(
        {
            "apiVersion": API_VERSION,
            "kind": "KvRetentionDeployment",
            "metadata": {"name": "chat", "namespace": "team-a", "uid": "u-1"},
            "spec": {
                "model": {"name": "qwen", "path": "Qwen/Qwen3-0.6B"},
                "workers": copy.deepcopy(workers),
            },
        }
    )


def by_kind(children: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {c["metadata"]["name"]: c for c in children if c["kind"] == kind}


CASES = [
    pytest.param({"replicas": 3}, {}, {"chat-worker": 3}, id="aggregated-fixed"),
    pytest.param(
        {"autoscaling": SCALED},
        {"chat-worker": ("aggregated", "worker")},
        {"chat-worker": None},
        id="aggregated-autoscaled",
    ),
    pytest.param(
        {"mode": "disaggregated", "prefill": {"replicas": 2, "autoscaling": SCALED}, "decode": {}},
        {"chat-prefill": ("prefill", "worker-prefill")},
        {"chat-prefill": None, "chat-decode": 1},
        id="prefill-only",
    ),
    pytest.param(
        {"mode": "disaggregated", "autoscaling": SCALED, "prefill": {"replicas": 2}, "decode": {}},
        {"chat-decode": ("decode", "worker-decode")},
        {"chat-prefill": 2, "chat-decode": None},
        id="decode-only",
    ),
    pytest.param(
        {
            "mode": "disaggregated",
            "autoscaling": SCALED,
            "prefill": {"autoscaling": SCALED},
            "decode": {},
        },
        {
            "chat-prefill": ("prefill", "worker-prefill"),
            "chat-decode": ("decode", "worker-decode"),
        },
        {"chat-prefill": None, "chat-decode": None},
        id="both-pools",
    ),
]


@pytest.mark.parametrize(("workers", "hpas", "replicas"), CASES)
def test_each_autoscaled_pool_gets_an_hpa_on_its_own_workload(
    workers: dict[str, Any],
    hpas: dict[str, tuple[str, str]],
    replicas: dict[str, int | None],
) -> None:
    children = build_children(cr(workers))
    deployments = by_kind(children, "Deployment")
    built = by_kind(children, "HorizontalPodAutoscaler")
    assert set(built) == set(hpas)
    for name, want in replicas.items():
        assert deployments[name]["spec"].get("replicas") == want
    for name, (role, component) in hpas.items():
        hpa = built[name]
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert kind_of(hpa).plural == "horizontalpodautoscalers"
        assert hpa["metadata"]["labels"]["app.kubernetes.io/component"] == component
        assert hpa["metadata"]["ownerReferences"][0]["uid"] == "u-1"
        spec = hpa["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": name,
        }
        assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 6)
        (metric,) = spec["metrics"]
        assert metric == {
            "type": "External",
            "external": {
                "metric": {
                    "name": EXTERNAL_METRIC,
                    "selector": {"matchLabels": {"fleet": "chat", "role": role}},
                },
                "target": {"type": "AverageValue", "averageValue": "8"},
            },
        }
        # The HPA's target selects the same pods as the workload's scale subresource would.
        selector = deployments[name]["spec"]["selector"]["matchLabels"]
        assert selector["app.kubernetes.io/component"] == component


def test_a_multinode_pool_is_scaled_through_its_leaderworkerset() -> None:
    workers = {"nodesPerReplica": 2, "aggregated": {"tensorParallelSize": 4}, "autoscaling": SCALED}
    children = build_children(cr(workers))
    (lws,) = [c for c in children if c["kind"] == "LeaderWorkerSet"]
    assert "replicas" not in lws["spec"]
    (hpa,) = by_kind(children, "HorizontalPodAutoscaler").values()
    assert hpa["metadata"]["name"] == "chat-worker"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": lws["metadata"]["name"],
    }


def test_hpas_follow_their_workloads_in_apply_order() -> None:
    children = build_children(
        cr({"mode": "disaggregated", "autoscaling": SCALED, "prefill": {}, "decode": {}})
    )
    names = [(c["kind"], c["metadata"]["name"]) for c in children]
    assert names.index(("HorizontalPodAutoscaler", "chat-decode")) > names.index(
        ("Deployment", "chat-decode")
    )
    assert names.index(("HorizontalPodAutoscaler", "chat-decode")) < names.index(
        ("Deployment", "chat-router")
    )
