"""Pure status: what the fleet should be plus what the cluster shows in, the CR's status out.

Observed state is gathered once (the Deployments, the fleet's pods and the probe reports of its
worker pods), then chains of small checks run, cert-manager style: per Deployment, the first check
with something to say (the scheduler cannot place a pod, an image cannot be pulled, the
ReplicaSet controller cannot create pods, ...) names its component's reason; across components,
the first failing one names ``Ready``'s. ``lastTransitionTime`` only moves when a condition's
status flips.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from kvretention.api.models import (
    Condition,
    EngineStatus,
    KvRetentionDeploymentStatus,
    KvStoreStatus,
    ReplicaCount,
    WorkerPoolStatus,
    WorkersStatus,
)
from kvretention.api.names import (
    CONDITION_TYPES,
    FRONTEND_READY,
    KV_HINTS_SUPPORTED,
    KVSTORE_READY,
    PROBE_CONTAINER,
    PROGRESSING,
    READY,
    RETENTION_APPLIED,
    RETENTION_BUDGET,
    ROUTER_READY,
    WORKERS_READY,
    label_selector,
)
from kvretention.api.names import LABEL_COMPONENT as COMPONENT_LABEL
from kvretention.api.probe_report import (
    DIALECTS,
    PLUGIN_LOAD_FAILED,
    PLUGIN_LOADED,
    PLUGIN_NOT_INSTALLED,
    PLUGIN_NOT_SELECTED,
    PLUGIN_UNSUPPORTED,
    RETENTION_PLUGIN_STATES,
    ProbeReport,
    ProbeReportError,
    parse_report,
)
from kvretention.controller.diagnosis import (
    LEADER_WORKER_SET,
    LEADER_WORKER_SET_MISSING,
    POD_PROBLEMS,
    PODS_NOT_READY,
    PODS_STARTING,
    PROGRESS_DEADLINE_EXCEEDED,
    REPLICA_FAILURE,
    ROLLING_OUT,
    SCALED_TO_ZERO,
    Workload,
    clip,
    diagnose_pods,
    live_pods,
    observe_group_workload,
    observe_workload,
    pods_of,
)
from kvretention.controller.kvstore_metrics import KvStoreReading
from kvretention.controller.resources.sglang_args import (
    EVICTION_POLICY_OVERRIDDEN,
    PLUGIN_NOT_SELECTED_REASON,
    RetentionWiring,
)
from kvretention.retention import EVICTION_POLICY

CondStatus = Literal["True", "False", "Unknown"]

WORKER_COMPONENTS: Final = ("worker", "worker-prefill", "worker-decode")
WORKLOAD_KINDS: Final = frozenset({"Deployment", LEADER_WORKER_SET})
LWS_LEADER_SELECTOR: Final = ("leaderworkerset.sigs.k8s.io/worker-index", "0")
"""The label of a LeaderWorkerSet group's leader pod (rank 0)."""
"""Children that run pods: a Deployment, or a multinode pool's LeaderWorkerSet."""

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


CHILD_CONFLICT: Final = "ChildConflict"
"""A child's name is taken by an object the fleet does not control (never adopted); what would
use that object waits."""

MASTER_RESTARTING: Final = "MasterRestarting"
"""The managed Mooncake master rolls out a new pod template: the master process restarts and
drops what it held. Asked for by a spec change, so not a problem (a Normal Event)."""

RETENTION_IS_APPLIED: Final = "Applied"
HINTS_OFF: Final = "HintsOff"
"""No request can carry ``kv.retain`` (policy Optional, every provider off, no default TTL):
nothing to apply."""
TRANSPORT_ONLY: Final = "TransportOnly"
"""SGLang receives ``kv.retain`` and ignores it: the image has no retention plugin (or a probe that
predates it), or its SGLang has no plugin framework. Eviction is SGLang's own; no soft pins."""
PLUGIN_LOAD_FAILED_REASON: Final = "PluginLoadFailed"
HOOK_TARGETS_MISSING: Final = "HookTargetsMissing"
"""The plugin loads but some SGLang target it hooks is missing or changed: it would apply
``kv.retain`` partly or not at all, so it counts as not applied."""
KV_HINTS_NOT_ACCEPTED: Final = "KvHintsNotAccepted"
"""SGLang takes no ``kv_hints`` at all (``KvHintsSupported`` warns about it already)."""
RETENTION_PROBLEMS: Final = frozenset(
    {
        TRANSPORT_ONLY,
        PLUGIN_NOT_SELECTED_REASON,
        PLUGIN_LOAD_FAILED_REASON,
        HOOK_TARGETS_MISSING,
        EVICTION_POLICY_OVERRIDDEN,
    }
)
"""``RetentionApplied`` reasons with hints on: someone asked for retention and it is not applied."""

