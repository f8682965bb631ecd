"""``spec.workers``: the SGLang worker pools (aggregated, or prefill and decode), their
autoscaling, rollout and HiCache."""

from __future__ import annotations

import re
from typing import Annotated, Final, Literal

from pydantic import (
    AliasChoices,
    Field,
    field_validator,
    model_validator,
)

from kvretention.api.base import (
    WireModel,
    cel_config,
    cel_rules,
    list_field,
    nested,
    port_field,
    require,
)
from kvretention.api.spec_shared import (
    DEFAULT_WORKER_IMAGE,
    MAX_REPLICAS,
    Image,
    PodOptions,
    Replicas,
    ResourceRequirements,
    Share,
    _pod_field,
)

__all__ = [
    "DEFAULT_PLANNING_THREADS",
    "DEFAULT_RADIX_PIN_RATIO",
    "EXTENDED_RESOURCE_PATTERN",
    "GPU_RESOURCE_MESSAGE",
    "GPU_RESOURCE_RULE",
    "MAX_NODES_PER_REPLICA",
    "MAX_PLANNING_THREADS",
    "MAX_STARTUP_TIMEOUT_SECONDS",
    "MIN_STARTUP_TIMEOUT_SECONDS",
    "STARTUP_ALLOWANCE_SECONDS",
    "ExtraArg",
    "HiCacheSpec",
    "NodesPerReplica",
    "PoolAutoscalingSpec",
    "PrefillPoolSpec",
    "WorkerPoolSpec",
    "WorkerRolloutSpec",
    "WorkersSpec",
    "is_extended_resource",
]


MAX_NODES_PER_REPLICA: Final = 64
"""Most nodes one multinode worker (a LeaderWorkerSet group) may span."""
NodesPerReplica = Annotated[int, Field(ge=1, le=MAX_NODES_PER_REPLICA)]
"""The nodes (pods, one per node) one worker spans: 1 to :data:`MAX_NODES_PER_REPLICA`."""
DEFAULT_PLANNING_THREADS: Final = 4
"""The worker's ``--planning-threads`` default (``dataplane.worker.planning.DEFAULT_THREADS``, which
the API may not import; a unit test holds the two equal): named in the spec's description only."""
MAX_PLANNING_THREADS: Final = 64
"""Each planning thread may hold a huge prompt's tokens and offsets at once: more is memory, not
speed, past the pod's CPUs."""
DEFAULT_RADIX_PIN_RATIO: Final = 0.5
"""The retention plugin's own default share (``retention.pins.DEFAULT_RATIO``; a test keeps
them equal: ``api`` may not import the plugin)."""


def _tp_divisible_rule(pool: str, *, always: bool) -> str:
    """CEL: pool ``pool``'s tensorParallelSize is a multiple of its nodes per replica (its own
    ``nodesPerReplica``, else ``workers.nodesPerReplica``). ``always``: an omitted pool has the
    defaults (the aggregated pool), so it must then be one node."""
    tp = f"self.{pool}.tensorParallelSize"
    nodes = (
        f"(has(self.{pool}.nodesPerReplica) ? self.{pool}.nodesPerReplica : self.nodesPerReplica)"
    )
    missing = "self.nodesPerReplica == 1" if always else "true"
    return f"(has(self.{pool}) ? {tp} % {nodes} == 0 : {missing})"


def tp_divisible_message(pool: str) -> str:
    return (
        f"workers.{pool}.tensorParallelSize must be a multiple of its nodesPerReplica "
        "(each node of a multinode worker runs tensorParallelSize / nodesPerReplica ranks)"
    )


ExtraArg = Annotated[str, Field(max_length=4096, description="One SGLang server argument.")]


