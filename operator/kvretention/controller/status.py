"""Pure status: what the fleet should be plus what the cluster shows in, the CR's status out.

Observed state is gathered once (the Deployments, the probe reports of worker pods), then a chain
of small checks runs, cert-manager style: the first failing check names the reason and message of
``Ready``. ``lastTransitionTime`` only moves when a condition's status flips.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from kvretention.controller.kvstore_metrics import KvStoreReading

CondStatus = Literal["True", "False", "Unknown"]

READY: Final = "Ready"
FRONTEND_READY: Final = "FrontendReady"
ROUTER_READY: Final = "RouterReady"
WORKERS_READY: Final = "WorkersReady"
KVSTORE_READY: Final = "KvStoreReady"
KV_HINTS_SUPPORTED: Final = "KvHintsSupported"
RETENTION_BUDGET: Final = "RetentionBudget"
PROGRESSING: Final = "Progressing"
CONDITION_TYPES: Final = (
    READY,
    FRONTEND_READY,
    ROUTER_READY,
    WORKERS_READY,
    KVSTORE_READY,
    KV_HINTS_SUPPORTED,
    RETENTION_BUDGET,
    PROGRESSING,
)

COMPONENT_LABEL: Final = "app.kubernetes.io/component"
WORKER_COMPONENTS: Final = ("worker", "worker-prefill", "worker-decode")
PROBE_CONTAINER: Final = "probe"
PROBE_SCHEMA: Final = 1
DIALECTS: Final = frozenset({"none", "flat", "versioned"})

STATUS_KEYS: Final = frozenset(
    {
        "observedGeneration",
        "conditions",
        "frontend",
        "router",
        "workers",
        "kvStore",
        "workersReady",
        "endpoint",
        "engine",
        "replicas",
        "selector",
    }
)
"""The status fields the operator owns; anything else under status is not ours to compare."""


# -- observations ------------------------------------------------------------------------------


SCALED_TO_ZERO: Final = "ScaledToZero"
"""A component asked for 0 replicas: not ready, but on purpose (a Normal Event, not a Warning)."""


@dataclass(frozen=True)
class Workload:
    """One Deployment as desired and as observed."""

    name: str
    component: str
    desired: int
    exists: bool = False
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    current_generation: bool = False
    """The Deployment controller has seen the latest spec (observedGeneration >= generation)."""

    @property
    def rolled_out(self) -> bool:
        """kubectl's ``rollout status``: latest spec seen, every pod updated, no old pods left."""
        return (
            self.exists
            and self.current_generation
            and self.updated >= self.desired
            and self.replicas <= self.desired
        )


