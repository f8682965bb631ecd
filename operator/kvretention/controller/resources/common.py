"""Shared pieces of every child manifest: names, labels, owner references, hashes, probes."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from kvretention.api.models import (
    DEFAULT_SERVICE_REQUESTS,
    KvRetentionDeployment,
    PodOptions,
    ResourceRequirements,
    is_extended_resource,
)
from kvretention.api.names import APP_NAME as APP_NAME
from kvretention.api.names import FIELD_MANAGER, HEALTH_PATH, READY_PATH, pod_selector_labels
from kvretention.api.names import LABEL_COMPONENT as LABEL_COMPONENT
from kvretention.api.names import LABEL_INSTANCE as LABEL_INSTANCE
from kvretention.api.names import LABEL_MANAGED_BY as LABEL_MANAGED_BY
from kvretention.api.names import LABEL_NAME as LABEL_NAME
from kvretention.ports import FRONTEND_PORT as FRONTEND_PORT
from kvretention.ports import METRICS_PORT as METRICS_PORT
from kvretention.ports import ROUTER_EXT_PROC_PORT as ROUTER_EXT_PROC_PORT
from kvretention.ports import ROUTER_PORT as ROUTER_PORT
from kvretention.ports import WORKER_PORT as WORKER_PORT

Manifest = dict[str, Any]

CONFIG_HASH_ANNOTATION: Final = "kvretention.io/config-hash"
"""Pod-template annotation: hash of the mounted config, so a config change rolls those pods."""

CLI: Final = "kvretention"

COMPONENT_FRONTEND: Final = "frontend"
COMPONENT_ROUTER: Final = "router"
COMPONENT_WORKER: Final = "worker"
COMPONENT_PREFILL: Final = "worker-prefill"
COMPONENT_DECODE: Final = "worker-decode"
COMPONENT_MOONCAKE: Final = "mooncake-master"


def child_name(cr: KvRetentionDeployment, suffix: str) -> str:
    """``<cr name>-<suffix>``: every child is named after its owner."""
    return f"{cr.name}-{suffix}"


def service_host(cr: KvRetentionDeployment, suffix: str) -> str:
    """The in-cluster DNS name of the child Service ``<cr name>-<suffix>``."""
    return f"{child_name(cr, suffix)}.{cr.namespace}.svc"


def selector_labels(cr: KvRetentionDeployment, component: str) -> dict[str, str]:
    """The labels a Deployment/Service selects its pods by (immutable once created)."""
    return pod_selector_labels(cr.name, component)


def labels(cr: KvRetentionDeployment, component: str) -> dict[str, str]:
    return {**selector_labels(cr, component), LABEL_MANAGED_BY: FIELD_MANAGER}


def owner_references(cr: KvRetentionDeployment) -> list[dict[str, Any]]:
    """The CR as controller owner, so deleting it garbage-collects the child (needs a uid)."""
    uid = cr.metadata.get("uid")
    if not uid:
        return []
    return [
        {
            "apiVersion": cr.api_version,
            "kind": cr.kind,
            "name": cr.name,
            "uid": str(uid),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def object_meta(cr: KvRetentionDeployment, *, name: str, component: str) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": cr.namespace,
        "labels": labels(cr, component),
    }
    refs = owner_references(cr)
    if refs:
        meta["ownerReferences"] = refs
    return meta


def content_hash(data: Any) -> str:
    """A short stable hash of JSON-able data (sorted keys, so dict order never matters)."""
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def resources_dict(
    resources: ResourceRequirements | None, *, extra_limits: dict[str, int] | None = None
) -> dict[str, Any]:
    """A container ``resources`` block; ``extra_limits`` fill in limits the user did not set.

    An extended resource (``nvidia.com/gpu``) requested without a limit gets a limit equal to the
    request: Kubernetes refuses such a pod otherwise, since extended resources never overcommit.
    """
    out: dict[str, Any] = {}
    requests = dict(resources.requests or {}) if resources else {}
    limits = dict(resources.limits or {}) if resources else {}
    for key, value in requests.items():
        if is_extended_resource(key):
            limits.setdefault(key, value)
    for key, value in (extra_limits or {}).items():
        limits.setdefault(key, value)
    if requests:
        out["requests"] = {k: requests[k] for k in sorted(requests)}
    if limits:
        out["limits"] = {k: limits[k] for k in sorted(limits)}
    return out


def http_probes(
    port: int, *, health_path: str = HEALTH_PATH, ready_path: str = READY_PATH
) -> dict[str, Any]:
    """Liveness on ``/healthz`` and readiness on ``/readyz``: every kvretention process serves both.

    The kubelet's default 1 s timeout is shorter than a Python process's answer on a node whose
    cores are busy prefilling; a missed probe there would take a serving pod out of its Service
    (readiness) or restart it (liveness), so each probe has seconds to answer."""
    return {
        "livenessProbe": {
            "httpGet": {"path": health_path, "port": port},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": ready_path, "port": port},
            "periodSeconds": 5,
            "timeoutSeconds": 3,
            "failureThreshold": 2,
        },
    }


METRICS_PORT_NAME: Final = "metrics"
"""The container port scrapers use (the chart's PodMonitor names it): ``/metrics`` only."""


def metrics_args() -> list[str]:
    """The frontend's, router's and worker's ``--metrics-port``: ``/metrics`` alone on its own
    port, the only one ``networkPolicy.metricsFrom`` opens, so a scraper reaches no API route."""
    return ["--metrics-port", str(METRICS_PORT)]


def serve_command(subcommand: str, port: int) -> list[str]:
    """``kvretention <subcommand>`` listening on every address at ``port``, metrics beside it."""
    return [CLI, subcommand, "--host", "0.0.0.0", "--port", str(port), *metrics_args()]


@dataclass(frozen=True)
class ExtraPort:
    """A port a process serves besides its HTTP one, on its container and its Service."""

    name: str
    port: int
    app_protocol: str
    """The Service port's ``appProtocol``: how a Gateway or mesh speaks to it."""


def session_keys_arg(cr: KvRetentionDeployment) -> str:
    """``--session-keys``, comma-separated in order (empty: no sessions): the frontend's, and the
    router's as the endpoint picker, which must read a request's session where the frontend does."""
    return f"--session-keys={','.join(cr.spec.router.session_keys)}"


def metrics_container_port() -> dict[str, Any]:
    return {"name": METRICS_PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}


def container_security() -> dict[str, Any]:
    """A fresh securityContext per container (manifests never share mutable parts)."""
    return {"allowPrivilegeEscalation": False}


def http_container(
    name: str,
    image: str,
    command: list[str],
    port: int,
    resources: ResourceRequirements | None,
    *,
    extra_ports: Sequence[ExtraPort] = (),
) -> dict[str, Any]:
    """The container of a kvretention HTTP process (frontend, router): its port, any
    ``extra_ports`` and the metrics port, ``/healthz`` and ``/readyz`` probes, no privilege
    escalation, and its resources."""
    container: dict[str, Any] = {
        "name": name,
        "image": image,
        "command": command,
        "ports": [
            {"name": "http", "containerPort": port, "protocol": "TCP"},
            *({"name": p.name, "containerPort": p.port, "protocol": "TCP"} for p in extra_ports),
            metrics_container_port(),
        ],
        **http_probes(port),
        "securityContext": container_security(),
    }
    container["resources"] = service_resources(resources)
    return container


def service_resources(resources: ResourceRequirements | None) -> dict[str, Any]:
    """A frontend's, router's or master's ``resources``: the user's, else
    :data:`DEFAULT_SERVICE_REQUESTS` (never BestEffort)."""
    if resources is None:
        return {"requests": dict(DEFAULT_SERVICE_REQUESTS)}
    return resources_dict(resources)


def pod_options(cr: KvRetentionDeployment, component: str) -> PodOptions | None:
    """The user's placement and identity options for one component's pods."""
    spec = cr.spec
    by_component = {
        COMPONENT_FRONTEND: spec.frontend.pod,
        COMPONENT_ROUTER: spec.router.pod,
        COMPONENT_WORKER: spec.workers.pod,
        COMPONENT_PREFILL: spec.workers.pod,
        COMPONENT_DECODE: spec.workers.pod,
        COMPONENT_MOONCAKE: spec.kv_store.mooncake.master.pod,
    }
    return by_component.get(component)


def apply_pod_options(pod_spec: dict[str, Any], options: PodOptions) -> dict[str, Any]:
    """``pod_spec`` with the user's options: set fields only, extra env/mounts on the main
    containers (not the init containers), extra volumes after the operator's."""
    out = dict(pod_spec)
    dumped = options.model_dump(mode="json", by_alias=True, exclude_none=True)
    for key in (
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
        "runtimeClassName",
        "imagePullSecrets",
        "serviceAccountName",
    ):
        if dumped.get(key):
            out[key] = dumped[key]
    if options.volumes:
        out["volumes"] = [*out.get("volumes", []), *options.volumes]
    if options.env or options.volume_mounts:
        containers = []
        for container in out["containers"]:
            container = dict(container)
            if options.env:
                container["env"] = [*container.get("env", []), *options.env]
            if options.volume_mounts:
                container["volumeMounts"] = [
                    *container.get("volumeMounts", []),
                    *options.volume_mounts,
                ]
            containers.append(container)
        out["containers"] = containers
    return out


def build_deployment(
    cr: KvRetentionDeployment,
    *,
    name: str,
    component: str,
    replicas: int,
    pod_spec: dict[str, Any],
    annotations: dict[str, str] | None = None,
    strategy: dict[str, Any] | None = None,
    progress_deadline_seconds: int | None = None,
) -> Manifest:
    """An apps/v1 Deployment whose pods carry the component's labels and the user's pod options."""
    options = pod_options(cr, component)
    template_meta: dict[str, Any] = {"labels": labels(cr, component)}
    pod_annotations = dict(annotations or {})
    if options is not None:
        # The operator's own labels and annotations win (check_spec refuses a clash anyway).
        template_meta["labels"] = {**options.labels, **template_meta["labels"]}
        pod_annotations = {**options.annotations, **pod_annotations}
        pod_spec = apply_pod_options(pod_spec, options)
    if pod_annotations:
        template_meta["annotations"] = dict(sorted(pod_annotations.items()))
    spec: dict[str, Any] = {
        "replicas": replicas,
        "selector": {"matchLabels": selector_labels(cr, component)},
        "template": {"metadata": template_meta, "spec": pod_spec},
    }
    if strategy is not None:
        spec["strategy"] = strategy
    if progress_deadline_seconds is not None:
        spec["progressDeadlineSeconds"] = progress_deadline_seconds
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(cr, name=name, component=component),
        "spec": spec,
    }


def build_service(
    cr: KvRetentionDeployment,
    *,
    name: str,
    component: str,
    ports: list[tuple[str, int, int]],
    service_type: str = "ClusterIP",
    headless: bool = False,
    extra_ports: Sequence[ExtraPort] = (),
    extra_spec: dict[str, Any] | None = None,
) -> Manifest:
    """A v1 Service; ``ports`` are (name, port, targetPort), ``extra_ports`` the same port on the
    Service and the pods, with their ``appProtocol``; headless publishes every pod IP."""
    spec: dict[str, Any] = {
        "type": service_type,
        "selector": selector_labels(cr, component),
        "ports": [
            *(
                {"name": pname, "port": port, "targetPort": target, "protocol": "TCP"}
                for pname, port, target in ports
            ),
            *(
                {
                    "name": p.name,
                    "port": p.port,
                    "targetPort": p.port,
                    "protocol": "TCP",
                    "appProtocol": p.app_protocol,
                }
                for p in extra_ports
            ),
        ],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = False
    spec.update(extra_spec or {})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(cr, name=name, component=component),
        "spec": spec,
    }
