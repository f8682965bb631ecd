"""``spec.networkPolicies`` and ``spec.gateway``: the NetworkPolicies the operator renders around
the fleet, and the Gateway API objects that let a cluster's Gateway route to it."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import (
    Field,
)

from kvretention.api.base import WireModel, list_field, nested

__all__ = [
    "FRONTEND_PODS_SUFFIX",
    "PICKER_MAX_NAME_LENGTH",
    "PICKER_NAME_MESSAGE",
    "EndpointPickerSpec",
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


class EndpointPickerSpec(WireModel):
    """The router as the InferencePool's endpoint picker (Envoy ``ext_proc``): InferencePool v1
    requires an ``endpointPickerRef``, and the router is the one picker that knows the fleet's
    sessions, so every pool the operator renders names it."""

    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailOpen",
        description=(
            "What the Gateway does when the router does not answer: FailOpen sends the request "
            "to a frontend pod of its own choosing (every frontend serves every request; only "
            "the session's placement is lost), FailClose refuses it."
        ),
    )


FRONTEND_PODS_SUFFIX: Final = "frontend-pods"
"""The picker's headless Service: ``<name>-frontend-pods``."""
PICKER_MAX_NAME_LENGTH: Final = 63 - len(f"-{FRONTEND_PODS_SUFFIX}")
"""The longest fleet name whose ``<name>-frontend-pods`` stays a DNS-1035 label (a CEL rule on
the whole object, since the spec alone cannot see the name)."""
PICKER_NAME_MESSAGE: Final = (
    f"metadata.name must be at most {PICKER_MAX_NAME_LENGTH} characters with "
    "gateway.inferencePool.enabled (the picker's headless Service <name>-frontend-pods "
    "is a DNS label of at most 63)"
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
            "the InferencePoolAccepted condition says what is missing. The router is the pool's "
            "endpoint picker (endpointPickerRef, which InferencePool v1 requires): it answers "
            "the Gateway's ext_proc stream on its Service's ext-proc port (9004) with the "
            "frontend pod for each request, the same pod for a session, found through a "
            "headless Service <name>-frontend-pods."
        ),
    )
    endpoint_picker: EndpointPickerSpec = nested(
        EndpointPickerSpec, "The router as the pool's endpoint picker (endpointPickerRef)."
    )


class GatewaySpec(WireModel):
    """How a cluster's Gateway (Gateway API) reaches the fleet, besides the frontend Service."""

    inference_pool: InferencePoolSpec = nested(
        InferencePoolSpec, "An InferencePool for Gateways that implement the Inference Extension."
    )
