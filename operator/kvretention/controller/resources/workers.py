"""Worker pools: a headless Service and a Deployment per role (aggregated, or prefill + decode).

Every worker pod runs the capability probe first, as an init container named ``probe`` whose
termination message is the probe's JSON report; the operator reads it from the pod status. With
hints on, the pools that retain run the retention plugin's eviction policy (``sglang_args``).
Workers that use Mooncake mount the client config; its hash in the pod template rolls them when it
changes.
"""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import STARTUP_ALLOWANCE_SECONDS, KvRetentionDeployment
from kvretention.api.names import HEALTH_PATH, PROBE_CONTAINER, Role
from kvretention.controller.resources.common import (
    CLI,
    COMPONENT_DECODE,
    COMPONENT_PREFILL,
    COMPONENT_WORKER,
    CONFIG_HASH_ANNOTATION,
    WORKER_PORT,
    Manifest,
    build_deployment,
    build_service,
    child_name,
    container_security,
    http_probes,
    metrics_args,
    metrics_container_port,
    object_meta,
    resources_dict,
    selector_labels,
)
from kvretention.controller.resources.hop_key import build_hop_key_args, build_hop_key_volumes
from kvretention.controller.resources.mooncake import (
    CONFIG_KEY,
    CONFIG_MOUNT_DIR,
    CONFIG_PATH,
    CONFIG_PATH_ENV,
    CONFIG_SUFFIX,
    LOCAL_HOSTNAME_ENV,
    config_hash,
    uses_mooncake,
)
from kvretention.controller.resources.sglang_args import (
    build_sglang_args,
    pool_for,
    user_plugins_env,
)
from kvretention.retention.pins import RATIO_ENV as PIN_RATIO_ENV

PRESTOP_SECONDS: Final = 10
"""A stopping worker keeps serving this long before its SIGTERM: the router's DNS discovery (every
5 s) and health poll (every 2 s) drop a terminating pod first, so no new request reaches it."""
SHUTDOWN_MARGIN_SECONDS: Final = 15
"""After the drain: time for the engine to exit before the kubelet's SIGKILL."""
TERMINATION_LOG: Final = "/dev/termination-log"
WORKER_CONTAINER: Final = "worker"
SHM_SIZE: Final = "16Gi"
STARTUP_PERIOD_SECONDS: Final = 10
"""The startup probe's period; ``workers.startupTimeoutSeconds`` sets how many periods it waits."""

ROLE_SUFFIX: Final[dict[Role, str]] = {
    "aggregated": "worker",
    "prefill": "prefill",
    "decode": "decode",
}
ROLE_COMPONENT: Final[dict[Role, str]] = {
    "aggregated": COMPONENT_WORKER,
    "prefill": COMPONENT_PREFILL,
    "decode": COMPONENT_DECODE,
}


def worker_roles(cr: KvRetentionDeployment) -> list[Role]:
    if cr.spec.workers.mode == "disaggregated":
        return ["prefill", "decode"]
    return ["aggregated"]


def role_replicas(cr: KvRetentionDeployment, role: Role) -> int:
    """Prefill sizes itself; the aggregated or decode pool follows ``workers.replicas`` (scale)."""
    workers = cr.spec.workers
    if role == "prefill" and workers.prefill is not None:
        return workers.prefill.replicas
    return workers.replicas


def role_mounts_mooncake(cr: KvRetentionDeployment, role: Role) -> bool:
    return role != "decode" and uses_mooncake(cr.spec)


KV_EVENTS_CONFIG_FLAG: Final = "--kv-events-config"
"""The SGLang flag ``worker --kv-events`` adds itself (and refuses after ``--``): the worker must know
where its engine publishes."""


def serves_residency(cr: KvRetentionDeployment, role: Role) -> bool:
    """``router.kvEvents``: the pool runs ``worker --kv-events`` when the router reads its
    residency, which it does for aggregated and prefill workers only (a disaggregated session is
    placed by its prefill worker), so a decode worker is spared the engine's event stream."""
    return cr.spec.router.kv_events and role != "decode"


def build_probe_container(cr: KvRetentionDeployment) -> dict[str, Any]:
    """The capability probe. It sees the worker's ``SGLANG_PLUGINS`` (from ``workers.pod.env``,
    which otherwise reaches only the main container), so it judges the retention plugin with the
    same plugin whitelist the engine will run under."""
    container: dict[str, Any] = {
        "name": PROBE_CONTAINER,
        "image": cr.spec.workers.image,
        "command": [CLI, "probe", "--report-only", "--termination-log", TERMINATION_LOG],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "File",
        "securityContext": container_security(),
    }
    plugins = user_plugins_env(cr.spec)
    if plugins is not None:
        container["env"] = [dict(plugins)]
    return container


