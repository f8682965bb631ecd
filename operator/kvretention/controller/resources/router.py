"""The router: a Deployment + Service; it finds workers through their headless Services' DNS, and
as the Gateway's endpoint picker the frontend pods through theirs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from kvretention.api.models import FrontendSpec, KvRetentionDeployment, RouterSpec
from kvretention.controller.resources.common import (
    COMPONENT_ROUTER,
    ROUTER_PORT,
    WORKER_PORT,
    ExtraPort,
    Manifest,
    build_deployment,
    build_service,
    child_name,
    http_container,
    serve_command,
    service_host,
)
from kvretention.controller.resources.endpoint_picker import build_picker_args, picker_ports
from kvretention.controller.resources.hop_key import build_hop_key_args, build_hop_key_volumes
from kvretention.controller.resources.workers import ROLE_SUFFIX

ROUTER_SUFFIX: Final = "router"


def router_url(cr: KvRetentionDeployment) -> str:
    """The URL the frontend reaches the router at (same namespace, short Service name)."""
    return f"http://{child_name(cr, ROUTER_SUFFIX)}:{ROUTER_PORT}"


ROUTER_POLICY: Final = {"CacheAware": "cache-aware", "LeastOutstanding": "least-outstanding"}


def build_placement_args(cr: KvRetentionDeployment) -> list[str]:
    """The placement flags of whichever process places (the router, or the frontend)."""
    residency = ["--kv-residency"] if cr.spec.router.kv_events else []
    return ["--policy", ROUTER_POLICY[cr.spec.router.policy], *residency]


def build_router_command(cr: KvRetentionDeployment) -> list[str]:
    command = serve_command("router", ROUTER_PORT)
    command += [*build_placement_args(cr), *build_hop_key_args(cr)]
    command += build_picker_args(cr)
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


def build_http_workload(
    cr: KvRetentionDeployment,
    spec: FrontendSpec | RouterSpec,
    *,
    name: str,
    component: str,
    command: list[str],
    port: int,
    service_port: int,
    volumes: tuple[list[Manifest], list[Manifest]],
    service_type: str = "ClusterIP",
    service_spec: dict[str, Any] | None = None,
    extra_ports: Sequence[ExtraPort] = (),
) -> list[Manifest]:
    """Service + Deployment of a kvretention HTTP process (frontend, router): both are built
    here so a change to their shape reaches both. ``volumes`` are the pod's volumes and the
    container's mounts; ``service_port`` is the Service's port in front of the pods' ``port``;
    ``extra_ports`` are served on both."""
    container = http_container(
        component, spec.image, command, port, spec.resources, extra_ports=extra_ports
    )
    pod_volumes, mounts = volumes
    if mounts:
        container["volumeMounts"] = mounts
    service = build_service(
        cr,
        name=name,
        component=component,
        ports=[("http", service_port, port)],
        service_type=service_type,
        extra_ports=extra_ports,
        extra_spec=service_spec,
    )
    deployment = build_deployment(
        cr,
        name=name,
        component=component,
        replicas=spec.replicas,
        pod_spec={"containers": [container], **({"volumes": pod_volumes} if pod_volumes else {})},
    )
    return [service, deployment]


def build_router(cr: KvRetentionDeployment) -> list[Manifest]:
    """Service + Deployment of the router."""
    spec = cr.spec.router
    affinity: dict[str, Any] = {"sessionAffinity": spec.session_affinity.type}
    if spec.session_affinity.type == "ClientIP":
        affinity["sessionAffinityConfig"] = {
            "clientIP": {"timeoutSeconds": spec.session_affinity.timeout_seconds}
        }
    return build_http_workload(
        cr,
        spec,
        name=child_name(cr, ROUTER_SUFFIX),
        component=COMPONENT_ROUTER,
        command=build_router_command(cr),
        port=ROUTER_PORT,
        service_port=ROUTER_PORT,
        volumes=build_hop_key_volumes(cr),
        service_spec=affinity,
        extra_ports=picker_ports(cr),
    )
