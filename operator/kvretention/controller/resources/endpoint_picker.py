"""The router as the InferencePool's endpoint picker (InferencePool v1 requires one, so every pool
the operator renders names the router): the router's ``ext_proc`` port and flags, and the headless
Service whose DNS names the frontend pods it picks among.

A Gateway that implements the Inference Extension asks the picker, over Envoy ``ext_proc``, which of
the pool's pods serves a request, and sends it to that pod's IP. The router resolves
``<name>-frontend-pods`` (headless: one A record per ready frontend pod, so not-ready pods are never
picked) to learn those IPs; the frontend Service's virtual IP would hide them.
"""

from __future__ import annotations

from typing import Final

from kvretention.api.models import FRONTEND_PODS_SUFFIX, KvRetentionDeployment
from kvretention.controller.resources.common import (
    COMPONENT_FRONTEND,
    FRONTEND_PORT,
    ROUTER_EXT_PROC_PORT,
    ExtraPort,
    Manifest,
    build_service,
    child_name,
    service_host,
    session_keys_arg,
)

EXT_PROC_PORT: Final = ExtraPort("ext-proc", ROUTER_EXT_PROC_PORT, "kubernetes.io/h2c")
"""ext_proc is gRPC: cleartext HTTP/2, which ``kubernetes.io/h2c`` (KEP-3726) names for Gateways."""


def picks_endpoints(cr: KvRetentionDeployment) -> bool:
    """Whether the router is the InferencePool's endpoint picker: whenever there is a pool."""
    return cr.spec.gateway.inference_pool.enabled


def build_picker_args(cr: KvRetentionDeployment) -> list[str]:
    """The router's ``--ext-proc-port``, ``--endpoint-dns`` (the frontend pods by their headless
    Service) and the frontend's ``--session-keys`` (a session's requests go to one frontend);
    nothing when the router is not the picker."""
    if not picks_endpoints(cr):
        return []
    return [
        "--ext-proc-port",
        str(EXT_PROC_PORT.port),
        "--endpoint-dns",
        f"{service_host(cr, FRONTEND_PODS_SUFFIX)}:{FRONTEND_PORT}",
        session_keys_arg(cr),
    ]


def picker_ports(cr: KvRetentionDeployment) -> tuple[ExtraPort, ...]:
    """The router's ext-proc port, on its container and its Service, when it is the picker."""
    return (EXT_PROC_PORT,) if picks_endpoints(cr) else ()


def build_frontend_pods_service(cr: KvRetentionDeployment) -> list[Manifest]:
    """The headless Service over the frontend pods' HTTP port the picker resolves; none (and the
    executor prunes a live one) when the router is not the picker."""
    if not picks_endpoints(cr):
        return []
    service = build_service(
        cr,
        name=child_name(cr, FRONTEND_PODS_SUFFIX),
        component=COMPONENT_FRONTEND,
        ports=[("http", FRONTEND_PORT, FRONTEND_PORT)],
        headless=True,
    )
    return [service]
