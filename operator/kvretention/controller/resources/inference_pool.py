"""The fleet's ``InferencePool`` (``inference.networking.k8s.io/v1``, Gateway API Inference
Extension), rendered when ``spec.gateway.inferencePool.enabled`` is set.

It selects the frontend pods, not the workers: the frontend is where the provider contract is
checked, cache controls become ``kv.retain`` hints and API keys and tenant limits apply, so a
Gateway routing to the workers would bypass all three. No ``endpointPickerRef`` (optional in v1):
the Gateway balances over the frontend pods itself, and the router keeps placing requests on
workers behind them (the router as an ``ext_proc`` endpoint picker is future work).
"""

from __future__ import annotations

from typing import Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.common import (
    COMPONENT_FRONTEND,
    FRONTEND_PORT,
    Manifest,
    child_name,
    object_meta,
    selector_labels,
)
from kvretention.controller.resources.frontend import FRONTEND_SUFFIX

INFERENCE_POOL_API_VERSION: Final = "inference.networking.k8s.io/v1"
INFERENCE_POOL_KIND: Final = "InferencePool"
INFERENCE_POOL_CRD: Final = "inferencepools.inference.networking.k8s.io"
"""The CRD the cluster's Gateway stack installs; status names it when it is missing."""
APP_PROTOCOL: Final = "http"
"""The frontend speaks HTTP/1.1 (streams as server-sent events)."""


def inference_pool_name(cr: KvRetentionDeployment) -> str:
    """The frontend Service's name: an HTTPRoute's backendRef moves from the Service to the
    InferencePool by changing its kind alone."""
    return child_name(cr, FRONTEND_SUFFIX)


def build_inference_pool(cr: KvRetentionDeployment) -> list[Manifest]:
    """One InferencePool over the frontend pods' HTTP port; none unless the spec asks for it."""
    if not cr.spec.gateway.inference_pool.enabled:
        return []
    return [
        {
            "apiVersion": INFERENCE_POOL_API_VERSION,
            "kind": INFERENCE_POOL_KIND,
            "metadata": object_meta(cr, name=inference_pool_name(cr), component=COMPONENT_FRONTEND),
            "spec": {
                "selector": {"matchLabels": selector_labels(cr, COMPONENT_FRONTEND)},
                "targetPorts": [{"number": FRONTEND_PORT}],
                "appProtocol": APP_PROTOCOL,
            },
        }
    ]