PROBLEM_REASONS: Final = frozenset(
    {
        *POD_PROBLEMS,
        REPLICA_FAILURE,
        PROGRESS_DEADLINE_EXCEEDED,
        "ApplyFailed",
        CHILD_CONFLICT,
        LEADER_WORKER_SET_MISSING,
        "InvalidSpec",
        "EngineLacksKvHints",
        "EngineUnusableForHints",
        "ProbeReportInvalid",
        "OverBudget",
        *RETENTION_PROBLEMS,
    }
)
"""Reasons that need someone to act (a Warning Event); every other False is waiting or on purpose."""


@dataclass(frozen=True)
class PodReport:
    """One worker pod's probe report (the pod is named in the conditions' messages)."""

    pod: str
    report: ProbeReport


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


def parse_probe_report(pod: Mapping[str, Any]) -> PodReport | ProbeFailure | None:
    """The probe report from a pod's ``probe`` init container termination message, if any."""
    name = str((pod.get("metadata") or {}).get("name", "?"))
    message = _probe_message(pod)
    if message is None:
        return None
    try:
        return PodReport(pod=name, report=parse_report(message))
    except ProbeReportError as err:
        return ProbeFailure(pod=name, error=str(err))


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
    retention: RetentionWiring = field(default_factory=RetentionWiring)
    """Hints on or off, and a user setting that keeps the retention plugin's policy out."""


@dataclass(frozen=True)
class Observed:
    """What the cluster shows: live Deployments by name and the fleet's pods."""

    deployments: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    worker_pods: Sequence[Mapping[str, Any]] = ()
    """The fleet's worker pods: their probe reports."""
    pods: Sequence[Mapping[str, Any]] = ()
    """Every pod of the fleet (each Deployment finds its own by selector): why pods are not ready."""
    apply_errors: Sequence[str] = ()
    """Children the API server refused (RBAC, admission); the reconcile retries them."""
    kvstore: KvStoreReading | None = None
    """The managed master's last metrics read (None: not read, e.g. an external master)."""
    conflicts: Sequence[str] = ()
    """Children whose name is taken by an object this fleet does not control (never adopted)."""
    taken: frozenset[tuple[str, str]] = frozenset()
    """The (kind, name) of each child in ``conflicts``."""
    held: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """Children not created or updated while a name they depend on is taken, and why."""
    unserved_kinds: frozenset[str] = frozenset()
    """Child kinds the API server does not serve (the LeaderWorkerSet CRD not installed)."""


# -- checks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One condition's outcome before bookkeeping (generation, transition time)."""

    status: CondStatus
    reason: str
    message: str


