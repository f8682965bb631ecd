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
HINTS_ENV: Final = ("KVR_HINTS_POLICY", "KVR_HINTS_OPENAI", "KVR_HINTS_ANTHROPIC")
"""Hint settings handed to the frontend process (it has no flags for them)."""


def frontend_endpoint(cr: KvRetentionDeployment) -> str:
    """``status.endpoint``: the URL clients inside the cluster use."""
    port = cr.spec.frontend.service.port
    return f"http://{service_host(cr, FRONTEND_SUFFIX)}:{port}"


def build_frontend_command(cr: KvRetentionDeployment) -> list[str]:
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
    ]


def build_frontend(cr: KvRetentionDeployment) -> list[Manifest]:
    """Service + Deployment of the frontend."""
    spec = cr.spec.frontend
    hints = cr.spec.hints
    name = child_name(cr, FRONTEND_SUFFIX)
    policy_env, openai_env, anthropic_env = HINTS_ENV
    container: dict[str, Any] = {
        "name": "frontend",
        "image": spec.image,
        "command": build_frontend_command(cr),
        "env": [
            {"name": policy_env, "value": hints.policy},
            {"name": openai_env, "value": str(hints.providers.openai).lower()},
            {"name": anthropic_env, "value": str(hints.providers.anthropic).lower()},
        ],
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
