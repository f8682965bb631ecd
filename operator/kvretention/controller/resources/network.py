"""Ingress NetworkPolicies: each component is reachable only by the components that call it.

clients -> frontend, frontend -> router, router -> workers, workers <-> workers (PD KV transfer and
Mooncake's transfer engine use ports chosen at run time, so every port between a fleet's workers),
workers -> the managed Mooncake master (RPC and metadata ports); with the router as the Gateway's
endpoint picker, clients -> the router's ext-proc port too (the Gateway is one of the clients) and
router -> frontend (the picker checks the frontend pods it hands out).
``networkPolicy.metricsFrom`` adds whoever scrapes ``/metrics``, on the metrics port alone (the
frontend's, router's and workers' serves nothing else, the master's its own ``--metrics_port``):
a scraper reaches no API route, so it
can neither call the router or a worker as any tenant nor send requests past the frontend's keys.
The operator itself reads the workers' and the master's metrics ports (retention hook failures,
the pool's usage), so its pods (by the chart's labels, in any namespace) may reach those two.
Policies are ingress-only: egress (DNS, the model hub, an external master) is left to the
cluster's own policies.
"""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.names import OPERATOR_POD_LABELS
from kvretention.controller.resources.common import (
    APP_NAME,
    COMPONENT_FRONTEND,
    COMPONENT_MOONCAKE,
    COMPONENT_ROUTER,
    FRONTEND_PORT,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_NAME,
    METRICS_PORT,
    ROUTER_PORT,
    WORKER_PORT,
    Manifest,
    child_name,
    object_meta,
    selector_labels,
)
from kvretention.controller.resources.endpoint_picker import EXT_PROC_PORT, picks_endpoints
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


def _metrics(
    cr: KvRetentionDeployment, port: int, *, operator: bool = False
) -> list[dict[str, Any]]:
    """The metrics port's rules: ``metricsFrom``, and the operator's pods where it reads them."""
    rules = []
    if operator:
        peer = {"namespaceSelector": {}, "podSelector": {"matchLabels": dict(OPERATOR_POD_LABELS)}}
        rules.append({"from": [peer], "ports": _ports(port)})
    peers = cr.spec.network_policy.metrics_from
    if peers:
        rules.append({"from": list(peers), "ports": _ports(port)})
    return rules


def _ingress_by_component(cr: KvRetentionDeployment) -> list[tuple[str, str, list[Manifest]]]:
    """Who may call each Deployment the fleet runs: (name suffix, component, ingress rules)."""
    spec = cr.spec
    planned: list[tuple[str, str, list[Manifest]]] = []
    if uses_mooncake(spec) and spec.kv_store.mooncake.mode == "managed":
        master = spec.kv_store.mooncake.master
        from_workers = {
            "from": [_pods(cr, *WORKER_COMPONENTS)],
            "ports": _ports(master.rpc_port, master.metadata_port),
        }
        metrics = _metrics(cr, master.metrics_port, operator=True)
        planned.append((MASTER_SUFFIX, COMPONENT_MOONCAKE, [from_workers, *metrics]))
    for role in worker_roles(cr):
        router_ports = [WORKER_PORT]
        if role == "prefill":
            router_ports.append(spec.workers.bootstrap_port)
        # What places requests sends them: the router, and the frontend when it places.
        placers = [COMPONENT_ROUTER]
        if spec.router.placement == "Frontend":
            placers.append(COMPONENT_FRONTEND)
        ingress = [
            {"from": [_pods(cr, *placers)], "ports": _ports(*router_ports)},
            {"from": [_pods(cr, *WORKER_COMPONENTS)]},  # every port: KV transfers
            *_metrics(cr, METRICS_PORT, operator=True),
        ]
        planned.append((ROLE_SUFFIX[role], ROLE_COMPONENT[role], ingress))
    from_frontend = {"from": [_pods(cr, COMPONENT_FRONTEND)], "ports": _ports(ROUTER_PORT)}
    router, frontend = [from_frontend], [_from_clients(cr, FRONTEND_PORT)]
    if picks_endpoints(cr):
        router.append(_from_clients(cr, EXT_PROC_PORT.port))
        # The picker checks each frontend pod's /readyz before it hands the pod to a Gateway.
        frontend.append({"from": [_pods(cr, COMPONENT_ROUTER)], "ports": _ports(FRONTEND_PORT)})
    planned.append((ROUTER_SUFFIX, COMPONENT_ROUTER, [*router, *_metrics(cr, METRICS_PORT)]))
    planned.append((FRONTEND_SUFFIX, COMPONENT_FRONTEND, [*frontend, *_metrics(cr, METRICS_PORT)]))
    return planned


def _from_clients(cr: KvRetentionDeployment, port: int) -> dict[str, Any]:
    """``port`` for ``networkPolicy.clientsFrom`` (anyone when empty): the frontend's port, and
    the router's ext-proc port, which the same clients' Gateway calls before it calls a
    frontend pod."""
    clients = cr.spec.network_policy.clients_from
    rule: dict[str, Any] = {"ports": _ports(port)}
    return {"from": list(clients), **rule} if clients else rule


def build_network_policies(cr: KvRetentionDeployment) -> list[Manifest]:
    """One policy per Deployment the fleet runs; none when ``networkPolicy.enabled`` is false."""
    if not cr.spec.network_policy.enabled:
        return []
    return [
        _policy(cr, name=child_name(cr, suffix), component=component, ingress=ingress)
        for suffix, component, ingress in _ingress_by_component(cr)
    ]
