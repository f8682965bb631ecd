"""Pure status: what the fleet should be plus what the cluster shows in, the CR's status out.

Observed state is gathered once (the Deployments, the fleet's pods and the probe reports of its
worker pods), then the chains of :mod:`kvretention.controller.conditions` and
:mod:`kvretention.controller.probe_reports` run, and their verdicts become the conditions, the
counts and the fields of the status. ``lastTransitionTime`` only moves when a condition's status
flips; a flip, or a condition turning into a problem, is an Event to post.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

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
    INFERENCE_POOL_ACCEPTED,
    KV_HINTS_SUPPORTED,
    KVSTORE_READY,
    OPTIONAL_CONDITION_TYPES,
    PROGRESSING,
    READY,
    RETENTION_APPLIED,
    RETENTION_BUDGET,
    ROUTER_READY,
    WORKERS_READY,
)
from kvretention.api.probe_report import DEVICES, DIALECTS, RETENTION_PLUGIN_STATES
from kvretention.controller.conditions import (
    MASTER_RESTARTING,
    PROBLEM_REASONS,
    Verdict,
    budget_enforced,
    check_applied,
    check_auth_secrets,
    check_codex_instructions,
    check_conflicts,
    check_inference_pool,
    check_kvstore,
    check_progressing,
    check_ready,
    check_retention_budget,
    check_workloads,
    diagnose_workload,
)
from kvretention.controller.diagnosis import (
    LEADER_WORKER_SET,
    Workload,
    observe_group_workload,
    observe_workload,
)
from kvretention.controller.kinds import INFERENCE_POOL
from kvretention.controller.kvstore_metrics import KvStoreReading
from kvretention.controller.master_restart import check_pins_lost, find_master_restart
from kvretention.controller.probe_reports import (
    PodReport,
    ProbeFailure,
    check_hook_failures,
    check_kv_hints,
    check_retention_applied,
    worker_reports,
)
from kvretention.controller.resources.sglang_args import RetentionWiring
from kvretention.controller.worker_metrics import HookIncrease

WORKER_COMPONENTS: Final = ("worker", "worker-prefill", "worker-decode")
WORKLOAD_KINDS: Final = frozenset({"Deployment", LEADER_WORKER_SET})
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


@dataclass(frozen=True)
class Endpoint:
    """The client-facing Service as the builders made it: its name, and the URL it serves at."""

    service: str
    url: str


@dataclass(frozen=True)
class Scale:
    """The pool the scale subresource sizes, as the builders made it."""

    workload: str
    """Its Deployment or LeaderWorkerSet: the live one's ``status.replicas`` is the count."""
    selector: str
    """``status.selector``: the pods the count is of."""


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
    longest_pin_s: float | None = None
    """``softPin.maxTtlSeconds``: how long a pin lost to a master restart is reported."""
    retention: RetentionWiring = field(default_factory=RetentionWiring)
    """Hints on or off, and a user setting that keeps the retention plugin's policy out."""
    endpoint: Endpoint | None = None
    """``status.endpoint``'s Service (None: no endpoint to advertise)."""
    scale: Scale | None = None
    """``status.replicas`` and ``status.selector``'s pool (None: no scale to report)."""
    inference_pool: str | None = None
    """The InferencePool's name (``spec.gateway.inferencePool``); None: no pool, no condition."""


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
    waiting: Sequence[str] = ()
    """Frontend and router Deployments keeping their running image until the workers run their
    new one (:mod:`~kvretention.controller.rollout_order`), in words."""
    unserved_kinds: frozenset[str] = frozenset()
    """Child kinds the API server does not serve (the LeaderWorkerSet CRD not installed)."""
    hook_failures: Sequence[HookIncrease] = ()
    """Retention hook failures the workers' metrics showed since the reading before."""
    missing_secrets: Sequence[str] = ()
    """Auth Secrets (``spec.frontend.auth.secretRefs``) the API server says do not exist."""
    missing_codex_instructions: str | None = None
    """What the API server says is missing of ``spec.frontend.codexInstructions``, in words (the
    ConfigMap, or its key); None: nothing, or not read."""
    inference_pool: Mapping[str, Any] | None = None
    """The live InferencePool (its ``status.parents`` say which Gateways accepted it)."""


# -- assembly ----------------------------------------------------------------------------------


def build_conditions(
    verdicts: Mapping[str, Verdict],
    *,
    generation: int,
    previous: Sequence[Mapping[str, Any]],
    now: dt.datetime,
) -> list[Condition]:
    """Conditions in a fixed order; a transition time moves only when the status flips. An
    optional type is written only when ``verdicts`` has one for it."""
    before = {c.get("type"): c for c in previous}
    stamp = now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    out = []
    optional = [t for t in OPTIONAL_CONDITION_TYPES if t in verdicts]
    for type_ in (*CONDITION_TYPES, *optional):
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


def inference_pool_missing_message(name: str) -> str:
    return (
        f"{INFERENCE_POOL.kind} {name} cannot be created: the API server does not serve "
        f"{INFERENCE_POOL.api_version} (the {INFERENCE_POOL.crd} CRD is not installed). Install "
        "the Gateway API Inference Extension CRDs with the cluster's Gateway, or set "
        "spec.gateway.inferencePool.enabled false; the rest of the fleet runs without it"
    )


