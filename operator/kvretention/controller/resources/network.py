"""Ingress NetworkPolicies: each component is reachable only by the components that call it.

clients -> frontend, frontend -> router, router -> workers, workers <-> workers (PD KV transfer and
Mooncake's transfer engine use ports chosen at run time, so every port between a fleet's workers),
workers -> the managed Mooncake master (RPC and metadata ports). ``networkPolicy.metricsFrom`` adds
whoever scrapes ``/metrics``. Policies are ingress-only: egress (DNS, the model hub, an external
master) is left to the cluster's own policies.
"""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.common import (
    APP_NAME,
    COMPONENT_FRONTEND,
    COMPONENT_MOONCAKE,
    COMPONENT_ROUTER,
    FRONTEND_PORT,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    ROUTER_PORT,
    WORKER_PORT,
    Manifest,
    child_name,
    object_meta,
    selector_labels,
)
from kvretention.controller.resources.frontend import FRONTEND_SUFFIX
from kvretention.controller.resources.mooncake import MASTER_SUFFIX, uses_mooncake
from kvretention.controller.resources.router import ROUTER_SUFFIX
from kvretention.controller.resources.workers import ROLE_COMPONENT, ROLE_SUFFIX, worker_roles

WORKER_COMPONENTS: Final = tuple(ROLE_COMPONENT.values())


def _pods(cr: KvRetentionDeployment, *components: str) -> dict[str, Any]:
    """A peer: this fleet's pods of the given components (same namespace)."""
    return {
        "podSelector": {
            "matchLabels": {LABEL_NAME: APP_NAME, LABEL_INSTANCE: cr.name},
            "matchExpressions": [
                {"key": LABEL_COMPONENT, "operator": "In", "values": list(components)}
            ],
        }
    }


def _ports(*ports: int) -> list[dict[str, Any]]:
    return [{"protocol": "TCP", "port": port} for port in ports]


def _policy(
    cr: KvRetentionDeployment, *, name: str, component: str, ingress: list[dict[str, Any]]
) -> Manifest:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(cr, name=name, component=component),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(cr, component)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def _metrics(cr: KvRetentionDeployment, port: int) -> list[dict[str, Any]]:
    peers = cr.spec.network_policy.metrics_from
    return [{"from": list(peers), "ports": _ports(port)}] if peers else []


def build_network_policies(cr: KvRetentionDeployment) -> list[Manifest]:
    """One policy per Deployment the fleet runs; none when ``networkPolicy.enabled`` is false."""
    spec = cr.spec
    if not spec.network_policy.enabled:
        return []
    policies: list[Manifest] = []
    if uses_mooncake(spec) and spec.kv_store.mooncake.mode == "managed":
        master = spec.kv_store.mooncake.master
        policies.append(
            _policy(
                cr,
                name=child_name(cr, MASTER_SUFFIX),
                component=COMPONENT_MOONCAKE,
                ingress=[
                    {
                        "from": [_pods(cr, *WORKER_COMPONENTS)],
                        "ports": _ports(master.rpc_port, master.metadata_port),
                    },
                    *_metrics(cr, master.metrics_port),
                ],
            )
        )
    for role in worker_roles(cr):
        router_ports = [WORKER_PORT]
        if role == "prefill":
            router_ports.append(spec.workers.bootstrap_port)
        policies.append(
            _policy(
                cr,
                name=child_name(cr, ROLE_SUFFIX[role]),
                component=ROLE_COMPONENT[role],
                ingress=[
                    {"from": [_pods(cr, COMPONENT_ROUTER)], "ports": _ports(*router_ports)},
                    {"from": [_pods(cr, *WORKER_COMPONENTS)]},  # every port: KV transfers
                    *_metrics(cr, WORKER_PORT),
                ],
            )
        )
    policies.append(
        _policy(
            cr,
            name=child_name(cr, ROUTER_SUFFIX),
            component=COMPONENT_ROUTER,
            ingress=[
                {"from": [_pods(cr, COMPONENT_FRONTEND)], "ports": _ports(ROUTER_PORT)},
                *_metrics(cr, ROUTER_PORT),
            ],
        )
    )
    clients = spec.network_policy.clients_from
    frontend_rule: dict[str, Any] = {"ports": _ports(FRONTEND_PORT)}
    if clients:
        frontend_rule = {"from": list(clients), **frontend_rule}
    policies.append(
        _policy(
            cr,
            name=child_name(cr, FRONTEND_SUFFIX),
            component=COMPONENT_FRONTEND,
            ingress=[frontend_rule, *(_metrics(cr, FRONTEND_PORT) if clients else [])],
        )
    )
    return policies