class WorkerPoolSpec(WireModel):
    """One SGLang worker pool (its size comes from ``workers.replicas``)."""

    tensor_parallel_size: int = Field(
        default=1, ge=1, le=64, description="GPUs per worker (SGLang --tp-size)."
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description=(
            "Worker container resources. When limits omit workers.gpuResource, "
            "tensorParallelSize GPUs are requested (tensorParallelSize / nodesPerReplica on "
            "each pod of a multinode worker)."
        ),
    )
    extra_args: list[ExtraArg] = list_field(
        128, "Extra SGLang server arguments appended after the ones the operator renders."
    )
    nodes_per_replica: NodesPerReplica | None = Field(
        default=None,
        description=(
            "Nodes one worker of this pool spans (overrides workers.nodesPerReplica). Above 1 "
            "each worker is a LeaderWorkerSet group of this many pods, one per node, each running "
            "tensorParallelSize / nodesPerReplica ranks (needs the LeaderWorkerSet controller)."
        ),
    )


_MIN_NOT_ABOVE_MAX_MESSAGE = "autoscaling.minReplicas must not exceed maxReplicas"


class PoolAutoscalingSpec(WireModel):
    """A HorizontalPodAutoscaler for one worker pool, on the router's count of the pool's
    outstanding requests (an External metric, served by prometheus-adapter; docs/observability.md)."""

    model_config = cel_config(
        ("self.minReplicas <= self.maxReplicas", _MIN_NOT_ABOVE_MAX_MESSAGE),
    )

    min_replicas: Replicas = Field(
        default=1,
        description=(
            "Fewest workers. 0 (scale to zero) drops every prefix the pool retains with its last "
            "worker, so a retaining pool needs allowScaleToZero, and the cluster needs the "
            "HPAScaleToZero feature gate."
        ),
    )
    max_replicas: int = Field(ge=1, le=MAX_REPLICAS, description="Most workers.")
    target: int = Field(
        ge=1,
        le=100_000,
        description=(
            "Outstanding requests per worker the autoscaler holds the pool to (the router's "
            "kvretention_router_pool_outstanding_requests divided by the pool's replicas)."
        ),
    )
    allow_scale_to_zero: bool = Field(
        default=False,
        description="Let minReplicas be 0 while hints are retained (every retained prefix is lost at 0).",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> PoolAutoscalingSpec:
        require(self.min_replicas <= self.max_replicas, _MIN_NOT_ABOVE_MAX_MESSAGE)
        return self


class PrefillPoolSpec(WorkerPoolSpec):
    """The prefill pool of a disaggregated fleet; sized on its own."""

    replicas: Replicas = Field(default=1, description="Prefill workers.")
    autoscaling: PoolAutoscalingSpec | None = Field(
        default=None,
        description="Size the prefill pool with a HorizontalPodAutoscaler instead of replicas.",
    )


_RATIO_OR_SIZE_MESSAGE = "hicache: set ratio or sizeGiB, not both"
_PAGE_FIRST_MESSAGE = "hicache.storageBackend mooncake needs a page-first memLayout"


class HiCacheSpec(WireModel):
    """SGLang hierarchical cache (GPU -> host -> Mooncake L3) for every worker."""

    model_config = cel_config(
        ("!(has(self.ratio) && has(self.sizeGiB))", _RATIO_OR_SIZE_MESSAGE),
        (
            "self.storageBackend != 'mooncake' || self.memLayout != 'layer_first'",
            _PAGE_FIRST_MESSAGE,
        ),
    )

    enabled: bool = Field(
        default=True, description="Run HiCache (SGLang --enable-hierarchical-cache)."
    )
    ratio: float | None = Field(
        default=None,
        ge=1.0,
        le=100.0,
        description="Host pool size as a multiple of the GPU pool (--hicache-ratio; SGLang default 2).",
    )
    size_gib: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        alias="sizeGiB",
        validation_alias=AliasChoices("sizeGiB", "size_gib"),
        description="Host pool size in GiB per rank (--hicache-size); overrides ratio.",
    )
    write_policy: Literal["write_through", "write_through_selective", "write_back"] = Field(
        default="write_through",
        description="When pages are copied down a tier (--hicache-write-policy).",
    )
    io_backend: Literal["direct", "kernel"] = Field(
        default="kernel", description="GPU<->host copy engine (--hicache-io-backend)."
    )
    mem_layout: Literal[
        "layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"
    ] = Field(default="page_first", description="Host pool layout (--hicache-mem-layout).")
    page_size: int = Field(
        default=64,
        ge=1,
        le=4096,
        description="Tokens per KV page (SGLang --page-size); the unit stored in Mooncake.",
    )
    storage_backend: Literal["mooncake", "none"] = Field(
        default="mooncake",
        description="L3 tier (--hicache-storage-backend): mooncake (kvStore.mooncake) or none.",
    )
    prefetch_policy: Literal["best_effort", "wait_complete", "timeout"] = Field(
        default="timeout",
        description="When an L3 prefetch stops (--hicache-storage-prefetch-policy).",
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> HiCacheSpec:
        require(not (self.ratio is not None and self.size_gib is not None), _RATIO_OR_SIZE_MESSAGE)
        require(
            self.storage_backend != "mooncake" or self.mem_layout != "layer_first",
            _PAGE_FIRST_MESSAGE,
        )
        return self


EXTENDED_RESOURCE_PATTERN: Final = (
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
"""A vendor-qualified resource name (``nvidia.com/gpu``): Kubernetes' extended resources."""
_EXTENDED_RESOURCE: Final = re.compile(EXTENDED_RESOURCE_PATTERN)
GPU_RESOURCE_RULE: Final = (
    "self == '' || (self.matches('"
    + EXTENDED_RESOURCE_PATTERN.replace("\\", "\\\\")
    + "') && !self.startsWith('kubernetes.io/') && !self.contains('.kubernetes.io/'))"
)
GPU_RESOURCE_MESSAGE: Final = (
    "workers.gpuResource must be a vendor resource name such as nvidia.com/gpu "
    "(domain/name, outside kubernetes.io), not cpu or memory"
)


def is_extended_resource(name: str) -> bool:
    """Kubernetes' extended resources: vendor-qualified, outside the ``kubernetes.io`` domain."""
    return (
        _EXTENDED_RESOURCE.match(name) is not None
        and not name.startswith("kubernetes.io/")
        and ".kubernetes.io/" not in name
    )


MIN_STARTUP_TIMEOUT_SECONDS: Final = 60
MAX_STARTUP_TIMEOUT_SECONDS: Final = 86_400
STARTUP_ALLOWANCE_SECONDS: Final = 600
"""Added to ``workers.startupTimeoutSeconds`` for a worker Deployment's progress deadline: time to
schedule the pod and pull an SGLang image (tens of GB) before the startup probe's clock starts."""
_DEADLINE_AFTER_STARTUP = (
    "!has(self.rollout) || !has(self.rollout.progressDeadlineSeconds) "
    "|| self.rollout.progressDeadlineSeconds > self.startupTimeoutSeconds"
)
_DEADLINE_AFTER_STARTUP_MESSAGE = (
    "workers.rollout.progressDeadlineSeconds must exceed workers.startupTimeoutSeconds "
    "(a worker still loading its model would read as ProgressDeadlineExceeded)"
)


_ROLLOUT_PROGRESS_MESSAGE = "workers.rollout: maxSurge and maxUnavailable must not both be 0"


class WorkerRolloutSpec(WireModel):
    """How worker pods are replaced: one at a time, never with an extra GPU pod."""

    model_config = cel_config(
        ("self.maxSurge + self.maxUnavailable >= 1", _ROLLOUT_PROGRESS_MESSAGE)
    )

    max_surge: Replicas = Field(
        default=0,
        description=(
            "Extra worker pods a rollout may start before old ones stop (the Deployment's "
            "maxSurge). 0 by default: a surge pod needs spare GPUs that a full pool does not have."
        ),
    )
    max_unavailable: Replicas = Field(
        default=1,
        description=(
            "Workers of a pool that may be down at once: in a rollout (the Deployment's "
            "maxUnavailable) and in voluntary disruptions such as node drains (the pool's "
            "PodDisruptionBudget). 0 blocks drains until the pool is scaled up."
        ),
    )

    progress_deadline_seconds: int | None = Field(
        default=None,
        ge=MIN_STARTUP_TIMEOUT_SECONDS + 1,
        le=MAX_STARTUP_TIMEOUT_SECONDS + STARTUP_ALLOWANCE_SECONDS,
        description=(
            "Seconds a worker Deployment's rollout may make no progress before Kubernetes marks "
            "it ProgressDeadlineExceeded, which the fleet's status reports (the Deployment's "
            "progressDeadlineSeconds). Unset: workers.startupTimeoutSeconds + "
            f"{STARTUP_ALLOWANCE_SECONDS}, for scheduling and image pulls. Must exceed "
            "workers.startupTimeoutSeconds."
        ),
    )

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> WorkerRolloutSpec:
        require(self.max_surge + self.max_unavailable >= 1, _ROLLOUT_PROGRESS_MESSAGE)
        return self


_DISAGGREGATED_NEEDS_POOLS_MESSAGE = (
    "workers.mode disaggregated needs workers.prefill and workers.decode"
)
_AGGREGATED_POOL_ONLY_MESSAGE = (
    "workers.mode aggregated takes workers.aggregated, not prefill/decode"
)
_DISAGGREGATED_POOLS_ONLY_MESSAGE = (
    "workers.mode disaggregated takes workers.prefill/decode, not aggregated"
)


class WorkersSpec(WireModel):
    """The SGLang workers: one aggregated pool, or a prefill and a decode pool."""

    model_config = cel_config(
        (
            "self.mode != 'disaggregated' || (has(self.prefill) && has(self.decode))",
            _DISAGGREGATED_NEEDS_POOLS_MESSAGE,
        ),
        (
            "self.mode != 'aggregated' || (!has(self.prefill) && !has(self.decode))",
            _AGGREGATED_POOL_ONLY_MESSAGE,
        ),
        (
            "self.mode != 'disaggregated' || !has(self.aggregated)",
            _DISAGGREGATED_POOLS_ONLY_MESSAGE,
        ),
        (_DEADLINE_AFTER_STARTUP, _DEADLINE_AFTER_STARTUP_MESSAGE),
        (
            "self.mode != 'aggregated' || " + _tp_divisible_rule("aggregated", always=True),
            tp_divisible_message("aggregated"),
        ),
        (_tp_divisible_rule("prefill", always=False), tp_divisible_message("prefill")),
        (_tp_divisible_rule("decode", always=False), tp_divisible_message("decode")),
    )

    image: Image = Field(
        default=DEFAULT_WORKER_IMAGE,
        description="An SGLang image with this package's worker and Mooncake installed.",
    )
    mode: Literal["aggregated", "disaggregated"] = Field(
        default="aggregated", description="One pool, or separate prefill and decode pools."
    )
    replicas: Replicas = Field(
        default=1,
        description="Workers in the aggregated pool, or the decode pool when disaggregated (scale subresource).",
    )
    autoscaling: PoolAutoscalingSpec | None = Field(
        default=None,
        description=(
            "Size the aggregated pool (the decode pool when disaggregated) with a "
            "HorizontalPodAutoscaler instead of replicas."
        ),
    )
    gpu_resource: str = Field(
        default="nvidia.com/gpu",
        max_length=253,
        description=(
            "Extended resource requested per tensor-parallel rank, a vendor name such as "
            "nvidia.com/gpu or amd.com/gpu (not cpu or memory); empty requests none."
        ),
        json_schema_extra=cel_rules((GPU_RESOURCE_RULE, GPU_RESOURCE_MESSAGE)),
    )
    aggregated: WorkerPoolSpec | None = Field(
        default=None, description="The aggregated pool (mode aggregated; defaults apply)."
    )
    prefill: PrefillPoolSpec | None = Field(
        default=None, description="The prefill pool (mode disaggregated)."
    )
    decode: WorkerPoolSpec | None = Field(
        default=None, description="The decode pool (mode disaggregated)."
    )
    bootstrap_port: int = port_field(
        8998, "Prefill workers' KV bootstrap port (SGLang --disaggregation-bootstrap-port)."
    )
    hicache: HiCacheSpec = nested(HiCacheSpec, "Hierarchical cache settings of every worker.")
    rollout: WorkerRolloutSpec = nested(
        WorkerRolloutSpec, "How worker pods are replaced and how many may be down at once."
    )
    pod: PodOptions | None = _pod_field("worker (every pool's)")
    drain_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description=(
            "How long a stopping worker lets its in-flight streams finish (after the router has "
            "stopped sending to it). The pod's terminationGracePeriodSeconds covers it."
        ),
    )
    planning_threads: int | None = Field(
        default=None,
        ge=1,
        le=MAX_PLANNING_THREADS,
        description=(
            "Requests each worker renders and tokenizes at once (its chat template and "
            "tokenizer, before the engine), shared round-robin by tenants: one tenant holds all "
            "but one of them at most, so a huge prompt does not hold up a small one. Each may "
            "hold a huge prompt's tokens at once, so more costs memory. Unset: the worker's "
            f"default, {DEFAULT_PLANNING_THREADS}."
        ),
    )
    radix_pin_ratio: Share | None = Field(
        default=None,
        description=(
            "Share of each worker's GPU KV pool that kv.retain holds may keep pinned in SGLang's "
            "radix tree (never so much that a request of the model's context length finds no "
            "room). A hold past it takes the place of lower-ranked ones (priority, then soonest "
            "expiry) or is left to LRU, counted in kvretention_worker_radix_pins_dropped_total. "
            f"Unset: the retention plugin's default, {DEFAULT_RADIX_PIN_RATIO}. Set as the "
            "worker container's KVR_RADIX_PIN_RATIO; a change rolls the workers."
        ),
    )

    nodes_per_replica: NodesPerReplica = Field(
        default=1,
        description=(
            "Nodes each worker spans (each pool may override it). 1: a worker is one pod, and "
            "the pools are Deployments. Above 1: each worker is a LeaderWorkerSet group of this "
            "many pods, one per node, with SGLang's --nnodes/--node-rank/--dist-init-addr; "
            "tensorParallelSize must be a multiple of it. Needs the LeaderWorkerSet controller "
            "(leaderworkerset.x-k8s.io) in the cluster."
        ),
    )

    startup_timeout_seconds: int = Field(
        default=1800,
        ge=MIN_STARTUP_TIMEOUT_SECONDS,
        le=MAX_STARTUP_TIMEOUT_SECONDS,
        description=(
            "How long a started worker may take to load its model before the kubelet restarts it "
            "(the startup probe's window, rounded up to its 10 s period). The worker Deployments' "
            f"progress deadline follows: this + {STARTUP_ALLOWANCE_SECONDS} s unless "
            "workers.rollout.progressDeadlineSeconds is set."
        ),
    )

    @field_validator("gpu_resource")
    @classmethod
    def _check_gpu_resource(cls, value: str) -> str:
        require(is_extended_resource(value) or value == "", GPU_RESOURCE_MESSAGE)
        return value

    @model_validator(mode="after")
    def _check_cel_equivalents(self) -> WorkersSpec:
        pd = self.prefill is not None, self.decode is not None
        if self.mode == "disaggregated":
            require(all(pd), _DISAGGREGATED_NEEDS_POOLS_MESSAGE)
            require(self.aggregated is None, _DISAGGREGATED_POOLS_ONLY_MESSAGE)
        else:
            require(not any(pd), _AGGREGATED_POOL_ONLY_MESSAGE)
        deadline = self.rollout.progress_deadline_seconds
        require(
            deadline is None or deadline > self.startup_timeout_seconds,
            _DEADLINE_AFTER_STARTUP_MESSAGE,
        )
        pools = {"aggregated": self.aggregated, "prefill": self.prefill, "decode": self.decode}
        for name, pool in pools.items():
            if pool is None and name == "aggregated" and self.mode == "aggregated":
                pool = WorkerPoolSpec()
            if pool is None or (name == "aggregated" and self.mode != "aggregated"):
                continue
            require(
                pool.tensor_parallel_size % self.nodes_for(pool) == 0, tp_divisible_message(name)
            )
        return self

    def nodes_for(self, pool: WorkerPoolSpec) -> int:
        """Nodes one worker of ``pool`` spans: its own ``nodesPerReplica``, else the fleet's."""
        return (
            pool.nodes_per_replica if pool.nodes_per_replica is not None else self.nodes_per_replica
        )
