"""HorizontalPodAutoscalers for autoscaled worker pools (``workers.autoscaling``,
``workers.prefill.autoscaling``): one ``autoscaling/v2`` HPA per pool, on the pool workload's own
scale subresource, driven by the router's outstanding requests for that pool.

The metric is External (``kvretention_pool_outstanding_requests``, selected by ``fleet`` and
``role``): the router counts a pool's in-flight requests (``kvretention_router_pool_outstanding_
requests{role}``), not the workers' pods, so it is not a Pods metric; prometheus-adapter serves it
from Prometheus with the rule in docs/observability.md, namespaced by ``fleet_namespace``. With an
``AverageValue`` target the HPA divides it by the pool's replicas, so ``target`` reads as
outstanding requests per worker.

An autoscaled pool's workload is applied without ``spec.replicas``: the HPA owns that field, and
server-side apply never takes it back.
"""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment, PoolAutoscalingSpec
from kvretention.api.names import LABEL_COMPONENT, Role
from kvretention.controller.resources.common import Manifest, child_name, object_meta
from kvretention.controller.resources.workers import ROLE_COMPONENT, ROLE_SUFFIX, worker_roles

EXTERNAL_METRIC: Final = "kvretention_pool_outstanding_requests"
"""The External metric's name, as the chart's prometheus-adapter rule serves it."""
ROUTER_SERIES: Final = "kvretention_router_pool_outstanding_requests"
"""The router's series the adapter reads (labels ``role`` and the PodMonitor's ``fleet``)."""
SCALABLE_KINDS: Final = frozenset(
    {("apps/v1", "Deployment"), ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")}
)
SCALE_DOWN_PERIOD_SECONDS: Final = 120
"""At most one worker removed per period: a worker takes minutes to load, and each one removed
takes its radix cache (retained prefixes) with it."""


def pool_autoscaling(cr: KvRetentionDeployment, role: Role) -> PoolAutoscalingSpec | None:
    """The pool's autoscaling: prefill's own, else ``workers.autoscaling`` (aggregated/decode)."""
    workers = cr.spec.workers
    if role == "prefill":
        return workers.prefill.autoscaling if workers.prefill is not None else None
    return workers.autoscaling


def autoscaled_roles(cr: KvRetentionDeployment) -> list[Role]:
    return [role for role in worker_roles(cr) if pool_autoscaling(cr, role) is not None]


def build_autoscaler(cr: KvRetentionDeployment, role: Role, *, workload: Manifest) -> Manifest:
    """The HPA of one pool, scaling ``workload`` (the pool's Deployment or LeaderWorkerSet)."""
    spec = pool_autoscaling(cr, role)
    if spec is None:
        raise ValueError(f"the {role} pool of {cr.name} is not autoscaled")
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(
            cr, name=child_name(cr, ROLE_SUFFIX[role]), component=ROLE_COMPONENT[role]
        ),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": workload["apiVersion"],
                "kind": workload["kind"],
                "name": workload["metadata"]["name"],
            },
            "minReplicas": spec.min_replicas,
            "maxReplicas": spec.max_replicas,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": EXTERNAL_METRIC,
                            "selector": {"matchLabels": {"fleet": cr.name, "role": role}},
                        },
                        "target": {"type": "AverageValue", "averageValue": str(spec.target)},
                    },
                }
            ],
            "behavior": {
                "scaleDown": {
                    "policies": [
                        {"type": "Pods", "value": 1, "periodSeconds": SCALE_DOWN_PERIOD_SECONDS}
                    ],
                },
            },
        },
    }


def with_autoscalers(cr: KvRetentionDeployment, workers: list[Manifest]) -> list[Manifest]:
    """``workers`` (the pools' manifests), each autoscaled pool's workload without
    ``spec.replicas``, followed by the pools' HPAs."""
    out = [dict(m) for m in workers]
    autoscalers: list[Manifest] = []
    for role in autoscaled_roles(cr):
        index = _workload_index(out, ROLE_COMPONENT[role])
        spec: dict[str, Any] = dict(out[index]["spec"])
        spec.pop("replicas", None)
        out[index] = {**out[index], "spec": spec}
        autoscalers.append(build_autoscaler(cr, role, workload=out[index]))
    return out + autoscalers


def _workload_index(manifests: list[Manifest], component: str) -> int:
    """The pool's workload: its Deployment, or its LeaderWorkerSet for multinode workers."""
    for index, manifest in enumerate(manifests):
        kind = (manifest["apiVersion"], manifest["kind"])
        labels = manifest["metadata"].get("labels", {})
        if kind in SCALABLE_KINDS and labels.get(LABEL_COMPONENT) == component:
            return index
    raise ValueError(f"no scalable workload of component {component} among the worker manifests")