def diagnose_workload(
    w: Workload,
    pods: Sequence[Mapping[str, Any]],
    *,
    what: str,
    held: Mapping[str, str] | None = None,
) -> tuple[int, Verdict]:
    """One Deployment's chain: the rank of the first check with something to say, and its verdict.

    Ranks order components too: of several worker pools, the one whose check came first speaks.
    ``held``: workloads by name that wait for a child name conflict, and why.
    """
    hold = (held or {}).get(w.name)
    issue = diagnose_pods(pods_of(w, pods)) if w.exists and not w.healthy else None
    problem = issue if issue is not None and issue.reason in POD_PROBLEMS else None
    doing = f"; {issue.message}" if issue is not None else ""
    chain: list[Callable[[], Verdict | None]] = [
        lambda: (
            Verdict(
                "False",
                SCALED_TO_ZERO,
                f"{w.kind} {w.name} is scaled to 0 replicas: no {what} serves",
            )
            if w.desired == 0
            else None
        ),
        lambda: (
            Verdict("False", CHILD_CONFLICT, hold) if hold is not None and not w.exists else None
        ),
        lambda: (
            Verdict("False", LEADER_WORKER_SET_MISSING, w.unserved)
            if w.unserved is not None and not w.exists
            else None
        ),
        lambda: (
            None
            if w.exists
            else Verdict("False", "NotCreated", f"{w.kind} {w.name} does not exist yet")
        ),
        lambda: (
            Verdict("True", "PodsReady", f"{w.kind} {w.name}: {w.ready}/{w.desired} ready")
            if w.healthy
            else None
        ),
        lambda: (
            Verdict(
                "False",
                REPLICA_FAILURE,
                f"{w.kind} {w.name} cannot create pods ({w.ready}/{w.desired} ready): "
                f"{w.replica_failure}",
            )
            if w.replica_failure
            else None
        ),
        lambda: (
            Verdict(
                "False",
                PROGRESS_DEADLINE_EXCEEDED,
                f"{w.kind} {w.name} ({w.progress}): {w.deadline_exceeded}{doing}",
            )
            if w.deadline_exceeded
            else None
        ),
        lambda: (
            Verdict(
                "False",
                problem.reason,
                f"{w.kind} {w.name} ({w.ready}/{w.desired} ready): {problem.message}",
            )
            if problem is not None
            else None
        ),
        lambda: (
            None
            if w.current_generation
            else Verdict("False", ROLLING_OUT, f"{w.kind} {w.name}: spec change not seen yet")
        ),
        lambda: (
            None
            if w.updated_all
            else Verdict("False", ROLLING_OUT, f"{w.kind} {w.name}: {w.progress}{doing}")
        ),
        lambda: Verdict(
            "False",
            PODS_STARTING if issue is not None else PODS_NOT_READY,
            f"{w.kind} {w.name}: {w.progress}{doing}",
        ),
    ]
    for rank, check in enumerate(chain):
        verdict = check()
        if verdict is not None:
            return rank, verdict
    raise AssertionError("the last check always speaks")  # pragma: no cover


def check_workloads(
    workloads: Sequence[Workload],
    pods: Sequence[Mapping[str, Any]] = (),
    *,
    what: str,
    held: Mapping[str, str] | None = None,
) -> Verdict:
    """A component's condition: the not-ready Deployment whose check ranks first, else ready."""
    if not workloads:
        return Verdict("False", "NotDeployed", f"no {what} Deployment is desired")
    diagnosed = [diagnose_workload(w, pods, what=what, held=held) for w in workloads]
    failing = [(rank, i, v) for i, (rank, v) in enumerate(diagnosed) if v.status != "True"]
    if failing:
        return min(failing, key=lambda f: (f[0], f[1]))[2]
    summary = ", ".join(f"{w.name} {w.ready}/{w.desired}" for w in workloads)
    return Verdict("True", "PodsReady", f"all pods ready ({summary})")


WAITING_REASONS: Final = frozenset({ROLLING_OUT, PODS_STARTING, PODS_NOT_READY})
"""A Deployment's reasons that waiting fixes (no problem, not on purpose, the Deployment exists)."""


def is_rolling_new_template(w: Workload, pods: Sequence[Mapping[str, Any]] = ()) -> bool:
    """The Deployment replaces pods that ran an earlier spec: the controller has not seen a
    changed spec yet, pods of an older template still count, or (``Recreate``) the old pod is
    terminating and no new one exists yet. A first rollout (nothing synced before) is not one."""
    if not w.exists or w.healthy:
        return False
    if w.synced and not w.current_generation:
        return True
    if w.replicas > w.updated:
        return True
    own = pods_of(w, pods)
    return w.updated < w.desired and bool(own) and not live_pods(own)


def check_kvstore(
    master: Sequence[Workload],
    pods: Sequence[Mapping[str, Any]] = (),
    *,
    external: str | None,
    was_restarting: bool = False,
) -> Verdict:
    """The managed master's chain, where one more thing is said: the master's Deployment rolling
    out a new template (a soft-pin or eviction setting, an image) restarts the one process that
    holds the L3 tier's index. From the first sign of it until the new pod is ready
    (``was_restarting``: the previous status said so), a waiting reason becomes
    ``MasterRestarting``; problems (an image that cannot be pulled) still speak for themselves."""
    if external is not None:
        return Verdict("True", "External", f"using the external Mooncake master at {external}")
    verdict = check_workloads(master, pods, what="Mooncake master")
    if verdict.reason not in WAITING_REASONS:
        return verdict
    if not was_restarting and not any(is_rolling_new_template(w, pods) for w in master):
        return verdict
    return Verdict(
        "False",
        MASTER_RESTARTING,
        "the Mooncake master is restarting with a new pod template: the objects and soft pins "
        "it held are dropped (workers stay up and serve without them); " + verdict.message,
    )