def build_worker_command(cr: KvRetentionDeployment, role: Role) -> list[str]:
    command = [
        CLI,
        "worker",
        "--engine",
        "sglang",
        "--role",
        role,
        "--host",
        "0.0.0.0",
        "--port",
        str(WORKER_PORT),
        *metrics_args(),
    ]
    if role == "prefill":
        command += ["--bootstrap-port", str(cr.spec.workers.bootstrap_port)]
    transfer = cr.spec.kv_store.mooncake.transfer
    if role != "aggregated" and transfer.protocol == "rdma" and transfer.device:
        command += ["--ib-device", transfer.device]
    command += ["--drain-seconds", str(cr.spec.workers.drain_seconds)]
    if cr.spec.workers.planning_threads is not None:
        command += ["--planning-threads", str(cr.spec.workers.planning_threads)]
    if serves_residency(cr, role):
        command.append("--kv-events")
    command += build_hop_key_args(cr)
    return [*command, "--", *build_sglang_args(cr.spec, role=role)]


def termination_grace_seconds(cr: KvRetentionDeployment) -> int:
    """preStop (the router lets go) + the drain (streams finish) + the engine's exit."""
    return PRESTOP_SECONDS + cr.spec.workers.drain_seconds + SHUTDOWN_MARGIN_SECONDS


def startup_failure_threshold(cr: KvRetentionDeployment) -> int:
    """Startup probe periods in ``workers.startupTimeoutSeconds``, rounded up."""
    return -(-cr.spec.workers.startup_timeout_seconds // STARTUP_PERIOD_SECONDS)


def progress_deadline_seconds(cr: KvRetentionDeployment) -> int:
    """The worker Deployments' ``progressDeadlineSeconds``: ``rollout.progressDeadlineSeconds``,
    else the startup window plus time to schedule the pod and pull the image. Kubernetes' default
    (600 s) is shorter than loading a large model: the rollout would read as stuck while it loads."""
    workers = cr.spec.workers
    if workers.rollout.progress_deadline_seconds is not None:
        return workers.rollout.progress_deadline_seconds
    return workers.startup_timeout_seconds + STARTUP_ALLOWANCE_SECONDS


def build_worker_pdb(cr: KvRetentionDeployment, role: Role) -> Manifest:
    """A PodDisruptionBudget per pool: node drains evict at most ``rollout.maxUnavailable``."""
    component = ROLE_COMPONENT[role]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(cr, name=child_name(cr, ROLE_SUFFIX[role]), component=component),
        "spec": {
            "maxUnavailable": cr.spec.workers.rollout.max_unavailable,
            "selector": {"matchLabels": selector_labels(cr, component)},
        },
    }


