"""Condition verdicts: small pure checks over what was observed, chained cert-manager style.

Per Deployment (or LeaderWorkerSet), the first check with something to say (the scheduler cannot
place a pod, an image cannot be pulled, the ReplicaSet controller cannot create pods, ...) names its
component's reason; across components, the first failing one names ``Ready``'s. The conditions'
reasons live here, with the set of those that need someone to act. The probe reports' own checks
are in :mod:`kvretention.controller.probe_reports`; :mod:`kvretention.controller.status` assembles
the status from both.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from kvretention.api.names import (
    FRONTEND_READY,
    KV_HINTS_SUPPORTED,
    KVSTORE_READY,
    RETENTION_APPLIED,
    ROUTER_READY,
    WORKERS_READY,
)
from kvretention.controller.diagnosis import (
    LEADER_WORKER_SET_MISSING,
    POD_PROBLEMS,
    PODS_NOT_READY,
    PODS_STARTING,
    PROGRESS_DEADLINE_EXCEEDED,
    REPLICA_FAILURE,
    ROLLING_OUT,
    SCALED_TO_ZERO,
    PodIssue,
    Workload,
    clip,
    diagnose_pods,
    live_pods,
    pods_of,
)
from kvretention.controller.kvstore_metrics import (
    GRACE_SECONDS,
    RETRY_SECONDS,
    KvStoreReading,
    KvStoreUsage,
)
from kvretention.controller.resources.sglang_args import (
    EVICTION_POLICY_OVERRIDDEN,
    PLUGIN_NOT_SELECTED_REASON,
)

CondStatus = Literal["True", "False", "Unknown"]


# -- reasons -----------------------------------------------------------------------------------


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
HOOK_FAILURES: Final = "HookFailures"
"""The plugin is applied, but workers' ``kvretention_retention_hook_failures_total`` grew since the
operator's last reading: those requests were served with their KV unretained or pages unpinned."""
AUTH_SECRET_MISSING: Final = "AuthSecretMissing"
"""A Secret ``spec.frontend.auth`` names does not exist: the frontend pods cannot mount it."""
CODEX_INSTRUCTIONS_MISSING: Final = "CodexInstructionsMissing"
"""The ConfigMap ``spec.frontend.codexInstructions`` names, or its key, does not exist: the
frontend pods cannot mount it."""
PINS_LOST: Final = "PinsLost"
"""The managed Mooncake master restarted: the soft pins written before are gone (for as long as
they could have lived; :mod:`kvretention.controller.master_restart`)."""
INFERENCE_POOL_CRD_MISSING: Final = "InferencePoolCrdMissing"
"""``spec.gateway.inferencePool`` is on and the API server does not serve InferencePools."""
INFERENCE_POOL_NOT_ACCEPTED: Final = "NotAccepted"
"""A Gateway that the InferencePool's HTTPRoute attaches to says ``Accepted=False``."""
RETENTION_PROBLEMS: Final = frozenset(
    {
        TRANSPORT_ONLY,
        HOOK_FAILURES,
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
        PINS_LOST,
        AUTH_SECRET_MISSING,
        CODEX_INSTRUCTIONS_MISSING,
        INFERENCE_POOL_CRD_MISSING,
        INFERENCE_POOL_NOT_ACCEPTED,
        *RETENTION_PROBLEMS,
    }
)
"""Reasons that need someone to act (a Warning Event); every other False is waiting or on purpose."""


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
    chain = [*_presence_checks(w, what=what, hold=hold), *_rollout_checks(w, issue)]
    for rank, check in enumerate(chain):
        verdict = check()
        if verdict is not None:
            return rank, verdict
    raise AssertionError("the last check always speaks")  # pragma: no cover


def _presence_checks(
    w: Workload, *, what: str, hold: str | None
) -> list[Callable[[], Verdict | None]]:
    """The chain's first half: whether the workload is there to serve at all, and ready."""
    return [
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
    ]