def _inference_pool(fleet: Fleet, observed: Observed) -> Verdict:
    """``InferencePoolAccepted``'s verdict (only for a fleet that wants a pool)."""
    name = str(fleet.inference_pool)
    key = (INFERENCE_POOL.kind, name)
    unserved = INFERENCE_POOL.kind in observed.unserved_kinds
    said = f"{INFERENCE_POOL.kind} {fleet.namespace}/{name} "
    conflict = next((c for c in observed.conflicts if c.startswith(said)), None)
    return check_inference_pool(
        name,
        observed.inference_pool,
        namespace=fleet.namespace,
        unserved=inference_pool_missing_message(name) if unserved else None,
        conflict=conflict if key in observed.taken else None,
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
    if reading.stale_since is not None:
        out["staleSince"] = reading.stale_since
        out["staleReason"] = reading.error or "not read"
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
    endpoint = fleet.endpoint
    if endpoint is None or ("Service", endpoint.service) in taken:
        return None
    return endpoint.url


def _scale(fleet: Fleet, observed: Observed) -> tuple[int, str] | None:
    """The scale subresource's view: the scaled pool's live replicas and its pods' selector."""
    scale = fleet.scale
    if scale is None:
        return None
    live = observed.deployments.get(scale.workload) or {}
    return int((live.get("status") or {}).get("replicas") or 0), scale.selector


def _engine(reports: Sequence[PodReport | ProbeFailure]) -> EngineStatus | None:
    for r in reports:
        if isinstance(r, PodReport):
            report = r.report
            plugin: dict[str, Any] = {}
            if report.retention_plugin in RETENTION_PLUGIN_STATES:
                plugin["retention_plugin"] = report.retention_plugin
                plugin["hook_target_problems"] = list(report.retention_target_problems)
            if report.engine_device in DEVICES:
                plugin["device"] = report.engine_device
            return EngineStatus(
                sglang_version=report.sglang_version or "",
                dialect=report.dialect if report.dialect in DIALECTS else "none",
                kv_hints_parameter=report.kv_hints_parameter,
                storage_backends=list(report.hicache_storage_backends),
                mooncake_importable=report.mooncake_store_importable,
                **plugin,
            )
    return None


def _budget_verdict(
    fleet: Fleet,
    observed: Observed,
    master: Sequence[Workload],
    *,
    plugin: Verdict,
    now: dt.datetime,
) -> Verdict:
    """``RetentionBudget``: the pool's pins against the budget, unless a restart of the managed
    master lost them (``PinsLost`` for the longest pin after it)."""
    budget = check_retention_budget(
        observed.kvstore,
        budget=fleet.retention_budget,
        external=fleet.kvstore_external,
        enforced=budget_enforced(plugin),
    )
    restart = None if fleet.kvstore_external else find_master_restart(master, observed.pods)
    return check_pins_lost(budget, restart, now=now, longest_pin_s=fleet.longest_pin_s)


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
    # The plugin's wiring bounds pins whether or not a hook failed lately (the budget's note).
    plugin = check_retention_applied(reports, fleet.retention)
    verdicts = {
        FRONTEND_READY: check_codex_instructions(
            check_auth_secrets(
                check_workloads(groups.get("frontend", []), pods, what="frontend", held=held),
                observed.missing_secrets,
                namespace=fleet.namespace,
            ),
            observed.missing_codex_instructions,
        ),
        ROUTER_READY: check_workloads(groups.get("router", []), pods, what="router", held=held),
        WORKERS_READY: check_workloads(workers, pods, what="worker", held=held),
        KVSTORE_READY: check_kvstore(
            master, pods, external=fleet.kvstore_external, was_restarting=was_restarting
        ),
        KV_HINTS_SUPPORTED: check_kv_hints(reports),
        RETENTION_APPLIED: check_hook_failures(plugin, observed.hook_failures),
        RETENTION_BUDGET: _budget_verdict(fleet, observed, master, plugin=plugin, now=now),
        PROGRESSING: check_conflicts(observed.conflicts, [*observed.held.values()])
        or check_applied(observed.apply_errors)
        or check_progressing([w for ws in groups.values() for w in ws], pods, observed.waiting),
    }
    if fleet.inference_pool is not None:
        verdicts[INFERENCE_POOL_ACCEPTED] = _inference_pool(fleet, observed)
    verdicts[READY] = check_ready(
        verdicts,
        hints_required=fleet.hints_required,
        apply_errors=observed.apply_errors,
        conflicts=observed.conflicts,
        held=[*observed.held.values()],
    )
    workers_count = _count(workers)
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
                **_budget_enforcement(fleet.retention_budget, budget_enforced(plugin)),
            }
        ),
        workers_ready=f"{workers_count['ready']}/{workers_count['desired']}",
        **_optional(fleet, observed, reports),
    )
    return _written(status)


def _optional(
    fleet: Fleet, observed: Observed, reports: Sequence[PodReport | ProbeFailure]
) -> dict[str, Any]:
    """The fields a status carries only once known: the endpoint, the engine, the scale."""
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
    return optional


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
