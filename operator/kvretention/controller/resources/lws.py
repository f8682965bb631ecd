"""Multinode worker pools: one LeaderWorkerSet (``leaderworkerset.x-k8s.io/v1``) per pool.

A pool whose workers span ``nodesPerReplica`` > 1 nodes renders each worker as a LeaderWorkerSet
group: a leader pod (rank 0, the worker the router calls) and ``nodesPerReplica - 1`` worker pods,
one per node. Every rank runs the same worker command, probe init container, HiCache flags and
Mooncake wiring, plus SGLang's multinode flags: ``--nnodes``, ``--node-rank`` from the
``LWS_WORKER_INDEX`` the LWS controller injects, and ``--dist-init-addr`` at the leader's stable
address (``LWS_LEADER_ADDRESS``). A non-zero rank runs no HTTP server of ours: SGLang's engine
serves its own health endpoint there (``--host``/``--port`` below), which the rank's probes read,
and the rank declares no metrics port for the PodMonitor to scrape.

The pool's headless Service selects only leaders (``worker-index: 0``), so the router registers
only them; a group restarts as a whole when any of its pods does (``RecreateGroupOnPodRestart``),
and a rollout replaces whole groups, never starting one beside them (``maxSurge`` 0 by default).
The LWS controller names its own headless Service after the LeaderWorkerSet, so the set is named
``<pool>-lws``, apart from the router's Service of the pool.
"""

from __future__ import annotations

from typing import Any, Final

from kvretention.api.models import KvRetentionDeployment
from kvretention.api.names import Role
from kvretention.controller.kinds import LEADER_WORKER_SET
from kvretention.controller.resources.common import (
    METRICS_PORT_NAME,
    WORKER_PORT,
    Manifest,
    apply_pod_options,
    child_name,
    http_probes,
    labels,
    object_meta,
    pod_options,
)
from kvretention.controller.resources.workers import (
    ROLE_COMPONENT,
    ROLE_SUFFIX,
    STARTUP_PERIOD_SECONDS,
    build_worker_command,
    build_worker_container,
    build_worker_pdb,
    build_worker_pod_spec,
    build_worker_service,
    nodes_per_replica,
    role_replicas,
    startup_failure_threshold,
    worker_template_annotations,
)

LWS_SUFFIX: Final = "lws"
"""``<fleet>-<pool>-lws``: the LWS controller creates a headless Service named after the set."""
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
"""The rank of a pod in its group, set by the LWS controller: ``0`` is the leader."""
GROUP_KEY_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-key"
"""Unique per group: anti-affinity on it keeps one group's pods on different nodes."""
LEADER_ADDRESS_ENV: Final = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV: Final = "LWS_WORKER_INDEX"
DIST_INIT_PORT: Final = 20000
"""The leader's torch.distributed rendezvous port (SGLang ``--dist-init-addr``); SGLang also uses
the few ports after it for its ZMQ sockets when a worker spans nodes."""
RANK_HEALTH_PATH: Final = "/health"
"""Where SGLang's engine on a non-zero rank answers once its schedulers are up."""
HOSTNAME_KEY: Final = "kubernetes.io/hostname"
MAX_LABEL_LENGTH: Final = 63


def lws_name(cr: KvRetentionDeployment, role: Role) -> str:
    return child_name(cr, f"{ROLE_SUFFIX[role]}-{LWS_SUFFIX}")


def longest_pod_hostname(cr: KvRetentionDeployment, role: Role) -> str:
    """The longest pod name (= hostname, a DNS label) the LWS controller gives the pool's pods:
    ``<set>-<group>-<rank>``."""
    groups = max(role_replicas(cr, role), 1)
    return f"{lws_name(cr, role)}-{groups - 1}-{nodes_per_replica(cr, role) - 1}"


def build_multinode_args(cr: KvRetentionDeployment, role: Role, *, leader: bool) -> list[str]:
    """SGLang's multinode flags; a non-zero rank also binds SGLang's own health server to the
    worker port (the engine there serves nothing else, and blocks in its schedulers)."""
    args = [
        "--nnodes",
        str(nodes_per_replica(cr, role)),
        "--node-rank",
        f"$({WORKER_INDEX_ENV})",
        "--dist-init-addr",
        f"$({LEADER_ADDRESS_ENV}):{DIST_INIT_PORT}",
    ]
    if not leader:
        args += ["--host", "0.0.0.0", "--port", str(WORKER_PORT)]
    return args


