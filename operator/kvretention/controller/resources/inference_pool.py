"""The fleet's ``InferencePool`` (``inference.networking.k8s.io/v1``, Gateway API Inference
Extension), rendered when ``spec.gateway.inferencePool.enabled`` is set.

It selects the frontend pods, not the workers: the frontend is where the provider contract is
checked, cache controls become ``kv.retain`` hints and API keys and tenant limits apply, so a
Gateway routing to the workers would bypass all three. The pool's ``endpointPickerRef`` (required
in v1) names the router Service's ext-proc port: the router picks the frontend pod per session
(:mod:`~kvretention.controller.resources.endpoint_picker`) and keeps placing requests on workers
behind the frontends.
"""

from __future__ import annotations

from typing import Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.kinds import INFERENCE_POOL
from kvretention.controller.resources.common import (
    COMPONENT_FRONTEND,
    FRONTEND_PORT,
    Manifest,
    child_name,
    object_meta,
    selector_labels,
)
from kvretention.controller.resources.endpoint_picker import (
    EXT_PROC_PORT,
    build_frontend_pods_service,
    picks_endpoints,
)
from kvretention.controller.resources.frontend import FRONTEND_SUFFIX
from kvretention.controller.resources.router import ROUTER_SUFFIX

APP_PROTOCOL: Final = "http"
"""The frontend speaks HTTP/1.1 (streams as server-sent events)."""


def inference_pool_name(cr: KvRetentionDeployment) -> str:
    """The frontend Service's name: an HTTPRoute's backendRef moves from the Service to the
    InferencePool by changing its kind alone."""
    return child_name(cr, FRONTEND_SUFFIX)


def build_endpoint_picker_ref(cr: KvRetentionDeployment) -> Manifest:
    """The router Service's ext-proc port (v1 wants ``port`` for a Service: the Service's port)."""
    return {
        "group": "",
        "kind": "Service",
        "name": child_name(cr, ROUTER_SUFFIX),
        "port": {"number": EXT_PROC_PORT.port},
        "failureMode": cr.spec.gateway.inference_pool.endpoint_picker.failure_mode,
    }


def build_inference_pool(cr: KvRetentionDeployment) -> list[Manifest]:
    """One InferencePool over the frontend pods' HTTP port with the router as its endpoint
    picker, and the headless Service the router resolves them by; none unless the spec asks."""
    if not picks_endpoints(cr):
        return []
    spec: Manifest = {
        "selector": {"matchLabels": selector_labels(cr, COMPONENT_FRONTEND)},
        "targetPorts": [{"number": FRONTEND_PORT}],
        "appProtocol": APP_PROTOCOL,
        "endpointPickerRef": build_endpoint_picker_ref(cr),
    }
    pool = {
        "apiVersion": INFERENCE_POOL.api_version,
        "kind": INFERENCE_POOL.kind,
        "metadata": object_meta(cr, name=inference_pool_name(cr), component=COMPONENT_FRONTEND),
        "spec": spec,
    }
    return [*build_frontend_pods_service(cr), pool]
