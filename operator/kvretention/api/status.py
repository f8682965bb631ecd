"""What the operator observes: the ``KvRetentionDeployment`` status models (written only by the
operator; readers tolerate fields a newer operator adds)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from kvretention.api.base import WireModel
from kvretention.api.spec_workers import NodesPerReplica

__all__ = [
    "Condition",
    "EngineStatus",
    "KvRetentionDeploymentStatus",
    "KvStoreStatus",
    "ReplicaCount",
    "WorkerPoolStatus",
    "WorkersStatus",
]


# --- status ---------------------------------------------------------------------------------------


class _StatusModel(WireModel):
    """Status is written by the operator; tolerate fields a newer operator adds."""

    model_config = ConfigDict(extra="ignore", strict=False)


_Reason = Annotated[str, Field(max_length=1024)]
"""A reason, as long as ``metav1.Condition`` allows one."""
_Message = Annotated[str, Field(max_length=32768)]
"""Human-readable details, as long as ``metav1.Condition`` allows them."""


class Condition(_StatusModel):
    """One observed condition (the metav1.Condition shape)."""

    type: str = Field(max_length=316, description="Condition type, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: _Reason = Field(default="", description="CamelCase reason for the last transition.")
    message: _Message = Field(default="", description="Human-readable details.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this condition was computed for."
    )
    last_transition_time: str | None = Field(
        default=None, description="When status last flipped (RFC 3339)."
    )


class ReplicaCount(_StatusModel):
    """One component's pods, and its rollout's progress (summed over its Deployments)."""

    ready: int = Field(default=0, ge=0, description="Ready pods.")
    desired: int = Field(default=0, ge=0, description="Desired pods.")
    updated: int = Field(
        default=0, ge=0, description="Pods running the current pod template (updatedReplicas)."
    )
    available: int = Field(
        default=0,
        ge=0,
        description="Pods ready for at least the Deployment's minReadySeconds (availableReplicas).",
    )


class WorkerPoolStatus(ReplicaCount):
    """One worker pool (one Deployment): its pods and why they are not ready, if they are not."""

    name: str = Field(
        max_length=253,
        description="The pool's Deployment, or LeaderWorkerSet for a multinode pool.",
    )
    role: str = Field(
        default="",
        max_length=63,
        description="The pool's component: worker, worker-prefill or worker-decode.",
    )
    reason: _Reason = Field(
        default="",
        description=(
            "PodsReady, or why not: ScaledToZero, NotCreated, ReplicaFailure, "
            "ProgressDeadlineExceeded, Unschedulable, ErrImagePull / ImagePullBackOff (and the "
            "kubelet's other image reasons), CreateContainerConfigError (and the kubelet's other "
            "container reasons), InitContainerFailed, CrashLoopBackOff, ContainerFailed, "
            "PodFailed, RollingOut, PodsStarting, PodsNotReady, LeaderWorkerSetMissing."
        ),
    )
    message: _Message = Field(
        default="",
        description="Details: the Deployment, the pod, the scheduler's or kubelet's message.",
    )
    nodes_per_replica: NodesPerReplica | None = Field(
        default=None,
        description=(
            "Set for a multinode pool (a LeaderWorkerSet): the pods of each worker, one per node. "
            "The counts are then of workers (groups), each ready only when all its pods are."
        ),
    )


class WorkersStatus(ReplicaCount):
    """All worker pools together, and each pool on its own."""

    pools: list[WorkerPoolStatus] = Field(
        default_factory=list,
        description="Each worker pool (Deployment): the aggregated pool, or prefill then decode.",
    )


class KvStoreStatus(ReplicaCount):
    """The Mooncake master's pods, and the pool as its ``/metrics`` last reported it."""

    observed_at: str | None = Field(
        default=None,
        description=(
            "When the master first reported the numbers below (RFC 3339); a read that finds the "
            "same numbers leaves status unchanged."
        ),
    )
    stale_since: str | None = Field(
        default=None,
        description=(
            "Set while reads of the master's /metrics fail but not yet for 60 s (RFC 3339: when "
            "the first failed): the numbers below are the last good reading, if any. Past 60 s "
            "RetentionBudget reads Unknown/MetricsUnavailable and this goes."
        ),
    )
    stale_reason: str | None = Field(
        default=None, description="Why the first of those reads failed (with staleSince)."
    )
    capacity_bytes: int | None = Field(
        default=None, ge=0, description="Pool capacity: the segments workers mounted."
    )
    used_bytes: int | None = Field(default=None, ge=0, description="Bytes allocated to objects.")
    objects: int | None = Field(default=None, ge=0, description="Objects (keys) stored.")
    pinned_objects: int | None = Field(default=None, ge=0, description="Soft-pinned objects.")
    pinned_bytes_estimate: int | None = Field(
        default=None,
        ge=0,
        description="Pinned objects times the mean object size (the master counts no pinned bytes).",
    )
    pinned_ratio: float | None = Field(
        default=None, ge=0, description="pinnedBytesEstimate / capacityBytes."
    )
    budget_ratio: float | None = Field(
        default=None, description="softPin.budgetRatio the pins are checked against."
    )
    budget_enforced: bool | None = Field(
        default=None,
        description=(
            "True: the workers' retention plugin keeps pins within budgetRatio (past it pages are "
            "written unpinned); false: the budget is only observed (pinnedRatio), because "
            "RetentionApplied is not True. Absent without a budget or before the probe reported."
        ),
    )
    evicted_objects: int | None = Field(
        default=None, ge=0, description="Objects evicted since the master started."
    )
    evicted_bytes: int | None = Field(
        default=None, ge=0, description="Bytes evicted since the master started."
    )
    evictions: int | None = Field(
        default=None, ge=0, description="Eviction rounds since the master started."
    )


