"""The router: a Deployment + Service; it finds workers through their headless Services' DNS."""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.common import (
    COMPONENT_ROUTER,
    ROUTER_PORT,
    WORKER_PORT,
    Manifest,
    build_deployment,
    build_service,
    child_name,
    http_container,
    serve_command,
    service_host,
)
from kvretention.controller.resources.hop_key import build_hop_key_args, build_hop_key_volumes
from kvretention.controller.resources.workers import ROLE_SUFFIX

ROUTER_SUFFIX: Final = "router"


def router_url(cr: KvRetentionDeployment) -> str:
    """The URL the frontend reaches the router at (same namespace, short Service name)."""
    return f"http://{child_name(cr, ROUTER_SUFFIX)}:{ROUTER_PORT}"


ROUTER_POLICY: Final = {"CacheAware": "cache-aware", "LeastOutstanding": "least-outstanding"}


def build_router_command(cr: KvRetentionDeployment) -> list[str]:
    policy = ROUTER_POLICY[cr.spec.router.policy]
    command = serve_command("router", ROUTER_PORT)
    command += ["--policy", policy, *build_hop_key_args(cr)]
    if cr.spec.workers.mode == "disaggregated":
        command += [
            "--prefill-dns",
            f"{service_host(cr, ROLE_SUFFIX['prefill'])}:{WORKER_PORT}",
            "--decode-dns",
            f"{service_host(cr, ROLE_SUFFIX['decode'])}:{WORKER_PORT}",
        ]
        return command
    command += ["--worker-dns", f"{service_host(cr, ROLE_SUFFIX['aggregated'])}:{WORKER_PORT}"]
    return command


def build_router(cr: KvRetentionDeployment) -> list[Manifest]:
    """Service + Deployment of the router."""
    spec = cr.spec.router
    name = child_name(cr, ROUTER_SUFFIX)
    container = http_container(
        "router", spec.image, build_router_command(cr), ROUTER_PORT, spec.resources
    )
    volumes, mounts = build_hop_key_volumes(cr)
    if mounts:
        container["volumeMounts"] = mounts
    affinity: dict[str, Any] = {"sessionAffinity": spec.session_affinity.type}
    if spec.session_affinity.type == "ClientIP":
        affinity["sessionAffinityConfig"] = {
            "clientIP": {"timeoutSeconds": spec.session_affinity.timeout_seconds}
        }
    service = build_service(
        cr,
        name=name,
        component=COMPONENT_ROUTER,
        ports=[("http", ROUTER_PORT, ROUTER_PORT)],
        extra_spec=affinity,
    )
    deployment = build_deployment(
        cr,
        name=name,
        component=COMPONENT_ROUTER,
        replicas=spec.replicas,
        pod_spec={"containers": [container], **({"volumes": volumes} if volumes else {})},
    )
    return [service, deployment]
