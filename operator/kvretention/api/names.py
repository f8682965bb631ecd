"""The names the operator, the objects it writes and its tests agree on: label keys, the field
manager, the condition types, the probe container, the operator's annotations and the worker roles.
Defined here once; every other module, the data plane's included, imports them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, Literal

APP_NAME: Final = "kvretention"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"

LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
OPERATOR_POD_LABELS: Final = {LABEL_PART_OF: APP_NAME, LABEL_COMPONENT: "operator"}
"""Labels the chart puts on the operator's pods whatever its release name or ``nameOverride``:
a fleet's NetworkPolicies let pods with them (in any namespace) read its metrics ports."""

FIELD_MANAGER: Final = "kvretention-operator"
"""The one server-side-apply field manager the operator writes with (also its Events' source and
the value of ``app.kubernetes.io/managed-by`` on every child)."""

HEALTH_PATH: Final = "/healthz"
"""Liveness: every kvretention process (frontend, router, worker, operator) answers 200 here."""
READY_PATH: Final = "/readyz"
"""Readiness: 2xx only while the process can serve (the router: while a worker is ready)."""
METRICS_PATH: Final = "/metrics"

FLEET_PODS_SELECTOR: Final = f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}"
"""Every fleet's pods: they carry their workload's selector labels (immutable), not the managed-by
label."""


def fleet_pods_selector(name: str) -> str:
    """The label selector of every pod of fleet ``name``."""
    return f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}={name}"


def pod_selector_labels(instance: str, component: str) -> dict[str, str]:
    """The labels a workload or Service of fleet ``instance`` selects its pods by (immutable
    once created)."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: instance, LABEL_COMPONENT: component}


def label_selector(labels: Mapping[str, str]) -> str:
    """A label selector string matching ``labels`` (keys sorted: one spelling per selector)."""
    return ",".join(f"{key}={value}" for key, value in sorted(labels.items()))


MANIFEST_HASH_ANNOTATION: Final = "kvretention.io/manifest-hash"
"""On every child the operator applies: the hash of the manifest it applied, so a restarted
operator can tell a child it already wrote from one it must check with a dry run."""

Role = Literal["aggregated", "prefill", "decode"]
"""A worker's part in serving: the operator builds one pool per role, the worker runs as one and
the router places requests by it."""

PROBE_CONTAINER: Final = "probe"
"""The worker pods' init container that writes the capability report."""

READY: Final = "Ready"
"""The fleet serves (with hints, or without them under ``hints.policy: Optional``)."""
FRONTEND_READY: Final = "FrontendReady"
ROUTER_READY: Final = "RouterReady"
WORKERS_READY: Final = "WorkersReady"
"""Each component's pods are ready (the first not-ready pod's reason otherwise)."""
KVSTORE_READY: Final = "KvStoreReady"
"""The managed Mooncake master is ready (True/External for an external one)."""
KV_HINTS_SUPPORTED: Final = "KvHintsSupported"
"""The worker image's capability probe says its SGLang takes ``kv_hints``."""
RETENTION_APPLIED: Final = "RetentionApplied"
"""SGLang applies ``kv.retain``: hints are on, the workers run the retention plugin's eviction policy
and every worker pod's probe says SGLang loads the plugin and finds its hook targets (part of Ready
only under ``hints.policy: Required``)."""
RETENTION_BUDGET: Final = "RetentionBudget"
"""Soft pins hold at most ``softPin.budgetRatio`` of the pool (not part of Ready)."""
PROGRESSING: Final = "Progressing"
"""A rollout is under way (or stopped, and why)."""
CONDITION_TYPES: Final[tuple[str, ...]] = (
    READY,
    FRONTEND_READY,
    ROUTER_READY,
    WORKERS_READY,
    KVSTORE_READY,
    KV_HINTS_SUPPORTED,
    RETENTION_APPLIED,
    RETENTION_BUDGET,
    PROGRESSING,
)
"""Every condition type in ``status.conditions``, in the order they are written."""
INFERENCE_POOL_ACCEPTED: Final = "InferencePoolAccepted"
"""A Gateway accepted the fleet's InferencePool (``spec.gateway.inferencePool``; not part of
Ready). Written after :data:`CONDITION_TYPES`, and only while the option is on."""
OPTIONAL_CONDITION_TYPES: Final[tuple[str, ...]] = (INFERENCE_POOL_ACCEPTED,)
"""Condition types a status carries only when the spec asks for what they report on."""
