"""Workers first: a fleet's frontend and router take a new image only once its workers run theirs.

A frontend newer than a worker can send it a request the worker does not understand, and a
worker takes a request field it predates as absent (``PreprocessedRequest`` ignores unknown
keys): an Anthropic prefill, for one, is then rendered as a finished turn instead of continued.
An older frontend never does that: each worker release serves every earlier frontend's requests.
So when one spec change moves both sides to new images (a version bump in one edit or GitOps
commit), the worker workloads roll first, and the frontend and router Deployments keep their
running template, untouched, until every worker workload runs its new template on every pod with
none of the old pods left. Whether the new pods become ready is the workers' own condition: a
crashing worker holds nothing back. A frontend being created, or whose images do not change,
never waits. Each reconcile decides again from what the cluster shows, so an operator restarted
mid-rollout holds and releases the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from kvretention.controller.diagnosis import (
    LEADER_WORKER_SET,
    Workload,
    observe_group_workload,
    observe_workload,
)
from kvretention.controller.objects import ChildKey, child_key, component_of
from kvretention.controller.status import WORKER_COMPONENTS, WORKLOAD_KINDS

FRONT_COMPONENTS: Final = ("frontend", "router")
"""The components that send requests to the workers."""


def _pod_templates(manifest: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """A Deployment's pod spec, or a LeaderWorkerSet's leader and worker pod specs."""
    spec = manifest.get("spec") or {}
    group = spec.get("leaderWorkerTemplate")
    templates = (
        [group.get("leaderTemplate"), group.get("workerTemplate")]
        if isinstance(group, Mapping)
        else [spec.get("template")]
    )
    for template in templates:
        if isinstance(template, Mapping):
            yield template.get("spec") or {}


def images_of(manifest: Mapping[str, Any]) -> tuple[str, ...]:
    """Every container image of a workload's pod templates (init containers too), in order."""
    return tuple(
        str(container.get("image"))
        for pod in _pod_templates(manifest)
        for key in ("initContainers", "containers")
        for container in pod.get(key) or []
    )


def _observed(manifest: Mapping[str, Any], live: Mapping[str, Any] | None) -> Workload:
    if manifest.get("kind") == LEADER_WORKER_SET:
        return observe_group_workload(manifest, live)
    return observe_workload(manifest, live)


def workers_not_rolled_out(
    desired: Sequence[Mapping[str, Any]], live: Mapping[ChildKey, Mapping[str, Any]]
) -> list[str]:
    """The worker workloads that do not yet run their desired images on every pod: not created,
    not yet given their new template (this reconcile applies it), or old pods still running."""
    pending = []
    for manifest in desired:
        if (
            manifest.get("kind") not in WORKLOAD_KINDS
            or component_of(manifest) not in WORKER_COMPONENTS
        ):
            continue
        current = live.get(child_key(manifest))
        runs_it = (
            current is not None
            and images_of(current) == images_of(manifest)
            and _observed(manifest, current).updated_all
        )
        if not runs_it:
            pending.append(child_key(manifest)[1])
    return pending


def plan_workers_first(
    desired: Sequence[Mapping[str, Any]], live: Mapping[ChildKey, Mapping[str, Any]]
) -> dict[ChildKey, str]:
    """The frontend and router Deployments whose new images wait for the workers' rollout, each
    with why in words; empty when no image of theirs changes or every worker runs its own."""
    fronts = [
        m
        for m in desired
        if m.get("kind") == "Deployment"
        and component_of(m) in FRONT_COMPONENTS
        and child_key(m) in live
        and images_of(live[child_key(m)]) != images_of(m)
    ]
    if not fronts:
        return {}
    pending = workers_not_rolled_out(desired, live)
    if not pending:
        return {}
    why = (
        f"keeps its running image until {', '.join(pending)} "
        f"{'runs its' if len(pending) == 1 else 'run their'} new image on every pod "
        "(a newer frontend can ask an older worker for what it does not know)"
    )
    return {child_key(m): why for m in fronts}


def waiting_message(key: ChildKey, why: str) -> str:
    """One waiting Deployment, as status says it."""
    return f"{key[0]} {key[1]} {why}"