def _rollout_checks(w: Workload, issue: PodIssue | None) -> list[Callable[[], Verdict | None]]:
    """The chain's second half, for a workload that exists and is not ready: what holds its pods
    (``issue``: what its not-ready pods say) or its rollout up."""
    problem = issue if issue is not None and issue.reason in POD_PROBLEMS else None
    doing = f"; {issue.message}" if issue is not None else ""
    return [
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
    if reading.usage is None and reading.stale_since is not None:
        return Verdict(
            "Unknown",
            "NotMeasured",
            "the master's metrics have not been read yet: " + _stale_note(reading) + enforcement,
        )
    if reading.usage is None:
        return Verdict(
            "Unknown", "MetricsUnavailable", reading.error or "the master's metrics are unreadable"
        )
    verdict = _budget_verdict(reading.usage, budget=budget, enforcement=enforcement)
    if reading.stale_since is None:
        return verdict
    return Verdict(
        verdict.status,
        verdict.reason,
        f"{verdict.message}; stale: the numbers are from {reading.observed_at}, "
        + _stale_note(reading),
    )


def _stale_note(reading: KvStoreReading) -> str:
    """Why a reading is stale, and for how long that stays a note rather than a state."""
    return (
        f"reads failing since {reading.stale_since} ({reading.error}), retried every "
        f"{RETRY_SECONDS:g}s; MetricsUnavailable if they still fail after {GRACE_SECONDS:g}s"
    )


def _budget_verdict(usage: KvStoreUsage, *, budget: float | None, enforcement: str) -> Verdict:
    """Pins against the budget, from the master's numbers."""
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


def check_auth_secrets(frontend: Verdict, missing: Sequence[str], *, namespace: str) -> Verdict:
    """A frontend that is not ready while an auth Secret it mounts is missing: the Secret is why
    (its pods wait in ContainerCreating, which the kubelet reports without a reason)."""
    if frontend.status == "True" or frontend.reason == SCALED_TO_ZERO or not missing:
        return frontend
    names = ", ".join(sorted(missing))
    plural = "s" if len(missing) > 1 else ""
    return Verdict(
        "False",
        AUTH_SECRET_MISSING,
        clip(
            f"Secret{plural} {names} not found in namespace {namespace} "
            f"(spec.frontend.auth.secretRefs): the frontend pods cannot mount "
            f"{'them' if plural else 'it'} and do not start; {frontend.message}"
        ),
    )


def check_codex_instructions(frontend: Verdict, missing: str | None) -> Verdict:
    """A frontend that is not ready while the codexInstructions ConfigMap key it mounts is
    missing (``missing`` says what, in words): that is why (its pods wait in ContainerCreating)."""
    if frontend.status == "True" or frontend.reason == SCALED_TO_ZERO or missing is None:
        return frontend
    return Verdict(
        "False",
        CODEX_INSTRUCTIONS_MISSING,
        clip(
            f"{missing} (spec.frontend.codexInstructions.configMapKeyRef): the frontend pods "
            f"cannot mount it and do not start; {frontend.message}"
        ),
    )


def check_progressing(
    workloads: Sequence[Workload],
    pods: Sequence[Mapping[str, Any]] = (),
    waiting: Sequence[str] = (),
) -> Verdict:
    """The Deployment controller's verdict first (a rollout past its deadline), then rollouts still
    under way with their progress and what holds them up, and Deployments ``waiting`` for the
    workers' rollout before they take their new image; else converged."""
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
    said = ["rolling out: " + "; ".join(rolling)] if rolling else []
    if said or waiting:
        return Verdict("True", ROLLING_OUT, "; ".join([*said, *waiting]))
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


def _parent(entry: Mapping[str, Any], *, namespace: str) -> str:
    """One ``status.parents[]`` entry's parent, as ``Gateway ns/name``."""
    ref = entry.get("parentRef") or {}
    return f"{ref.get('kind') or 'Gateway'} {ref.get('namespace') or namespace}/{ref.get('name')}"


def _accepted(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """The parent's ``Accepted`` condition (empty: it has not said yet)."""
    conditions = entry.get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Accepted"), {})


def check_inference_pool(
    name: str,
    live: Mapping[str, Any] | None,
    *,
    namespace: str,
    unserved: str | None = None,
    conflict: str | None = None,
) -> Verdict:
    """``InferencePoolAccepted``: the CRD served, the pool ours and created, then what its parents
    (the Gateways its HTTPRoutes attach to) say in ``status.parents[].conditions`` Accepted.

    ``unserved``: why the pool cannot be created (the CRD is not installed); ``conflict``: its
    name is taken by an object the fleet does not control."""
    if unserved is not None:
        return Verdict("False", INFERENCE_POOL_CRD_MISSING, unserved)
    if conflict is not None:
        return Verdict("False", CHILD_CONFLICT, conflict)
    if live is None:
        return Verdict("Unknown", "NotCreated", f"InferencePool {name} does not exist yet")
    parents = (live.get("status") or {}).get("parents") or []
    if not parents:
        return Verdict(
            "Unknown",
            "NoParent",
            f"InferencePool {name} exists; no Gateway has taken it up yet (an HTTPRoute "
            "backendRef of group inference.networking.k8s.io, kind InferencePool names it)",
        )
    said = [(_parent(p, namespace=namespace), _accepted(p)) for p in parents]
    rejected = [
        f"{who}: {c.get('reason') or 'NotAccepted'}: {c.get('message') or 'no message'}"
        for who, c in said
        if c.get("status") == "False"
    ]
    if rejected:
        return Verdict(
            "False",
            INFERENCE_POOL_NOT_ACCEPTED,
            clip(f"InferencePool {name} is not accepted by " + "; ".join(rejected)),
        )
    accepted = [who for who, c in said if c.get("status") == "True"]
    pending = [who for who, c in said if c.get("status") != "True"]
    if not accepted:
        return Verdict(
            "Unknown",
            "Pending",
            f"InferencePool {name}: {', '.join(pending)} has not accepted it yet",
        )
    message = f"InferencePool {name} is accepted by {', '.join(accepted)}"
    if pending:
        message += f"; not yet by {', '.join(pending)}"
    return Verdict("True", "Accepted", message)
