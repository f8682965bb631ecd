"""Pure diagnosis of one workload (a Deployment) and its pods: the first thing the scheduler, the
kubelet or the ReplicaSet controller has to say about why they are not ready, as a reason and a
message. :mod:`kvretention.controller.conditions` turns these into conditions."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

from kvretention.api.names import LABEL_COMPONENT as COMPONENT_LABEL
from kvretention.api.names import LABEL_INSTANCE, LABEL_NAME

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

_DETAIL_CHARS: Final = 300
"""How much of a kubelet or scheduler message a status message quotes."""


@dataclass(frozen=True)
class Workload:
    """One Deployment as desired and as observed."""

    name: str
    component: str
    desired: int
    kind: str = "Deployment"
    """``Deployment``, or ``LeaderWorkerSet`` for a multinode pool (``desired`` counts groups)."""
    unserved: str | None = None
    """Why the workload cannot exist: the API server does not serve its kind (a CRD missing)."""
    group_size: int = 1
    """Pods per replica: a LeaderWorkerSet's group size (1 for a Deployment)."""
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


def _condition(obj: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    """The live object's ``status.conditions`` entry of ``type_`` (a Deployment's or a pod's:
    both use the same shape), or ``{}`` when it has none."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            found: Mapping[str, Any] = cond
            return found
    return {}


def _desired_replicas(spec: Mapping[str, Any], live: Mapping[str, Any] | None) -> int:
    """The desired manifest's ``replicas``; an autoscaled pool's workload is applied without
    them (its HPA sizes it), so then the live object's, or 1 before there is one."""
    replicas = spec.get("replicas")
    if replicas is not None:
        return int(replicas)
    return int(((live or {}).get("spec") or {}).get("replicas") or 1)


def observe_workload(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> Workload:
    """Pair a desired Deployment manifest with the live object of the same name (or none)."""
    meta = desired["metadata"]
    spec = desired.get("spec") or {}
    base = Workload(
        name=meta["name"],
        component=(meta.get("labels") or {}).get(COMPONENT_LABEL, ""),
        desired=_desired_replicas(spec, live),
        selector=dict((spec.get("selector") or {}).get("matchLabels") or {}),
    )
    if live is None:
        return base
    status = live.get("status") or {}
    generation = int((live.get("metadata") or {}).get("generation") or 0)
    observed_generation = int(status.get("observedGeneration") or 0)
    failure = _condition(live, "ReplicaFailure")
    progressing = _condition(live, "Progressing")
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
            clip(str(failure.get("message") or failure.get("reason") or "pods cannot be created"))
            if failure.get("status") == "True"
            else None
        ),
        deadline_exceeded=(
            clip(str(progressing.get("message") or "the rollout stopped progressing"))
            if progressing.get("status") == "False"
            and progressing.get("reason") == PROGRESS_DEADLINE_EXCEEDED
            else None
        ),
    )


LEADER_WORKER_SET: Final = "LeaderWorkerSet"
LEADER_WORKER_SET_MISSING: Final = "LeaderWorkerSetMissing"
"""A multinode pool's LeaderWorkerSet cannot be created: the LWS CRD is not installed."""
_SELECTOR_KEYS: Final = (LABEL_NAME, LABEL_INSTANCE, COMPONENT_LABEL)


def observe_group_workload(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> Workload:
    """Pair a desired LeaderWorkerSet with the live one: counts are groups, and the LWS
    controller counts a group ready only when every one of its pods is."""
    meta = desired["metadata"]
    spec = desired.get("spec") or {}
    template = (spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}
    template_labels = (template.get("metadata") or {}).get("labels") or {}
    base = Workload(
        name=meta["name"],
        component=(meta.get("labels") or {}).get(COMPONENT_LABEL, ""),
        desired=_desired_replicas(spec, live),
        kind=LEADER_WORKER_SET,
        selector={k: template_labels[k] for k in _SELECTOR_KEYS if k in template_labels},
        group_size=int((spec.get("leaderWorkerTemplate") or {}).get("size") or 1),
    )
    if live is None:
        return base
    status = live.get("status") or {}
    ready = int(status.get("readyReplicas") or 0)
    # The LWS controller writes no observedGeneration: a status it has written counts as current.
    seen = bool(status.get("conditions")) or "replicas" in status
    return replace(
        base,
        exists=True,
        replicas=int(status.get("replicas") or 0),
        ready=ready,
        updated=int(status.get("updatedReplicas") or 0),
        available=ready,
        current_generation=seen or base.desired == 0,
        synced=seen,
    )


# -- pods: why a component's pods are not ready --------------------------------------------------


@dataclass(frozen=True)
class PodIssue:
    """Why one pod is not ready: a kubelet/scheduler reason and a message naming the pod."""

    reason: str
    message: str


def clip(text: str) -> str:
    """One line of at most ``_DETAIL_CHARS`` characters (tracebacks and logs stay out of status)."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return line if len(line) <= _DETAIL_CHARS else line[: _DETAIL_CHARS - 3] + "..."


def _pod_name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name", "?"))


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
    message = clip(str(terminated.get("message") or ""))
    return f"{text}: {message}" if message else text


def is_pod_ready(pod: Mapping[str, Any]) -> bool:
    return _condition(pod, "Ready").get("status") == "True"


def check_pod_scheduled(pod: Mapping[str, Any]) -> PodIssue | None:
    """The scheduler found no node (its message says why, e.g. Insufficient nvidia.com/gpu)."""
    cond = _condition(pod, "PodScheduled")
    if cond.get("status") != "False":
        return None
    reason = str(cond.get("reason") or UNSCHEDULABLE)
    return PodIssue(reason, clip(str(cond.get("message") or "no node can run it")))


def check_pod_image(pod: Mapping[str, Any]) -> PodIssue | None:
    for what, c in _all_containers(pod):
        waiting = _state(c, "waiting")
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            detail = clip(str(waiting.get("message") or f"cannot pull {c.get('image', '')}"))
            return PodIssue(str(waiting["reason"]), f"{what} {c.get('name')}: {detail}")
    return None


def check_pod_container_config(pod: Mapping[str, Any]) -> PodIssue | None:
    for what, c in _all_containers(pod):
        waiting = _state(c, "waiting")
        if waiting.get("reason") in CONTAINER_CONFIG_REASONS:
            detail = clip(str(waiting.get("message") or waiting["reason"]))
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
    detail = clip(str(status.get("message") or ""))
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
    if _condition(pod, "PodScheduled").get("status") == "True":
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