def _rank_container(cr: KvRetentionDeployment, role: Role, *, leader: bool) -> dict[str, Any]:
    command = [*build_worker_command(cr, role), *build_multinode_args(cr, role, leader=leader)]
    container = build_worker_container(cr, role, command=command)
    if not leader:
        # No metrics port: the rank's worker never gets past loading the engine, so nothing
        # would answer a scrape there.
        container["ports"] = [p for p in container["ports"] if p["name"] != METRICS_PORT_NAME]
        probe = {"httpGet": {"path": RANK_HEALTH_PATH, "port": WORKER_PORT}}
        container.update(
            http_probes(WORKER_PORT, health_path=RANK_HEALTH_PATH, ready_path=RANK_HEALTH_PATH)
        )
        container["startupProbe"] = {
            **probe,
            "periodSeconds": STARTUP_PERIOD_SECONDS,
            "failureThreshold": startup_failure_threshold(cr),
        }
    return container


def _one_rank_per_node() -> dict[str, Any]:
    """A group's pods on different nodes: each rank needs a node's GPUs to itself."""
    return {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "labelSelector": {
                        "matchExpressions": [{"key": LWS_NAME_LABEL, "operator": "Exists"}]
                    },
                    "matchLabelKeys": [GROUP_KEY_LABEL],
                    "topologyKey": HOSTNAME_KEY,
                }
            ]
        }
    }


def _template(cr: KvRetentionDeployment, role: Role, *, leader: bool) -> dict[str, Any]:
    component = ROLE_COMPONENT[role]
    pod_spec = build_worker_pod_spec(cr, role, _rank_container(cr, role, leader=leader))
    meta: dict[str, Any] = {"labels": labels(cr, component)}
    annotations = dict(worker_template_annotations(cr, role) or {})
    options = pod_options(cr, component)
    if options is not None:
        meta["labels"] = {**options.labels, **meta["labels"]}
        annotations = {**options.annotations, **annotations}
        pod_spec = apply_pod_options(pod_spec, options)
    # The user's affinity keeps its node rules; one rank per node is added unless it sets its own
    # pod anti-affinity.
    affinity = dict(pod_spec.get("affinity") or {})
    affinity.setdefault("podAntiAffinity", _one_rank_per_node()["podAntiAffinity"])
    pod_spec = {**pod_spec, "affinity": affinity}
    if annotations:
        meta["annotations"] = dict(sorted(annotations.items()))
    return {"metadata": meta, "spec": pod_spec}


def build_leader_worker_set(cr: KvRetentionDeployment, role: Role) -> Manifest:
    """The pool as a LeaderWorkerSet: ``replicas`` groups of ``nodesPerReplica`` pods."""
    rollout = cr.spec.workers.rollout
    return {
        "apiVersion": LEADER_WORKER_SET.api_version,
        "kind": LEADER_WORKER_SET.kind,
        "metadata": object_meta(cr, name=lws_name(cr, role), component=ROLE_COMPONENT[role]),
        "spec": {
            "replicas": role_replicas(cr, role),
            "leaderWorkerTemplate": {
                "size": nodes_per_replica(cr, role),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": _template(cr, role, leader=True),
                "workerTemplate": _template(cr, role, leader=False),
            },
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxSurge": rollout.max_surge,
                    "maxUnavailable": rollout.max_unavailable,
                },
            },
            "startupPolicy": "LeaderCreated",
        },
    }


def build_multinode_pool(cr: KvRetentionDeployment, role: Role) -> list[Manifest]:
    """The router's headless Service (leaders only), the LeaderWorkerSet, the pool's PDB."""
    service = build_worker_service(cr, role, extra_selector={WORKER_INDEX_LABEL: "0"})
    return [service, build_leader_worker_set(cr, role), build_worker_pdb(cr, role)]