def budget_enforced(retention: Verdict) -> bool | None:
    """Whether the workers enforce the pin budget: the retention plugin (whose L3 hook keeps each
    worker's pins within its share) is applied on every worker; None while that is not known."""
    if retention.status == "Unknown":
        return None
    return retention.status == "True"


def _enforcement(enforced: bool | None, budget: float | None) -> str:
    """What bounds pins besides the master's numbers: the enforced half of the condition."""
    if budget is None:
        return ""
    if enforced is True:
        return (
            "; enforced by the workers' retention plugin: each worker pins at most "
            f"{budget:.1%} of the segment it contributes, a retained page past it is written "
            "unpinned and counted (kvretention_l3_pages_total{outcome=over_budget})"
        )
    if enforced is False:
        return "; observed only: the workers' SGLang does not apply kv.retain (RetentionApplied)"
    return ""


def check_retention_budget(
    reading: KvStoreReading | None,
    *,
    budget: float | None,
    external: str | None,
    enforced: bool | None = None,
) -> Verdict:
    """Pins against the budget: True within it, False past it, Unknown when unmeasured. The
    message says both halves: what the master reports (observed, an upper bound: the master keeps
    counting a pin after its TTL until the object goes) and whether the workers' retention plugin
    enforces the budget at write time (``enforced``: None when not known)."""
    enforcement = _enforcement(enforced, budget)
    if external is not None:
        return Verdict(
            "Unknown",
            "ExternalMaster",
            "pins are measured only on a master the operator manages" + enforcement,
        )
    if reading is None:
        return Verdict(
            "Unknown", "NotMeasured", "the master's metrics have not been read yet" + enforcement
        )
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
        return Verdict(
            "False", "OverBudget", f"observed: {held}, past the {budget:.1%} budget{enforcement}"
        )
    return Verdict(
        "True", "WithinBudget", f"observed: {held}, within the {budget:.1%} budget{enforcement}"
    )


def check_kv_hints(reports: Sequence[PodReport | ProbeFailure]) -> Verdict:
    """Every worker pod's engine must take kv_hints; the first pod that cannot names the reason."""
    if not reports:
        return Verdict("Unknown", "ProbePending", "no worker pod has reported its engine yet")
    for r in reports:
        if isinstance(r, ProbeFailure):
            return Verdict("False", "ProbeReportInvalid", f"pod {r.pod}: {r.error}")
    good = [r for r in reports if isinstance(r, PodReport)]
    for r in good:
        if not r.report.kv_hints_parameter or r.report.dialect == "none":
            return Verdict(
                "False",
                "EngineLacksKvHints",
                f"pod {r.pod}: sglang {r.report.sglang_version or '(not installed)'} has no "
                "kv_hints parameter on Engine.async_generate",
            )
    for r in good:
        if not r.report.usable_for_hints:
            return Verdict(
                "False", "EngineUnusableForHints", f"pod {r.pod}: the probe reports it unusable"
            )
    first = good[0].report
    message = f"sglang {first.sglang_version} accepts kv_hints ({first.dialect} dialect)"
    # The probe reports Mooncake but does not require it (docs/probe.md): a worker whose HiCache
    # backend cannot load fails its own readiness. Say it here so the cause is one look away.
    no_mooncake = next((r for r in good if not r.report.mooncake_store_importable), None)
    if no_mooncake is not None:
        message += (
            f"; note: mooncake.store does not import in pod {no_mooncake.pod}: "
            f"{no_mooncake.report.mooncake_error or 'unknown error'}"
        )
    return Verdict("True", "EngineAcceptsKvHints", message)