def observe_workload(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> Workload:
    """Pair a desired Deployment manifest with the live object of the same name (or none)."""
    meta = desired["metadata"]
    replicas = (desired.get("spec") or {}).get("replicas")
    base = Workload(
        name=meta["name"],
        component=(meta.get("labels") or {}).get(COMPONENT_LABEL, ""),
        desired=1 if replicas is None else int(replicas),
    )
    if live is None:
        return base
    status = live.get("status") or {}
    generation = int((live.get("metadata") or {}).get("generation") or 0)
    return Workload(
        name=base.name,
        component=base.component,
        desired=base.desired,
        exists=True,
        replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        current_generation=int(status.get("observedGeneration") or 0) >= generation,
    )


@dataclass(frozen=True)
class ProbeReport:
    """What ``kvretention probe`` found in one worker pod's image."""

    pod: str
    sglang_version: str | None
    kv_hints_parameter: bool
    dialect: str
    storage_backends: tuple[str, ...]
    mooncake_importable: bool
    mooncake_error: str | None
    usable_for_hints: bool


@dataclass(frozen=True)
class ProbeFailure:
    """A probe termination message that is not a report we understand."""

    pod: str
    error: str


def _probe_message(pod: Mapping[str, Any]) -> str | None:
    statuses = (pod.get("status") or {}).get("initContainerStatuses") or []
    for container in statuses:
        if container.get("name") != PROBE_CONTAINER:
            continue
        for key in ("state", "lastState"):
            terminated = (container.get(key) or {}).get("terminated") or {}
            message = terminated.get("message")
            if message:
                return str(message)
    return None


def parse_probe_report(pod: Mapping[str, Any]) -> ProbeReport | ProbeFailure | None:
    """The probe report from a pod's ``probe`` init container termination message, if any."""
    name = str((pod.get("metadata") or {}).get("name", "?"))
    message = _probe_message(pod)
    if message is None:
        return None
    try:
        data = json.loads(message)
    except (ValueError, RecursionError):  # also numbers past Python's digit limit, deep nesting
        return ProbeFailure(pod=name, error=f"not JSON: {message[:120]!r}")
    if not isinstance(data, dict) or data.get("schema") != PROBE_SCHEMA:
        return ProbeFailure(pod=name, error=f"unknown probe report schema in {message[:120]!r}")
    wrong = next((key for key, ok in _REPORT_TYPES.items() if not ok(data.get(key))), None)
    if wrong is not None:  # a wrong type would reach status and make the API server refuse it
        return ProbeFailure(pod=name, error=f"probe report field {wrong} has the wrong type")
    return ProbeReport(
        pod=name,
        sglang_version=data.get("sglang_version"),
        kv_hints_parameter=bool(data.get("kv_hints_parameter")),
        dialect=data.get("dialect") or "none",
        storage_backends=tuple(data.get("hicache_storage_backends") or ()),
        mooncake_importable=bool(data.get("mooncake_store_importable")),
        mooncake_error=data.get("mooncake_error"),
        usable_for_hints=bool(data.get("usable_for_hints")),
    )


def _optional(kind: type) -> Callable[[object], bool]:
    return lambda value: value is None or type(value) is kind


_REPORT_TYPES: Final[dict[str, Callable[[object], bool]]] = {
    "sglang_version": _optional(str),
    "kv_hints_parameter": _optional(bool),
    "dialect": _optional(str),
    "hicache_storage_backends": lambda v: (
        v is None or (type(v) is list and all(type(b) is str for b in v))
    ),
    "mooncake_store_importable": _optional(bool),
    "mooncake_error": _optional(str),
    "usable_for_hints": _optional(bool),
}
"""Each report field's JSON type (absent or null is allowed: the field then reads as false/none)."""


@dataclass(frozen=True)
class Fleet:
    """What the reconcile wants: identity, policy and every child manifest it built."""

    name: str
    namespace: str
    generation: int
    hints_required: bool
    desired: Sequence[Mapping[str, Any]]
    kvstore_external: str | None = None
    """The external Mooncake master address, or None when the operator manages the master."""
    retention_budget: float | None = None
    """``softPin.budgetRatio``: the share of the pool pins may hold (None: no budget)."""


@dataclass(frozen=True)
class Observed:
    """What the cluster shows: live Deployments by name and the fleet's worker pods."""

    deployments: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    worker_pods: Sequence[Mapping[str, Any]] = ()
    apply_errors: Sequence[str] = ()
    """Children the API server refused (RBAC, admission); the reconcile retries them."""
    kvstore: KvStoreReading | None = None
    """The managed master's last metrics read (None: not read, e.g. an external master)."""
    conflicts: Sequence[str] = ()
    """Children whose name is taken by an object this fleet does not control (never adopted)."""


# -- checks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One condition's outcome before bookkeeping (generation, transition time)."""

    status: CondStatus
    reason: str
    message: str


def check_workloads(workloads: Sequence[Workload], *, what: str) -> Verdict:
    """The first missing, rolling or not-ready Deployment wins; else all are ready."""
    if not workloads:
        return Verdict("False", "NotDeployed", f"no {what} Deployment is desired")
    for w in workloads:
        if w.desired == 0:  # "0/0 ready" is not serving
            return Verdict(
                "False",
                SCALED_TO_ZERO,
                f"Deployment {w.name} is scaled to 0 replicas: no {what} serves",
            )
    for w in workloads:
        if not w.exists:
            return Verdict("False", "NotCreated", f"Deployment {w.name} does not exist yet")
    for w in workloads:
        if not w.current_generation:
            return Verdict("False", "RollingOut", f"Deployment {w.name}: spec change not seen yet")
        if not w.rolled_out:
            return Verdict(
                "False",
                "RollingOut",
                f"Deployment {w.name}: {w.updated}/{w.desired} pods updated, {w.replicas} total",
            )
    for w in workloads:
        if w.ready < w.desired:
            return Verdict(
                "False", "PodsNotReady", f"Deployment {w.name}: {w.ready}/{w.desired} pods ready"
            )
    summary = ", ".join(f"{w.name} {w.ready}/{w.desired}" for w in workloads)
    return Verdict("True", "PodsReady", f"all pods ready ({summary})")


def check_kvstore(master: Sequence[Workload], *, external: str | None) -> Verdict:
    if external is not None:
        return Verdict("True", "External", f"using the external Mooncake master at {external}")
    return check_workloads(master, what="Mooncake master")


def check_retention_budget(
    reading: KvStoreReading | None, *, budget: float | None, external: str | None
) -> Verdict:
    """Pins against the budget: True within it, False past it, Unknown when unmeasured."""
    if external is not None:
        return Verdict(
            "Unknown", "ExternalMaster", "pins are measured only on a master the operator manages"
        )
    if reading is None:
        return Verdict("Unknown", "NotMeasured", "the master's metrics have not been read yet")
    if reading.usage is None:
        return Verdict(
            "Unknown", "MetricsUnavailable", reading.error or "the master's metrics are unreadable"
        )
    usage = reading.usage
    ratio = usage.pinned_ratio
    if ratio is None:
        return Verdict("Unknown", "NoCapacity", "no worker has mounted a segment into the pool yet")
    held = (
        f"{usage.pinned_keys} pinned objects hold about {ratio:.1%} of {usage.capacity_bytes} bytes"
    )
    if budget is None:
        return Verdict("True", "NoBudget", f"{held}; no softPin.budgetRatio is set")
    if ratio > budget:
        return Verdict("False", "OverBudget", f"{held}, past the {budget:.1%} budget")
    return Verdict("True", "WithinBudget", f"{held}, within the {budget:.1%} budget")


def check_kv_hints(reports: Sequence[ProbeReport | ProbeFailure]) -> Verdict:
    """Every worker pod's engine must take kv_hints; the first pod that cannot names the reason."""
    if not reports:
        return Verdict("Unknown", "ProbePending", "no worker pod has reported its engine yet")
    for r in reports:
        if isinstance(r, ProbeFailure):
            return Verdict("False", "ProbeReportInvalid", f"pod {r.pod}: {r.error}")
    good = [r for r in reports if isinstance(r, ProbeReport)]
    for r in good:
        if not r.kv_hints_parameter or r.dialect == "none":
            return Verdict(
                "False",
                "EngineLacksKvHints",
                f"pod {r.pod}: sglang {r.sglang_version or '(not installed)'} has no kv_hints "
                "parameter on Engine.async_generate",
            )
    for r in good:
        if not r.usable_for_hints:
            return Verdict(
                "False", "EngineUnusableForHints", f"pod {r.pod}: the probe reports it unusable"
            )
    first = good[0]
    message = f"sglang {first.sglang_version} accepts kv_hints ({first.dialect} dialect)"
    # The probe reports Mooncake but does not require it (docs/probe.md): a worker whose HiCache
    # backend cannot load fails its own readiness. Say it here so the cause is one look away.
    no_mooncake = next((r for r in good if not r.mooncake_importable), None)
    if no_mooncake is not None:
        message += (
            f"; note: mooncake.store does not import in pod {no_mooncake.pod}: "
            f"{no_mooncake.mooncake_error or 'unknown error'}"
        )
    return Verdict("True", "EngineAcceptsKvHints", message)


def check_progressing(workloads: Sequence[Workload]) -> Verdict:
    rolling = [w.name for w in workloads if not w.rolled_out]
    if rolling:
        return Verdict("True", "RollingOut", "rolling out: " + ", ".join(rolling))
    return Verdict("False", "Converged", "every Deployment runs the current spec")


def check_applied(apply_errors: Sequence[str]) -> Verdict | None:
    if not apply_errors:
        return None
    return Verdict("False", "ApplyFailed", "; ".join(apply_errors))


def check_conflicts(conflicts: Sequence[str]) -> Verdict | None:
    if not conflicts:
        return None
    return Verdict("False", "ChildConflict", "; ".join(conflicts))


def check_ready(
    verdicts: Mapping[str, Verdict],
    *,
    hints_required: bool,
    apply_errors: Sequence[str] = (),
    conflicts: Sequence[str] = (),
) -> Verdict:
    """The chain: name conflicts, refused writes, a definite hints failure, each component, a
    pending probe."""
    hints = verdicts[KV_HINTS_SUPPORTED]
    chain: list[Callable[[], Verdict | None]] = [
        lambda: check_conflicts(conflicts),
        lambda: check_applied(apply_errors),
        lambda: hints if hints_required and hints.status == "False" else None,
        *(
            (lambda t=t: verdicts[t] if verdicts[t].status != "True" else None)
            for t in (KVSTORE_READY, WORKERS_READY, ROUTER_READY, FRONTEND_READY)
        ),
        lambda: hints if hints_required and hints.status != "True" else None,
    ]
    for check in chain:
        failed = check()
        if failed is not None:
            return Verdict("False", failed.reason, failed.message)
    if hints.status != "True":
        return Verdict(
            "True", "ReadyWithoutKvHints", f"serving; hints not applied: {hints.message}"
        )
    return Verdict("True", "Ready", "every component is ready and the engine accepts kv_hints")


# -- assembly ----------------------------------------------------------------------------------


def build_conditions(
    verdicts: Mapping[str, Verdict],
    *,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: dt.datetime,
) -> list[dict[str, Any]]:
    """Conditions in a fixed order; a transition time moves only when the status flips."""
    before = {c.get("type"): c for c in previous}
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for type_ in CONDITION_TYPES:
        v = verdicts[type_]
        old = before.get(type_)
        same = old is not None and old.get("status") == v.status
        out.append(
            {
                "type": type_,
                "status": v.status,
                "reason": v.reason,
                "message": v.message,
                "observedGeneration": generation,
                "lastTransitionTime": old.get("lastTransitionTime", stamp)
                if same and old is not None
                else stamp,
            }
        )
    return out


def _components(fleet: Fleet, observed: Observed) -> dict[str, list[Workload]]:
    groups: dict[str, list[Workload]] = {}
    for manifest in fleet.desired:
        if manifest.get("kind") != "Deployment":
            continue
        w = observe_workload(manifest, observed.deployments.get(manifest["metadata"]["name"]))
        groups.setdefault(w.component, []).append(w)
    return groups


def _count(workloads: Sequence[Workload]) -> dict[str, int]:
    return {"ready": sum(w.ready for w in workloads), "desired": sum(w.desired for w in workloads)}


def _kvstore_usage(reading: KvStoreReading | None, *, budget: float | None) -> dict[str, Any]:
    if reading is None:
        return {}
    out: dict[str, Any] = {"observedAt": reading.observed_at}
    if reading.usage is not None:
        out.update(reading.usage.to_status())
        if reading.usage.pinned_ratio is not None:
            out["pinnedRatio"] = round(reading.usage.pinned_ratio, 4)
    if budget is not None:
        out["budgetRatio"] = budget
    return out


def _endpoint(fleet: Fleet) -> str | None:
    for m in fleet.desired:
        labels = (m.get("metadata") or {}).get("labels") or {}
        if m.get("kind") == "Service" and labels.get(COMPONENT_LABEL) == "frontend":
            ports = (m.get("spec") or {}).get("ports") or [{}]
            port = ports[0].get("port", 80)
            return f"http://{m['metadata']['name']}.{fleet.namespace}.svc:{port}"
    return None


def _scale(fleet: Fleet, observed: Observed) -> tuple[int, str] | None:
    """The scale subresource's view: the decode pool when disaggregated, else the worker pool."""
    by_component = {
        (m["metadata"].get("labels") or {}).get(COMPONENT_LABEL): m
        for m in fleet.desired
        if m.get("kind") == "Deployment"
    }
    target = by_component.get("worker-decode") or by_component.get("worker")
    if target is None:
        return None
    match = ((target.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(match.items()))
    live = observed.deployments.get(target["metadata"]["name"]) or {}
    return int((live.get("status") or {}).get("replicas") or 0), selector


def _engine(reports: Sequence[ProbeReport | ProbeFailure]) -> dict[str, Any] | None:
    for r in reports:
        if isinstance(r, ProbeReport):
            return {
                "sglangVersion": r.sglang_version or "",
                "dialect": r.dialect if r.dialect in DIALECTS else "none",
                "kvHintsParameter": r.kv_hints_parameter,
                "storageBackends": list(r.storage_backends),
                "mooncakeImportable": r.mooncake_importable,
            }
    return None


def worker_reports(pods: Sequence[Mapping[str, Any]]) -> list[ProbeReport | ProbeFailure]:
    """Probe reports of live worker pods, in pod-name order (deterministic)."""
    out = []
    for pod in sorted(pods, key=lambda p: str((p.get("metadata") or {}).get("name", ""))):
        if (pod.get("metadata") or {}).get("deletionTimestamp"):
            continue
        report = parse_probe_report(pod)
        if report is not None:
            out.append(report)
    return out


def compute_status(
    fleet: Fleet,
    observed: Observed,
    *,
    previous: Mapping[str, Any] | None,
    now: dt.datetime,
) -> dict[str, Any]:
    """The whole status the operator writes for a valid spec."""
    groups = _components(fleet, observed)
    workers = [w for c in WORKER_COMPONENTS for w in groups.get(c, [])]
    master = groups.get("mooncake-master", [])
    reports = worker_reports(observed.worker_pods)
    verdicts = {
        FRONTEND_READY: check_workloads(groups.get("frontend", []), what="frontend"),
        ROUTER_READY: check_workloads(groups.get("router", []), what="router"),
        WORKERS_READY: check_workloads(workers, what="worker"),
        KVSTORE_READY: check_kvstore(master, external=fleet.kvstore_external),
        KV_HINTS_SUPPORTED: check_kv_hints(reports),
        RETENTION_BUDGET: check_retention_budget(
            observed.kvstore, budget=fleet.retention_budget, external=fleet.kvstore_external
        ),
        PROGRESSING: check_conflicts(observed.conflicts)
        or check_applied(observed.apply_errors)
        or check_progressing([w for ws in groups.values() for w in ws]),
    }
    verdicts[READY] = check_ready(
        verdicts,
        hints_required=fleet.hints_required,
        apply_errors=observed.apply_errors,
        conflicts=observed.conflicts,
    )
    previous_conditions = (previous or {}).get("conditions") or []
    workers_count = _count(workers)
    status: dict[str, Any] = {
        "observedGeneration": fleet.generation,
        "conditions": build_conditions(
            verdicts, generation=fleet.generation, previous=previous_conditions, now=now
        ),
        "frontend": _count(groups.get("frontend", [])),
        "router": _count(groups.get("router", [])),
        "workers": workers_count,
        "kvStore": {
            **_count(master),
            **_kvstore_usage(observed.kvstore, budget=fleet.retention_budget),
        },
        "workersReady": f"{workers_count['ready']}/{workers_count['desired']}",
    }
    endpoint = _endpoint(fleet)
    if endpoint is not None:
        status["endpoint"] = endpoint
    engine = _engine(reports)
    if engine is not None:
        status["engine"] = engine
    scale = _scale(fleet, observed)
    if scale is not None:
        status["replicas"], status["selector"] = scale
    return status


def compute_invalid_status(
    *,
    generation: int,
    problems: Sequence[str],
    previous: Mapping[str, Any] | None,
    now: dt.datetime,
) -> dict[str, Any]:
    """The status of a spec that can never work: Ready=False/InvalidSpec, nothing deployed."""
    message = "; ".join(problems) or "the spec is invalid"
    unknown = Verdict("Unknown", "InvalidSpec", "nothing is deployed while the spec is invalid")
    verdicts = {t: unknown for t in CONDITION_TYPES}
    verdicts[READY] = Verdict("False", "InvalidSpec", message)
    verdicts[PROGRESSING] = Verdict("False", "InvalidSpec", message)
    previous_conditions = (previous or {}).get("conditions") or []
    return {
        "observedGeneration": generation,
        "conditions": build_conditions(
            verdicts, generation=generation, previous=previous_conditions, now=now
        ),
    }


def owned_part(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a status the operator owns (to compare against a freshly computed one)."""
    return {k: v for k, v in (status or {}).items() if k in STATUS_KEYS}


def transitions(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """Conditions whose status flipped (or appeared) between two statuses: the Events to post."""
    before = {c.get("type"): c.get("status") for c in (previous or {}).get("conditions") or []}
    return [c for c in current.get("conditions") or [] if before.get(c["type"]) != c["status"]]