def _volumes(
    cr: KvRetentionDeployment, role: Role
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, worker container mounts)."""
    volumes: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}}
    ]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    if role_mounts_mooncake(cr, role):
        volumes.append(
            {
                "name": "mooncake-config",
                "configMap": {
                    "name": child_name(cr, CONFIG_SUFFIX),
                    "items": [{"key": CONFIG_KEY, "path": CONFIG_KEY}],
                },
            }
        )
        mounts.append({"name": "mooncake-config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True})
    volume = cr.spec.model.volume
    if volume is not None:
        source: dict[str, Any] = (
            {"persistentVolumeClaim": {"claimName": volume.claim_name, "readOnly": True}}
            if volume.claim_name is not None
            else {"hostPath": {"path": volume.host_path, "type": "Directory"}}
        )
        volumes.append({"name": "model", **source})
        mounts.append({"name": "model", "mountPath": volume.mount_path, "readOnly": True})
    hop_volumes, hop_mounts = build_hop_key_volumes(cr)
    return volumes + hop_volumes, mounts + hop_mounts


def _env(cr: KvRetentionDeployment, role: Role) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
    ]
    if role_mounts_mooncake(cr, role):
        env += [
            {"name": CONFIG_PATH_ENV, "value": CONFIG_PATH},
            # SGLang prefers this over the config file: each pod registers its own IP.
            {"name": LOCAL_HOSTNAME_ENV, "value": "$(POD_IP)"},
        ]
    ratio = cr.spec.workers.radix_pin_ratio
    if ratio is not None:
        env.append({"name": PIN_RATIO_ENV, "value": str(ratio)})
    return env


def build_worker_container(
    cr: KvRetentionDeployment, role: Role, *, command: list[str] | None = None
) -> dict[str, Any]:
    """The worker container of a pool: the engine behind the worker's HTTP port."""
    workers = cr.spec.workers
    pool = pool_for(cr.spec, role)
    gpus = pool.tensor_parallel_size // workers.nodes_for(pool)
    gpu_limits = {workers.gpu_resource: gpus} if workers.gpu_resource else {}
    _, mounts = _volumes(cr, role)
    ports = [
        {"name": "http", "containerPort": WORKER_PORT, "protocol": "TCP"},
        metrics_container_port(),
    ]
    if role == "prefill":
        ports.append(
            {"name": "bootstrap", "containerPort": workers.bootstrap_port, "protocol": "TCP"}
        )
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": workers.image,
        "command": command if command is not None else build_worker_command(cr, role),
        "env": _env(cr, role),
        "ports": ports,
        **http_probes(WORKER_PORT),
        # Loading weights takes minutes: liveness starts only once the engine is up.
        "startupProbe": {
            "httpGet": {"path": HEALTH_PATH, "port": WORKER_PORT},
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": startup_failure_threshold(cr),
        },
        "volumeMounts": mounts,
        "securityContext": container_security(),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }
    resources = resources_dict(pool.resources, extra_limits=gpu_limits)
    if resources:
        container["resources"] = resources
    return container


def build_worker_pod_spec(
    cr: KvRetentionDeployment, role: Role, container: dict[str, Any]
) -> dict[str, Any]:
    """A worker pod: the probe init container first, then ``container``, and the volumes."""
    volumes, _ = _volumes(cr, role)
    return {
        "initContainers": [build_probe_container(cr)],
        "containers": [container],
        "volumes": volumes,
        "terminationGracePeriodSeconds": termination_grace_seconds(cr),
    }


def worker_template_annotations(cr: KvRetentionDeployment, role: Role) -> dict[str, str] | None:
    """The config hash of the mounted Mooncake config, so a change rolls the pool's pods."""
    return {CONFIG_HASH_ANNOTATION: config_hash(cr)} if role_mounts_mooncake(cr, role) else None


def build_worker_service(
    cr: KvRetentionDeployment, role: Role, *, extra_selector: dict[str, str] | None = None
) -> Manifest:
    """The pool's headless Service: the router discovers the pool's workers through its DNS."""
    service_ports = [("http", WORKER_PORT, WORKER_PORT)]
    if role == "prefill":
        port = cr.spec.workers.bootstrap_port
        service_ports.append(("bootstrap", port, port))
    service = build_service(
        cr,
        name=child_name(cr, ROLE_SUFFIX[role]),
        component=ROLE_COMPONENT[role],
        ports=service_ports,
        headless=True,
    )
    if extra_selector:
        service["spec"]["selector"] = {**service["spec"]["selector"], **extra_selector}
    return service


def build_worker_pool(cr: KvRetentionDeployment, role: Role) -> list[Manifest]:
    """Headless Service + Deployment of one role."""
    workers = cr.spec.workers
    name = child_name(cr, ROLE_SUFFIX[role])
    deployment = build_deployment(
        cr,
        name=name,
        component=ROLE_COMPONENT[role],
        replicas=role_replicas(cr, role),
        pod_spec=build_worker_pod_spec(cr, role, build_worker_container(cr, role)),
        annotations=worker_template_annotations(cr, role),
        strategy={
            "type": "RollingUpdate",
            "rollingUpdate": {
                "maxSurge": workers.rollout.max_surge,
                "maxUnavailable": workers.rollout.max_unavailable,
            },
        },
        progress_deadline_seconds=progress_deadline_seconds(cr),
    )
    return [build_worker_service(cr, role), deployment, build_worker_pdb(cr, role)]


def nodes_per_replica(cr: KvRetentionDeployment, role: Role) -> int:
    """Nodes one worker of the role's pool spans (1: a Deployment pod)."""
    return cr.spec.workers.nodes_for(pool_for(cr.spec, role))


def scaled_role(cr: KvRetentionDeployment) -> Role:
    """The pool the scale subresource (``spec.workers.replicas``) sizes."""
    return "decode" if cr.spec.workers.mode == "disaggregated" else "aggregated"