def _plugin_verdict(r: PodReport) -> Verdict | None:
    """What keeps one pod's SGLang from applying ``kv.retain``; None when nothing does."""
    report = r.report
    sglang = f"sglang {report.sglang_version or '(not installed)'}"
    why = f": {report.retention_error}" if report.retention_error else ""
    state = report.retention_plugin
    if not report.usable_for_hints:
        return Verdict(
            "False",
            KV_HINTS_NOT_ACCEPTED,
            f"pod {r.pod}: {sglang} takes no kv_hints, so no kv.retain reaches its cache",
        )
    if state is None:
        return Verdict(
            "False",
            TRANSPORT_ONLY,
            f"pod {r.pod}: the image's probe predates the retention plugin; {sglang} receives "
            "kv.retain and ignores it (its own eviction, no soft pins)",
        )
    if state in (PLUGIN_NOT_INSTALLED, PLUGIN_UNSUPPORTED):
        return Verdict(
            "False",
            TRANSPORT_ONLY,
            f"pod {r.pod}: {sglang} receives kv.retain and ignores it, the retention plugin is "
            f"{'not installed' if state == PLUGIN_NOT_INSTALLED else 'unsupported'}{why}",
        )
    if state == PLUGIN_NOT_SELECTED:
        return Verdict(
            "False",
            PLUGIN_NOT_SELECTED_REASON,
            f"pod {r.pod}: {sglang} does not load the retention plugin{why}",
        )
    if state == PLUGIN_LOAD_FAILED:
        return Verdict(
            "False",
            PLUGIN_LOAD_FAILED_REASON,
            f"pod {r.pod}: {sglang} fails to load the retention plugin{why}",
        )
    if state != PLUGIN_LOADED:
        return Verdict(
            "Unknown", "UnknownPluginState", f"pod {r.pod}: retention plugin state {state!r}"
        )
    problems = report.retention_target_problems
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Verdict(
            "False",
            HOOK_TARGETS_MISSING,
            clip(
                f"pod {r.pod}: the retention plugin loads in {sglang} but its hook targets do not "
                f"match, so kv.retain would not be applied: {problems[0]}{more}"
            ),
        )
    return None


def check_retention_applied(
    reports: Sequence[PodReport | ProbeFailure], wiring: RetentionWiring
) -> Verdict:
    """Whether SGLang applies ``kv.retain``: hints on, the plugin's policy rendered (no user setting
    keeps it out), then every worker pod's probe: SGLang loads the plugin and finds its targets."""
    if not wiring.hints:
        return Verdict(
            "False",
            HINTS_OFF,
            "no request carries kv.retain: hints.policy is Optional, every hints.providers "
            "switch is off and hints.defaultTtlSeconds is unset",
        )
    if wiring.blocked_reason is not None:
        return Verdict("False", wiring.blocked_reason, wiring.blocked_message)
    if not reports:
        return Verdict("Unknown", "ProbePending", "no worker pod has reported its engine yet")
    for r in reports:
        if isinstance(r, ProbeFailure):
            return Verdict("Unknown", "ProbeReportInvalid", f"pod {r.pod}: {r.error}")
    good = [r for r in reports if isinstance(r, PodReport)]
    for r in good:
        verdict = _plugin_verdict(r)
        if verdict is not None:
            return verdict
    return Verdict(
        "True",
        RETENTION_IS_APPLIED,
        f"sglang {good[0].report.sglang_version} loads the retention plugin and finds its hook "
        f"targets on every worker pod; the workers evict with --radix-eviction-policy "
        f"{EVICTION_POLICY}",
    )


def check_progressing(
    workloads: Sequence[Workload], pods: Sequence[Mapping[str, Any]] = ()
) -> Verdict:
    """The Deployment controller's verdict first (a rollout past its deadline), then rollouts still
    under way with their progress and what holds them up, else converged."""
    stuck = next((w for w in workloads if w.deadline_exceeded), None)
    if stuck is not None:
        return Verdict(
            "False",
            PROGRESS_DEADLINE_EXCEEDED,
            f"Deployment {stuck.name}: {stuck.deadline_exceeded}",
        )
    rolling = []
    for w in workloads:
        if w.rolled_out:
            continue
        _, verdict = diagnose_workload(w, pods, what=w.component)
        held = f", {verdict.reason}" if verdict.reason in PROBLEM_REASONS else ""
        rolling.append(f"{w.name} ({w.progress}{held})")
    if rolling:
        return Verdict("True", ROLLING_OUT, "rolling out: " + "; ".join(rolling))
    return Verdict(
        "False", "Converged", "every Deployment runs the current spec with all pods available"
    )


