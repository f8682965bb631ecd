"""Pure builders: a KvRetentionDeployment in, every Kubernetes object the operator applies out.

Same spec, same bytes: no clocks, no randomness, no cluster reads. ``kvretention render`` and the
operator's reconcile both call :func:`build_children`.
"""

from __future__ import annotations

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.autoscaling import with_autoscalers
from kvretention.controller.resources.checks import check_spec
from kvretention.controller.resources.common import Manifest
from kvretention.controller.resources.frontend import build_frontend, frontend_endpoint
from kvretention.controller.resources.inference_pool import build_inference_pool
from kvretention.controller.resources.mooncake import (
    build_mooncake_client_config,
    build_mooncake_configmap,
    build_mooncake_master,
    build_mooncake_master_args,
    uses_mooncake,
)
from kvretention.controller.resources.network import build_network_policies
from kvretention.controller.resources.pools import build_workers, scale_selector, scaled_workload
from kvretention.controller.resources.router import build_router
from kvretention.controller.resources.sglang_args import build_sglang_args
from kvretention.controller.resources.workers import scaled_role

__all__ = [
    "Manifest",
    "build_children",
    "build_mooncake_client_config",
    "build_mooncake_master_args",
    "build_sglang_args",
    "check_spec",
    "frontend_endpoint",
    "scale_selector",
    "scaled_role",
    "scaled_workload",
]


def build_children(cr: KvRetentionDeployment) -> list[Manifest]:
    """Every child manifest, in apply order: KV store, workers (and autoscaled pools' HPAs),
    router, frontend (and its InferencePool, when asked for), then the NetworkPolicies that let
    each be reached only by its callers."""
    children: list[Manifest] = []
    if uses_mooncake(cr.spec):
        children.append(build_mooncake_configmap(cr))
        children += build_mooncake_master(cr)
    children += with_autoscalers(cr, build_workers(cr)) + build_router(cr) + build_frontend(cr)
    children += build_inference_pool(cr)
    return children + build_network_policies(cr)
