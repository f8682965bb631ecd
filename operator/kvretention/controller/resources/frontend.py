"""The frontend: the client-facing OpenAI/Anthropic endpoint (Deployment + Service)."""

from __future__ import annotations

from typing import Final

from kvretention.api.models import KvRetentionDeployment, TenantLimitsSpec
from kvretention.controller.resources.common import (
    COMPONENT_FRONTEND,
    FRONTEND_PORT,
    WORKER_PORT,
    Manifest,
    child_name,
    serve_command,
    service_host,
    session_keys_arg,
)
from kvretention.controller.resources.hop_key import build_hop_key_args, build_hop_key_volumes
from kvretention.controller.resources.router import (
    build_http_workload,
    build_placement_args,
    router_url,
)
from kvretention.controller.resources.workers import ROLE_SUFFIX

FRONTEND_SUFFIX: Final = "frontend"
AUTH_MOUNT: Final = "/etc/kvretention/auth"
"""Where each auth Secret is mounted in the frontend: ``<AUTH_MOUNT>/<secret name>``."""
AUTH_VOLUME_PREFIX: Final = "auth-keys-"
CODEX_MOUNT: Final = "/etc/kvretention/codex"
"""Where ``spec.frontend.codexInstructions`` is mounted: its key as ``<CODEX_MOUNT>/<CODEX_FILE>``."""
CODEX_FILE: Final = "instructions"
CODEX_VOLUME: Final = "codex-instructions"


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


def _share(count: int, replicas: int) -> int:
    """One pod's share of a whole-number limit: at most its part of the total, at least 1."""
    return max(1, count // replicas)


def _limits_arg(limits: TenantLimitsSpec, *, replicas: int) -> str:
    """One frontend pod's limits: the spec's fleet-wide limits divided among ``replicas`` pods.

    The pods share no state, so each enforces its own share; with the Service spreading clients
    the fleet-wide total is the spec's (less, when a limit is smaller than the replica count and
    each pod keeps 1)."""
    n = max(1, replicas)
    parts = []
    if limits.requests_per_second is not None:
        parts.append(f"rps={limits.requests_per_second / n:.6g}")
    if limits.burst is not None:
        parts.append(f"burst={_share(limits.burst, n)}")
    if limits.concurrency is not None:
        parts.append(f"concurrency={_share(limits.concurrency, n)}")
    return ",".join(parts)


def build_auth_args(cr: KvRetentionDeployment) -> list[str]:
    """``--auth-keys-dir`` per Secret and each pod's share of the tenants' limits; nothing with
    auth off."""
    auth = cr.spec.frontend.auth
    if auth is None:
        return []
    replicas = cr.spec.frontend.replicas
    args = [f"--auth-keys-dir={AUTH_MOUNT}/{ref.name}" for ref in auth.secret_refs]
    default = _limits_arg(auth.limits, replicas=replicas)
    if default:
        args.append(f"--tenant-limits={default}")
    args += [f"--tenant-limit={t.name}:{_limits_arg(t, replicas=replicas)}" for t in auth.tenants]
    return args


def build_auth_volumes(cr: KvRetentionDeployment) -> tuple[list[Manifest], list[Manifest]]:
    """The auth Secrets as read-only volumes (not subPath: the kubelet then updates the files in
    place, which is how a rotated key reaches the running frontend) and their mounts."""
    auth = cr.spec.frontend.auth
    if auth is None:
        return [], []
    volumes: list[Manifest] = []
    mounts: list[Manifest] = []
    for i, ref in enumerate(auth.secret_refs):
        volume = f"{AUTH_VOLUME_PREFIX}{i}"
        volumes.append({"name": volume, "secret": {"secretName": ref.name, "defaultMode": 0o444}})
        mounts.append({"name": volume, "mountPath": f"{AUTH_MOUNT}/{ref.name}", "readOnly": True})
    return volumes, mounts


def build_codex_instructions(
    cr: KvRetentionDeployment,
) -> tuple[list[str], list[Manifest], list[Manifest]]:
    """``--codex-instructions-file``, the ConfigMap key it names as a volume (one item: a missing
    key fails the mount, so the pod never starts without the text) and its mount; nothing when
    ``spec.frontend.codexInstructions`` is unset."""
    spec = cr.spec.frontend.codex_instructions
    if spec is None:
        return [], [], []
    ref = spec.config_map_key_ref
    volume = {
        "name": CODEX_VOLUME,
        "configMap": {
            "name": ref.name,
            "items": [{"key": ref.key, "path": CODEX_FILE}],
            "defaultMode": 0o444,
        },
    }
    mount = {"name": CODEX_VOLUME, "mountPath": CODEX_MOUNT, "readOnly": True}
    return [f"--codex-instructions-file={CODEX_MOUNT}/{CODEX_FILE}"], [volume], [mount]


def build_upstream_args(cr: KvRetentionDeployment) -> list[str]:
    """Where requests go: the router, or (``router.placement: Frontend``) the aggregated workers,
    placed in the frontend with the router's own policy and residency flags."""
    if cr.spec.router.placement == "Router":
        return ["--router-url", router_url(cr)]
    return [
        "--worker-dns",
        f"{service_host(cr, ROLE_SUFFIX['aggregated'])}:{WORKER_PORT}",
        *build_placement_args(cr),
    ]


def build_frontend_command(cr: KvRetentionDeployment) -> list[str]:
    aliases = [f"--model-alias={alias}={cr.spec.model.name}" for alias in cr.spec.model.aliases]
    # An empty value turns session affinity off.
    session = session_keys_arg(cr)
    return [
        *serve_command("frontend", FRONTEND_PORT),
        *build_upstream_args(cr),
        "--model",
        cr.spec.model.name,
        # A provider turned off gets its cache controls accepted and ignored, never a hint.
        "--openai-hints" if cr.spec.hints.providers.openai else "--no-openai-hints",
        "--anthropic-hints" if cr.spec.hints.providers.anthropic else "--no-anthropic-hints",
        *build_hint_policy_args(cr),
        *aliases,
        session,
        *build_auth_args(cr),
        *build_hop_key_args(cr),
        *build_codex_instructions(cr)[0],
        *build_memory_args(cr),
    ]


def build_memory_args(cr: KvRetentionDeployment) -> list[str]:
    """``--remembered-conversations`` when the spec sets it (unset: the frontend's default, and
    the rendered command of fleets that never set it stays as it was)."""
    remembered = cr.spec.frontend.remembered_conversations
    return [] if remembered is None else [f"--remembered-conversations={remembered}"]


def build_frontend(cr: KvRetentionDeployment) -> list[Manifest]:
    """Service + Deployment of the frontend."""
    spec = cr.spec.frontend
    volumes, mounts = build_auth_volumes(cr)
    hop_volumes, hop_mounts = build_hop_key_volumes(cr)
    _, codex_volumes, codex_mounts = build_codex_instructions(cr)
    return build_http_workload(
        cr,
        spec,
        name=child_name(cr, FRONTEND_SUFFIX),
        component=COMPONENT_FRONTEND,
        command=build_frontend_command(cr),
        port=FRONTEND_PORT,
        service_port=spec.service.port,
        volumes=(volumes + hop_volumes + codex_volumes, mounts + hop_mounts + codex_mounts),
        service_type=spec.service.type,
    )