def check_applied(apply_errors: Sequence[str]) -> Verdict | None:
    if not apply_errors:
        return None
    return Verdict("False", "ApplyFailed", "; ".join(apply_errors))


def check_conflicts(conflicts: Sequence[str], held: Sequence[str] = ()) -> Verdict | None:
    """Taken names, then what waits for them (what would have used the foreign objects)."""
    if not conflicts:
        return None
    return Verdict("False", CHILD_CONFLICT, "; ".join([*conflicts, *held]))


def check_ready(
    verdicts: Mapping[str, Verdict],
    *,
    hints_required: bool,
    apply_errors: Sequence[str] = (),
    conflicts: Sequence[str] = (),
    held: Sequence[str] = (),
) -> Verdict:
    """The chain: name conflicts, refused writes, a definite hints or retention failure, each
    component, a pending probe.

    Under ``hints.policy: Required`` the fleet is Ready only when SGLang accepts ``kv_hints`` and
    applies ``kv.retain`` (``RetentionApplied``); under ``Optional`` neither holds Ready back."""
    hints = verdicts[KV_HINTS_SUPPORTED]
    retention = verdicts[RETENTION_APPLIED]
    retention_required = hints_required and retention.reason != HINTS_OFF
    chain: list[Callable[[], Verdict | None]] = [
        lambda: check_conflicts(conflicts, held),
        lambda: check_applied(apply_errors),
        lambda: hints if hints_required and hints.status == "False" else None,
        lambda: retention if retention_required and retention.status == "False" else None,
        *(
            (lambda t=t: verdicts[t] if verdicts[t].status != "True" else None)
            for t in (KVSTORE_READY, WORKERS_READY, ROUTER_READY, FRONTEND_READY)
        ),
        lambda: hints if hints_required and hints.status != "True" else None,
        lambda: retention if retention_required and retention.status != "True" else None,
    ]
    for check in chain:
        failed = check()
        if failed is not None:
            return Verdict("False", failed.reason, failed.message)
    if hints.status != "True":
        return Verdict(
            "True", "ReadyWithoutKvHints", f"serving; hints not applied: {hints.message}"
        )
    message = "every component is ready and the engine accepts kv_hints"
    if retention.status == "True":
        message += " and applies kv.retain"
    elif retention.reason != HINTS_OFF:
        message += f"; kv.retain is not applied ({RETENTION_APPLIED} {retention.reason})"
    return Verdict("True", "Ready", message)


# -- assembly ----------------------------------------------------------------------------------


def build_conditions(
    verdicts: Mapping[str, Verdict],
    *,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: dt.datetime,
) -> list[Condition]:
    """Conditions in a fixed order; a transition time moves only when the status flips."""
    before = {c.get("type"): c for c in previous}
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    for type_ in CONDITION_TYPES:
        v = verdicts[type_]
        old = before.get(type_)
        same = old is not None and old.get("status") == v.status
        out.append(
            Condition(
                type=type_,
                status=v.status,
                reason=v.reason,
                message=v.message,
                observed_generation=generation,
                last_transition_time=old.get("lastTransitionTime", stamp)
                if same and old is not None
                else stamp,
            )
        )
    return out


def _components(fleet: Fleet, observed: Observed) -> dict[str, list[Workload]]:
    groups: dict[str, list[Workload]] = {}
    for manifest in fleet.desired:
        kind = manifest.get("kind")
        if kind not in WORKLOAD_KINDS:
            continue
        live = observed.deployments.get(manifest["metadata"]["name"])
        if kind == LEADER_WORKER_SET:
            w = observe_group_workload(manifest, live)
            if kind in observed.unserved_kinds:
                w = replace(w, unserved=lws_missing_message(w.name))
        else:
            w = observe_workload(manifest, live)
        groups.setdefault(w.component, []).append(w)
    return groups


def lws_missing_message(name: str) -> str:
    return (
        f"LeaderWorkerSet {name} cannot be created: the API server does not serve "
        "leaderworkerset.x-k8s.io/v1 (the LeaderWorkerSet CRD is not installed). Install the "
        "LeaderWorkerSet controller (sigs.k8s.io/lws), a prerequisite only for multinode "
        "fleets (workers.nodesPerReplica > 1)"
    )


