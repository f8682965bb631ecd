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
from kvretention.controller.kvstore_metrics import KvStoreReading
from kvretention.controller.resources.sglang_args import (
    EVICTION_POLICY_OVERRIDDEN,
    PLUGIN_NOT_SELECTED_REASON,
    RetentionWiring,
)
from kvretention.retention import EVICTION_POLICY

CondStatus = Literal["True", "False", "Unknown"]

WORKER_COMPONENTS: Final = ("worker", "worker-prefill", "worker-decode")

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

UNSCHEDULABLE: Final = "Unschedulable"
REPLICA_FAILURE: Final = "ReplicaFailure"
PROGRESS_DEADLINE_EXCEEDED: Final = "ProgressDeadlineExceeded"
INIT_CONTAINER_FAILED: Final = "InitContainerFailed"
CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"
CONTAINER_FAILED: Final = "ContainerFailed"
POD_FAILED: Final = "PodFailed"
ROLLING_OUT: Final = "RollingOut"
PODS_STARTING: Final = "PodsStarting"
PODS_NOT_READY: Final = "PodsNotReady"
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

IMAGE_PULL_REASONS: Final = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "ErrImageNeverPull",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
"""The kubelet's waiting reasons for an image it cannot get (kept verbatim as the reason)."""
CONTAINER_CONFIG_REASONS: Final = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreStartHookError",
        "PostStartHookError",
    }
)
"""The kubelet's waiting reasons for a container it cannot create or start (a missing Secret or
ConfigMap key, an executable not in the image, a failing hook)."""

POD_PROBLEMS: Final = frozenset(
    {
        UNSCHEDULABLE,
        "SchedulingGated",
        *IMAGE_PULL_REASONS,
        *CONTAINER_CONFIG_REASONS,
        INIT_CONTAINER_FAILED,
        CRASH_LOOP_BACK_OFF,
        CONTAINER_FAILED,
        POD_FAILED,
    }
)
PROBLEM_REASONS: Final = frozenset(
    {
        *POD_PROBLEMS,
        REPLICA_FAILURE,
        PROGRESS_DEADLINE_EXCEEDED,
        "ApplyFailed",
        "ChildConflict",
        "InvalidSpec",
        "EngineLacksKvHints",
        "EngineUnusableForHints",
        "ProbeReportInvalid",
        "OverBudget",
        *RETENTION_PROBLEMS,
    }
)
"""Reasons that need someone to act (a Warning Event); every other False is waiting or on purpose."""

_DETAIL_CHARS: Final = 300
"""How much of a kubelet or scheduler message a status message quotes."""


@dataclass(frozen=True)
class Workload:
    """One Deployment as desired and as observed."""

    name: str
    component: str
    desired: int
    selector: Mapping[str, str] = field(default_factory=dict)
    """The Deployment's ``matchLabels``: which pods are its own."""
    exists: bool = False
    replicas: int = 0
    ready: int = 0
    updated: int = 0
    available: int = 0
    current_generation: bool = False
    """The Deployment controller has seen the latest spec (observedGeneration >= generation)."""
    synced: bool = False
    """The Deployment controller has seen some spec of it (observedGeneration > 0): a newer spec
    replaces pods, it does not create the first ones."""
    replica_failure: str | None = None
    """``ReplicaFailure=True``: the ReplicaSet controller cannot create pods (quota, admission)."""
    deadline_exceeded: str | None = None
    """``Progressing=False`` with ``ProgressDeadlineExceeded``: the rollout stopped progressing."""

    @property
    def updated_all(self) -> bool:
        """Latest spec seen, every pod runs it, no old pods left (some may still be starting)."""
        return (
            self.exists
            and self.current_generation
            and self.updated >= self.desired
            and self.replicas <= self.desired
        )

    @property
    def rolled_out(self) -> bool:
        """kubectl's ``rollout status`` (and kstatus, Argo CD): every pod updated and available."""
        return self.updated_all and self.available >= self.desired

    @property
    def healthy(self) -> bool:
        return self.rolled_out and self.ready >= self.desired

    @property
    def progress(self) -> str:
        """Rollout progress, as Dynamo's rolling-update status counts it."""
        return (
            f"{self.updated}/{self.desired} updated, {self.ready}/{self.desired} ready, "
            f"{self.available}/{self.desired} available"
        )


