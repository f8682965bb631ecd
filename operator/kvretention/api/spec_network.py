"""``spec.networkPolicies`` and ``spec.gateway``: the NetworkPolicies the operator renders around
the fleet, and the Gateway API objects that let a cluster's Gateway route to it."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    Field,
)

from kvretention.api.base import WireModel, list_field, nested

__all__ = [
    "GatewaySpec",
    "InferencePoolSpec",
    "NetworkPolicySpec",
]


_NetworkPolicyPeer = Annotated[
    dict[str, Any],
    Field(
        description="One Kubernetes NetworkPolicyPeer (podSelector, namespaceSelector, ipBlock)."
    ),
]


class NetworkPolicySpec(WireModel):
    """Ingress NetworkPolicies: each component is reachable only by the components that call it."""

    enabled: bool = Field(
        default=True,
        description=(
            "Render a NetworkPolicy per component: clients -> frontend, frontend -> router, router "
            "-> workers, workers <-> workers (PD and Mooncake transfers), workers -> Mooncake "
            "master. Needs a CNI that enforces NetworkPolicy; false renders none."
        ),
    )
    clients_from: list[_NetworkPolicyPeer] = list_field(
        16, "Who may reach the frontend's port. Empty: anyone (it is the entry point)."
    )
    metrics_from: list[_NetworkPolicyPeer] = list_field(
        16,
        (
            "Who may scrape /metrics (e.g. the monitoring namespace): the frontend's, router's "
            "and workers' metrics port (9100, which serves /metrics and nothing else) and the "
            "Mooncake master's metrics port, never a port that serves the API. Empty: no one "
            "besides the callers above."
        ),
    )


class InferencePoolSpec(WireModel):
    """An ``InferencePool`` (``inference.networking.k8s.io/v1``, Gateway API Inference Extension)
    for the fleet: the backend an ``HTTPRoute`` of the cluster's Gateway names."""

    enabled: bool = Field(
        default=False,
        description=(
            "Render one InferencePool, named like the frontend Service and owned by the fleet, "
            "selecting the frontend pods on their HTTP port (appProtocol http): a Gateway reaches "
            "the fleet through the frontend, where the provider contract is checked, cache "
            "controls become kv.retain hints and API keys apply. Needs the InferencePool CRD, "
            "which the cluster's Gateway stack installs; without it the fleet still runs and "
            "the InferencePoolAccepted condition says what is missing."
        ),
    )


class GatewaySpec(WireModel):
    """How a cluster's Gateway (Gateway API) reaches the fleet, besides the frontend Service."""

    inference_pool: InferencePoolSpec = nested(
        InferencePoolSpec, "An InferencePool for Gateways that implement the Inference Extension."
    )
