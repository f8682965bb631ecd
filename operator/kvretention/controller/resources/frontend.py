"""The frontend: the client-facing OpenAI/Anthropic endpoint (Deployment + Service)."""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.controller.resources.common import (
    CLI,
    COMPONENT_FRONTEND,
    FRONTEND_PORT,
    Manifest,
    build_deployment,
    build_service,
    child_name,
    container_security,
    http_probes,
    resources_dict,
    service_host,
)
from kvretention.controller.resources.router import router_url

FRONTEND_SUFFIX: Final = "frontend"


def frontend_endpoint(cr: KvRetentionDeployment) -> str:
    """``status.endpoint``: the URL clients inside the cluster use."""
    port = cr.spec.frontend.service.port
    return f"http://{service_host(cr, FRONTEND_SUFFIX)}:{port}"


def build_hint_policy_args(cr: KvRetentionDeployment) -> list[str]:
    """How breakpoints, priority, the fleet's default TTL and client normalisation are rendered."""
    hints = cr.spec.hints
    args = [f"--breakpoints={hints.breakpoints.lower()}", f"--hint-priority={hints.priority}"]
    if hints.default_ttl_seconds is not None:
        args.append(f"--default-ttl-seconds={hints.default_ttl_seconds}")
    args.append("--normalize-clients" if hints.normalize_clients else "--no-normalize-clients")
    # The prefix chain is only read by the router's cache-aware placement.
    cache_aware = cr.spec.router.policy == "CacheAware"
    args.append("--prefix-routing" if cache_aware else "--no-prefix-routing")
    return args


def build_frontend_command(cr: KvRetentionDeployment) -> list[str]:
    aliases = [f"--model-alias={alias}={cr.spec.model.name}" for alias in cr.spec.model.aliases]
    # Comma-separated, in order; an empty value turns session affinity off.
    session = f"--session-keys={','.join(cr.spec.router.session_keys)}"
    return [
        CLI,
        "frontend",
        "--host",
        "0.0.0.0",
        "--port",
        str(FRONTEND_PORT),
        "--router-url",
        router_url(cr),
        "--model",
        cr.spec.model.name,
        # A provider turned off gets its cache controls accepted and ignored, never a hint.
        "--openai-hints" if cr.spec.hints.providers.openai else "--no-openai-hints",
        "--anthropic-hints" if cr.spec.hints.providers.anthropic else "--no-anthropic-hints",
        *build_hint_policy_args(cr),
        *aliases,
        session,
    ]


def build_frontend(cr: KvRetentionDeployment) -> list[Manifest]:
    """Service + Deployment of the frontend."""
    spec = cr.spec.frontend
    name = child_name(cr, FRONTEND_SUFFIX)
    container: dict[str, Any] = {
        "name": "frontend",
        "image": spec.image,
        "command": build_frontend_command(cr),
        "ports": [{"name": "http", "containerPort": FRONTEND_PORT, "protocol": "TCP"}],
        **http_probes(FRONTEND_PORT),
        "securityContext": container_security(),
    }
    resources = resources_dict(spec.resources)
    if resources:
        container["resources"] = resources
    service = build_service(
        cr,
        name=name,
        component=COMPONENT_FRONTEND,
        ports=[("http", spec.service.port, FRONTEND_PORT)],
        service_type=spec.service.type,
    )
    deployment = build_deployment(
        cr,
        name=name,
        component=COMPONENT_FRONTEND,
        replicas=spec.replicas,
        pod_spec={"containers": [container]},
    )
    return [service, deployment]