def _deployment_condition(live: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for cond in (live.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            found: Mapping[str, Any] = cond
            return found
    return {}


def observe_workload(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> Workload:
    """Pair a desired Deployment manifest with the live object of the same name (or none)."""
    meta = desired["metadata"]
    spec = desired.get("spec") or {}
    replicas = spec.get("replicas")
    base = Workload(
        name=meta["name"],
        component=(meta.get("labels") or {}).get(COMPONENT_LABEL, ""),
        desired=1 if replicas is None else int(replicas),
        selector=dict((spec.get("selector") or {}).get("matchLabels") or {}),
    )
    if live is None:
        return base
    status = live.get("status") or {}
    generation = int((live.get("metadata") or {}).get("generation") or 0)
    observed_generation = int(status.get("observedGeneration") or 0)
    failure = _deployment_condition(live, "ReplicaFailure")
    progressing = _deployment_condition(live, "Progressing")
    return replace(
        base,
        exists=True,
        replicas=int(status.get("replicas") or 0),
        ready=int(status.get("readyReplicas") or 0),
        updated=int(status.get("updatedReplicas") or 0),
        available=int(status.get("availableReplicas") or 0),
        current_generation=observed_generation >= generation,
        synced=observed_generation > 0,
        replica_failure=(
            _clip(str(failure.get("message") or failure.get("reason") or "pods cannot be created"))
            if failure.get("status") == "True"
            else None
        ),
        deadline_exceeded=(
            _clip(str(progressing.get("message") or "the rollout stopped progressing"))
            if progressing.get("status") == "False"
            and progressing.get("reason") == PROGRESS_DEADLINE_EXCEEDED
            else None
        ),
    )


# -- pods: why a component's pods are not ready --------------------------------------------------


@dataclass(frozen=True)
class PodIssue:
    """Why one pod is not ready: a kubelet/scheduler reason and a message naming the pod."""

    reason: str
    message: str


def _clip(text: str) -> str:
    """One line of at most ``_DETAIL_CHARS`` characters (tracebacks and logs stay out of status)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= _DETAIL_CHARS else line[: _DETAIL_CHARS - 3] + "..."


def _pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


def _pod_condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            found: Mapping[str, Any] = cond
            return found
    return {}


def _containers(pod: Mapping[str, Any], *, init: bool) -> list[Mapping[str, Any]]:
    key = "initContainerStatuses" if init else "containerStatuses"
    statuses: list[Mapping[str, Any]] = (pod.get("status") or {}).get(key) or []
    return statuses


def _all_containers(pod: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [("init container", c) for c in _containers(pod, init=True)] + [
        ("container", c) for c in _containers(pod, init=False)
    ]


def _state(container: Mapping[str, Any], key: str, *, last: bool = False) -> Mapping[str, Any]:
    state: Mapping[str, Any] = (container.get("lastState" if last else "state") or {}).get(
        key
    ) or {}
    return state


def _exit(terminated: Mapping[str, Any]) -> str:
    """``exit code 1 (Error): first line of the message``."""
    text = f"exit code {terminated.get('exitCode', '?')}"
    if terminated.get("reason"):
        text += f" ({terminated['reason']})"
    message = _clip(str(terminated.get("message") or ""))
    return f"{text}: {message}" if message else text


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    return _pod_condition(pod, "Ready").get("status") == "True"


def check_pod_scheduled(pod: Mapping[str, Any]) -> PodIssue | None:
    """The scheduler found no node (its message says why, e.g. Insufficient nvidia.com/gpu)."""
    cond = _pod_condition(pod, "PodScheduled")
    if cond.get("status") != "False":
        return None
    reason = str(cond.get("reason") or UNSCHEDULABLE)
    return PodIssue(reason, _clip(str(cond.get("message") or "no node can run it")))


def check_pod_image(pod: Mapping[str, Any]) -> PodIssue | None:
    for what, c in _all_containers(pod):
        waiting = _state(c, "waiting")
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            detail = _clip(str(waiting.get("message") or f"cannot pull {c.get('image', '')}"))
            return PodIssue(str(waiting["reason"]), f"{what} {c.get('name')}: {detail}")
    return None


def check_pod_container_config(pod: Mapping[str, Any]) -> PodIssue | None:
    for what, c in _all_containers(pod):
        waiting = _state(c, "waiting")
        if waiting.get("reason") in CONTAINER_CONFIG_REASONS:
            detail = _clip(str(waiting.get("message") or waiting["reason"]))
            return PodIssue(str(waiting["reason"]), f"{what} {c.get('name')}: {detail}")
    return None


def check_pod_init_failed(pod: Mapping[str, Any]) -> PodIssue | None:
    """An init container (the capability probe) exited non-zero: the main containers never start."""
    for c in _containers(pod, init=True):
        for last in (False, True):
            terminated = _state(c, "terminated", last=last)
            if terminated and terminated.get("exitCode") not in (0, None):
                if last and not _state(c, "waiting"):
                    continue  # an old failure, now running again
                return PodIssue(
                    INIT_CONTAINER_FAILED,
                    f"init container {c.get('name')} failed, {_exit(terminated)}",
                )
    return None


def check_pod_crash_loop(pod: Mapping[str, Any]) -> PodIssue | None:
    for c in _containers(pod, init=False):
        if _state(c, "waiting").get("reason") == CRASH_LOOP_BACK_OFF:
            terminated = _state(c, "terminated", last=True)
            detail = f", last {_exit(terminated)}" if terminated else ""
            return PodIssue(CRASH_LOOP_BACK_OFF, f"container {c.get('name')} keeps exiting{detail}")
    return None


def check_pod_container_failed(pod: Mapping[str, Any]) -> PodIssue | None:
    for c in _containers(pod, init=False):
        terminated = _state(c, "terminated")
        if terminated and terminated.get("exitCode") not in (0, None):
            return PodIssue(CONTAINER_FAILED, f"container {c.get('name')} {_exit(terminated)}")
    return None


def check_pod_failed(pod: Mapping[str, Any]) -> PodIssue | None:
    """The pod itself failed (evicted, node shut down): its ReplicaSet replaces it."""
    status = pod.get("status") or {}
    if status.get("phase") != "Failed":
        return None
    detail = _clip(str(status.get("message") or ""))
    cause = str(status.get("reason") or "failed")
    return PodIssue(POD_FAILED, f"{cause}: {detail}" if detail else cause)


POD_CHECKS: Final[tuple[Callable[[Mapping[str, Any]], PodIssue | None], ...]] = (
    check_pod_scheduled,
    check_pod_image,
    check_pod_container_config,
    check_pod_init_failed,
    check_pod_crash_loop,
    check_pod_container_failed,
    check_pod_failed,
)
"""Problems waiting cannot fix, most fundamental first: across a component's not-ready pods, the
first check any pod fails names the reason."""


def describe_starting(pod: Mapping[str, Any]) -> str:
    """What a not-ready pod with no problem is doing (the kubelet is still at work)."""
    for c in _containers(pod, init=True):
        if "terminated" not in (c.get("state") or {}):
            waiting = _state(c, "waiting").get("reason")
            doing = f"({waiting})" if waiting else "running"
            return f"init container {c.get('name')} {doing}"
    for c in _containers(pod, init=False):
        if c.get("ready"):
            continue
        waiting = _state(c, "waiting").get("reason")
        if waiting:
            return f"container {c.get('name')} ({waiting})"
        if "running" in (c.get("state") or {}):
            return f"container {c.get('name')} is running, not ready yet"
    if _pod_condition(pod, "PodScheduled").get("status") == "True":
        return "scheduled, containers starting"
    return "waiting to be scheduled"


def live_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Pods not being deleted, in name order (deterministic)."""
    return sorted(
        (p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")),
        key=_pod_name,
    )


def diagnose_pods(pods: Sequence[Mapping[str, Any]]) -> PodIssue | None:
    """The first problem among not-ready pods, else what the first of them is doing, else None."""
    waiting = [p for p in live_pods(pods) if not is_pod_ready(p)]
    for check in POD_CHECKS:
        hits = [(p, issue) for p in waiting if (issue := check(p)) is not None]
        if hits:
            pod, issue = hits[0]
            more = f" (and {len(hits) - 1} more pods)" if len(hits) > 1 else ""
            return PodIssue(issue.reason, f"pod {_pod_name(pod)}: {issue.message}{more}")
    if waiting:
        return PodIssue(
            PODS_STARTING, f"pod {_pod_name(waiting[0])}: {describe_starting(waiting[0])}"
        )
    return None


def pods_of(workload: Workload, pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The pods a Deployment's selector matches (an empty selector matches none)."""
    if not workload.selector:
        return []
    return [
        p
        for p in pods
        if all(
            ((p.get("metadata") or {}).get("labels") or {}).get(k) == v
            for k, v in workload.selector.items()
        )
    ]


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


# -- checks ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """One condition's outcome before bookkeeping (generation, transition time)."""

    status: CondStatus
    reason: str
    message: str


def diagnose_workload(
    w: Workload, pods: Sequence[Mapping[str, Any]], *, what: str
) -> tuple[int, Verdict]:
    """One Deployment's chain: the rank of the first check with something to say, and its verdict.

    Ranks order components too: of several worker pools, the one whose check came first speaks.
    """
    issue = diagnose_pods(pods_of(w, pods)) if w.exists and not w.healthy else None
    problem = issue if issue is not None and issue.reason in POD_PROBLEMS else None
    doing = f"; {issue.message}" if issue is not None else ""
    chain: list[Callable[[], Verdict | None]] = [
        lambda: (
            Verdict(
                "False",
                SCALED_TO_ZERO,
                f"Deployment {w.name} is scaled to 0 replicas: no {what} serves",
            )
            if w.desired == 0
            else None
        ),
        lambda: (
            None
            if w.exists
            else Verdict("False", "NotCreated", f"Deployment {w.name} does not exist yet")
        ),
        lambda: (
            Verdict("True", "PodsReady", f"Deployment {w.name}: {w.ready}/{w.desired} ready")
            if w.healthy
            else None
        ),
        lambda: (
            Verdict(
                "False",
                REPLICA_FAILURE,
                f"Deployment {w.name} cannot create pods ({w.ready}/{w.desired} ready): "
                f"{w.replica_failure}",
            )
            if w.replica_failure
            else None
        ),
        lambda: (
            Verdict(
                "False",
                PROGRESS_DEADLINE_EXCEEDED,
                f"Deployment {w.name} ({w.progress}): {w.deadline_exceeded}{doing}",
            )
            if w.deadline_exceeded
            else None
        ),
        lambda: (
            Verdict(
                "False",
                problem.reason,
                f"Deployment {w.name} ({w.ready}/{w.desired} ready): {problem.message}",
            )
            if problem is not None
            else None
        ),
        lambda: (
            None
            if w.current_generation
            else Verdict("False", ROLLING_OUT, f"Deployment {w.name}: spec change not seen yet")
        ),
        lambda: (
            None
            if w.updated_all
            else Verdict("False", ROLLING_OUT, f"Deployment {w.name}: {w.progress}{doing}")
        ),
        lambda: Verdict(
            "False",
            PODS_STARTING if issue is not None else PODS_NOT_READY,
            f"Deployment {w.name}: {w.progress}{doing}",
        ),
    ]
    for rank, check in enumerate(chain):
        verdict = check()
        if verdict is not None:
            return rank, verdict
    raise AssertionError("the last check always speaks")  # pragma: no cover


def check_workloads(
    workloads: Sequence[Workload], pods: Sequence[Mapping[str, Any]] = (), *, what: str
) -> Verdict:
    """A component's condition: the not-ready Deployment whose check ranks first, else ready."""
    if not workloads:
        return Verdict("False", "NotDeployed", f"no {what} Deployment is desired")
    diagnosed = [diagnose_workload(w, pods, what=what) for w in workloads]
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
            _clip(
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
    """The chain: name conflicts, refused writes, a definite hints or retention failure, each
    component, a pending probe.

    Under ``hints.policy: Required`` the fleet is Ready only when SGLang accepts ``kv_hints`` and
    applies ``kv.retain`` (``RetentionApplied``); under ``Optional`` neither holds Ready back."""
    hints = verdicts[KV_HINTS_SUPPORTED]
    retention = verdicts[RETENTION_APPLIED]
    retention_required = hints_required and retention.reason != HINTS_OFF
    chain: list[Callable[[], Verdict | None]] = [
        lambda: check_conflicts(conflicts),
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
        if manifest.get("kind") != "Deployment":
            continue
        w = observe_workload(manifest, observed.deployments.get(manifest["metadata"]["name"]))
        groups.setdefault(w.component, []).append(w)
    return groups


def _count(workloads: Sequence[Workload]) -> dict[str, int]:
    """A component's pods: ready and desired, and its rollout's updated and available."""
    return {
        "ready": sum(w.ready for w in workloads),
        "desired": sum(w.desired for w in workloads),
        "updated": sum(w.updated for w in workloads),
        "available": sum(w.available for w in workloads),
    }


def _pools(
    workloads: Sequence[Workload], pods: Sequence[Mapping[str, Any]]
) -> list[WorkerPoolStatus]:
    """Each worker pool (Deployment) with its counts and the reason of its own chain."""
    out = []
    for w in workloads:
        _, verdict = diagnose_workload(w, pods, what="worker")
        out.append(
            WorkerPoolStatus(
                name=w.name,
                role=w.component,
                **_count([w]),
                reason=verdict.reason,
                message=verdict.message,
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
    verdicts = {
        FRONTEND_READY: check_workloads(groups.get("frontend", []), pods, what="frontend"),
        ROUTER_READY: check_workloads(groups.get("router", []), pods, what="router"),
        WORKERS_READY: check_workloads(workers, pods, what="worker"),
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
        PROGRESSING: check_conflicts(observed.conflicts)
        or check_applied(observed.apply_errors)
        or check_progressing([w for ws in groups.values() for w in ws], pods),
    }
    verdicts[READY] = check_ready(
        verdicts,
        hints_required=fleet.hints_required,
        apply_errors=observed.apply_errors,
        conflicts=observed.conflicts,
    )
    workers_count = _count(workers)
    optional: dict[str, Any] = {}
    endpoint = _endpoint(fleet)
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
        workers=WorkersStatus(**workers_count, pools=_pools(workers, pods)),
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