def _count(workloads: Sequence[Workload]) -> dict[str, int]:
    """A component's pods: ready and desired, and its rollout's updated and available."""
    return {
        "ready": sum(w.ready for w in workloads),
        "desired": sum(w.desired for w in workloads),
        "updated": sum(w.updated for w in workloads),
        "available": sum(w.available for w in workloads),
    }


def _pools(
    workloads: Sequence[Workload],
    pods: Sequence[Mapping[str, Any]],
    *,
    held: Mapping[str, str] | None = None,
) -> list[WorkerPoolStatus]:
    """Each worker pool (Deployment) with its counts and the reason of its own chain."""
    out = []
    for w in workloads:
        _, verdict = diagnose_workload(w, pods, what="worker", held=held)
        group = {"nodes_per_replica": w.group_size} if w.kind == LEADER_WORKER_SET else {}
        out.append(
            WorkerPoolStatus(
                name=w.name,
                role=w.component,
                **_count([w]),
                reason=verdict.reason,
                message=verdict.message,
                **group,
            )
        )
    return out


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


def _budget_enforcement(budget: float | None, enforced: bool | None) -> dict[str, Any]:
    """``budgetEnforced`` beside ``pinnedRatio``: enforced by the workers, or observed only."""
    if budget is None or enforced is None:
        return {}
    return {"budgetEnforced": enforced}


def _endpoint(fleet: Fleet, taken: frozenset[tuple[str, str]]) -> str | None:
    """The frontend Service's address; none while that name is taken by a foreign Service (it
    would send clients to whoever made it)."""
    for m in fleet.desired:
        labels = (m.get("metadata") or {}).get("labels") or {}
        if m.get("kind") == "Service" and labels.get(COMPONENT_LABEL) == "frontend":
            if ("Service", m["metadata"]["name"]) in taken:
                return None
            ports = (m.get("spec") or {}).get("ports") or [{}]
            port = ports[0].get("port", 80)
            return f"http://{m['metadata']['name']}.{fleet.namespace}.svc:{port}"
    return None