class EngineStatus(_StatusModel):
    """What the capability probe found in the worker image."""

    sglang_version: str | None = Field(default=None, description="SGLang version in the image.")
    dialect: Literal["none", "flat", "versioned"] | None = Field(
        default=None, description="kv_hints form the engine accepts: none, flat or versioned."
    )
    kv_hints_parameter: bool | None = Field(
        default=None, description="Whether Engine.async_generate takes kv_hints."
    )
    storage_backends: list[str] = Field(
        default_factory=list, description="HiCache storage backends the image offers."
    )
    mooncake_importable: bool | None = Field(
        default=None, description="Whether mooncake.store imports in the image."
    )
    retention_plugin: (
        Literal["loaded", "not_installed", "not_selected", "load_failed", "unsupported"] | None
    ) = Field(
        default=None,
        description=(
            "What SGLang's own plugin loader does with the retention plugin that applies "
            "kv.retain: loaded, not_installed, not_selected (SGLANG_PLUGINS leaves it out), "
            "load_failed, or unsupported (no plugin framework). Absent: the image's probe "
            "predates the plugin."
        ),
    )
    hook_target_problems: list[str] = Field(
        default_factory=list,
        description="SGLang targets the loaded plugin hooks that are missing or changed.",
    )
    device: Literal["cuda", "cpu"] | None = Field(
        default=None,
        description=(
            "Where the workers' engine runs, as the probe found it in a worker pod: cuda, or cpu "
            "(SGLang's CPU engine where torch sees no GPU: one rank and no HiCache, the worker "
            "leaves the HiCache flags out). Absent: not measured."
        ),
    )


class KvRetentionDeploymentStatus(_StatusModel):
    """Observed state, written only by the operator."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation last reconciled."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="Ready, FrontendReady, RouterReady, WorkersReady, KvStoreReady, KvHintsSupported, RetentionApplied, RetentionBudget, Progressing.",
    )
    frontend: ReplicaCount | None = Field(default=None, description="Frontend pods.")
    router: ReplicaCount | None = Field(default=None, description="Router pods.")
    workers: WorkersStatus | None = Field(
        default=None, description="Worker pods (all pools), and each pool with its reason."
    )
    kv_store: KvStoreStatus | None = Field(
        default=None, description="Mooncake master pods and the pool's usage."
    )
    workers_ready: str | None = Field(
        default=None, description="Ready/desired workers as 'R/D' (printer column)."
    )
    endpoint: str | None = Field(
        default=None, description="The frontend URL clients use inside the cluster."
    )
    engine: EngineStatus | None = Field(
        default=None, description="Capability probe results of the worker image."
    )
    replicas: int | None = Field(
        default=None, ge=0, description="Scaled pool's current pods (scale subresource)."
    )
    selector: str | None = Field(
        default=None, description="Label selector of the scaled pool's pods (scale subresource)."
    )
    kopf: dict[str, Any] | None = Field(
        default=None,
        description="The operator framework's own bookkeeping (handler progress); opaque.",
    )


# --- the object -----------------------------------------------------------------------------------