def _scale(fleet: Fleet, observed: Observed) -> tuple[int, str] | None:
    """The scale subresource's view: the decode pool when disaggregated, else the worker pool."""
    by_component = {
        (m["metadata"].get("labels") or {}).get(COMPONENT_LABEL): m
        for m in fleet.desired
        if m.get("kind") in WORKLOAD_KINDS
    }
    target = by_component.get("worker-decode") or by_component.get("worker")
    if target is None:
        return None
    match = ((target.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    if target.get("kind") == LEADER_WORKER_SET:  # one leader pod per replica (a group)
        match = {**observe_group_workload(target, None).selector, LWS_LEADER_SELECTOR[0]: "0"}
    selector = label_selector(match)
    live = observed.deployments.get(target["metadata"]["name"]) or {}
    return int((live.get("status") or {}).get("replicas") or 0), selector


def _engine(reports: Sequence[PodReport | ProbeFailure]) -> EngineStatus | None:
    for r in reports:
        if isinstance(r, PodReport):
            report = r.report
            plugin: dict[str, Any] = {}
            if report.retention_plugin in RETENTION_PLUGIN_STATES:
                plugin["retention_plugin"] = report.retention_plugin
                plugin["hook_target_problems"] = list(report.retention_target_problems)
            return EngineStatus(
                sglang_version=report.sglang_version or "",
                dialect=report.dialect if report.dialect in DIALECTS else "none",
                kv_hints_parameter=report.kv_hints_parameter,
                storage_backends=list(report.hicache_storage_backends),
                mooncake_importable=report.mooncake_store_importable,
                **plugin,
            )
    return None


def worker_reports(pods: Sequence[Mapping[str, Any]]) -> list[PodReport | ProbeFailure]:
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
    pods = observed.pods
    previous_conditions = (previous or {}).get("conditions") or []
    was_restarting = any(
        c.get("type") == KVSTORE_READY and c.get("reason") == MASTER_RESTARTING
        for c in previous_conditions
    )
    held = {name: message for (kind, name), message in observed.held.items() if kind != "Service"}
    verdicts = {
        FRONTEND_READY: check_workloads(
            groups.get("frontend", []), pods, what="frontend", held=held
        ),
        ROUTER_READY: check_workloads(groups.get("router", []), pods, what="router", held=held),
        WORKERS_READY: check_workloads(workers, pods, what="worker", held=held),
        KVSTORE_READY: check_kvstore(
            master, pods, external=fleet.kvstore_external, was_restarting=was_restarting
        ),
        KV_HINTS_SUPPORTED: check_kv_hints(reports),
        RETENTION_APPLIED: (retention := check_retention_applied(reports, fleet.retention)),
        RETENTION_BUDGET: check_retention_budget(
            observed.kvstore,
            budget=fleet.retention_budget,
            external=fleet.kvstore_external,
            enforced=budget_enforced(retention),
        ),
        PROGRESSING: check_conflicts(observed.conflicts, [*observed.held.values()])
        or check_applied(observed.apply_errors)
        or check_progressing([w for ws in groups.values() for w in ws], pods),
    }
    verdicts[READY] = check_ready(
        verdicts,
        hints_required=fleet.hints_required,
        apply_errors=observed.apply_errors,
        conflicts=observed.conflicts,
        held=[*observed.held.values()],
    )
    workers_count = _count(workers)
    optional: dict[str, Any] = {}
    endpoint = _endpoint(fleet, observed.taken)
    if endpoint is not None:
        optional["endpoint"] = endpoint
    engine = _engine(reports)
    if engine is not None:
        optional["engine"] = engine
    scale = _scale(fleet, observed)
    if scale is not None:
        optional["replicas"], optional["selector"] = scale
    status = KvRetentionDeploymentStatus(
        observed_generation=fleet.generation,
        conditions=build_conditions(
            verdicts, generation=fleet.generation, previous=previous_conditions, now=now
        ),
        frontend=ReplicaCount(**_count(groups.get("frontend", []))),
        router=ReplicaCount(**_count(groups.get("router", []))),
        workers=WorkersStatus(**workers_count, pools=_pools(workers, pods, held=held)),
        kv_store=KvStoreStatus.model_validate(
            {
                **_count(master),
                **_kvstore_usage(observed.kvstore, budget=fleet.retention_budget),
                **_budget_enforcement(fleet.retention_budget, budget_enforced(retention)),
            }
        ),
        workers_ready=f"{workers_count['ready']}/{workers_count['desired']}",
        **optional,
    )
    return _written(status)


def _written(status: KvRetentionDeploymentStatus) -> dict[str, Any]:
    """The status as the operator writes it: camelCase, and only the fields it set."""
    return status.model_dump(by_alias=True, exclude_unset=True)


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
    return _written(
        KvRetentionDeploymentStatus(
            observed_generation=generation,
            conditions=build_conditions(
                verdicts, generation=generation, previous=previous_conditions, now=now
            ),
        )
    )


def owned_part(status: Mapping[str, Any] | None) -> dict[str, Any]:
    """The fields of a status the operator owns (to compare against a freshly computed one)."""
    return {k: v for k, v in (status or {}).items() if k in STATUS_KEYS}


def is_problem(condition: Mapping[str, Any]) -> bool:
    """A health condition False for a reason someone must act on (a Warning Event).

    ``Progressing`` never is: the component condition that holds a rollout up says it already.
    Starting up, rolling out and scaling to zero are not problems: waiting fixes them, or they are
    on purpose.
    """
    return (
        condition.get("status") == "False"
        and condition.get("type") != PROGRESSING
        and condition.get("reason") in PROBLEM_REASONS
    )


def transitions(
    previous: Mapping[str, Any] | None, current: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The Events to post: conditions whose status flipped between two statuses, and conditions
    that turn into a problem (a Warning once, however often the kubelet's reason then changes).

    A condition that first appears is no flip: a new fleet coming up posts nothing until
    something turns ready, or turns out to be a problem.
    """
    before = {c.get("type"): c for c in (previous or {}).get("conditions") or []}

    def posted(c: Mapping[str, Any]) -> bool:
        old = before.get(c["type"])
        if old is not None and old.get("status") != c["status"]:
            return True
        return is_problem(c) and (old is None or not is_problem(old))

    return [c for c in current.get("conditions") or [] if posted(c)]
