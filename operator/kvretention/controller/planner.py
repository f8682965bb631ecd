"""Pure decisions of the reconcile: from the custom resource and what the cluster shows, what to
apply, what to prune, which names are taken, and what status and Events to write.

Nothing here does I/O; :mod:`kvretention.controller.executor` gathers the observed state, calls
these ``plan_*`` functions and carries their plans out through :mod:`kvretention.controller.kube`
(kubernetes-sigs/lws keeps its ``planner.go`` apart from the executor the same way).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from kvretention.api.models import KIND, KvRetentionDeployment, SpecError
from kvretention.api.names import FIELD_MANAGER, FRONTEND_READY
from kvretention.api.names import MANIFEST_HASH_ANNOTATION as HASH_ANNOTATION
from kvretention.controller.kvstore_metrics import master_metrics_url
from kvretention.controller.objects import (
    ChildKey,
    Key,
    Stamp,
    child_key,
    component_of,
    is_controlled_by,
    meta_of,
    resource_version,
    uid_of,
)
from kvretention.controller.resources import (
    build_children,
    check_spec,
    frontend_endpoint,
    scale_selector,
    scaled_workload,
)
from kvretention.controller.resources.common import child_name, service_host
from kvretention.controller.resources.frontend import FRONTEND_SUFFIX
from kvretention.controller.resources.hop_key import HOP_KEY_SUFFIX, hop_key_secret
from kvretention.controller.resources.inference_pool import inference_pool_name
from kvretention.controller.resources.mooncake import MASTER_SUFFIX, uses_mooncake
from kvretention.controller.resources.sglang_args import plan_retention
from kvretention.controller.status import (
    WORKER_COMPONENTS,
    Endpoint,
    Fleet,
    Scale,
    is_problem,
    owned_part,
    transitions,
)

REFUSED_STATUSES: Final = frozenset({400, 403, 422})
"""Apply failures worth telling the user in status (RBAC, admission, a bad manifest)."""


# -- small pure helpers ------------------------------------------------------------------------


def manifest_hash(manifest: Mapping[str, Any]) -> str:
    """A stable digest of a desired manifest (key order does not matter)."""
    canonical = json.dumps(manifest, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object minus status and the fields every write bumps: what an apply could change."""
    out = copy.deepcopy(dict(obj))
    out.pop("status", None)
    meta = out.get("metadata") or {}
    for key in ("managedFields", "resourceVersion"):
        meta.pop(key, None)
    return out


def conflict_message(kind: str, obj: Mapping[str, Any], *, owner: str) -> str:
    """Why a child was not created: its name is taken by an object we do not control."""
    meta = meta_of(obj)
    return (
        f"{kind} {meta.get('namespace')}/{meta.get('name')} already exists and is not "
        f"controlled by {KIND} {owner}; the operator does not adopt objects it did not create: "
        "delete or rename it"
    )


def event_type(condition: Mapping[str, Any]) -> str:
    """Warning when a health condition turns False for a problem someone must act on; Normal
    otherwise (pods still starting, a rollout, a component scaled to zero on purpose)."""
    return "Warning" if is_problem(condition) else "Normal"


def stamp_of(live: Mapping[str, Any], manifest: Mapping[str, Any], *, digest: str) -> Stamp:
    """What must stay the same for ``live`` to still match ``manifest`` without asking the server.

    Objects with a ``generation`` (Deployments) are compared by it, so status updates and the
    controller's own annotations (which bump only ``resourceVersion``) cost no dry run; a hand
    edit of the spec bumps the generation, and one of our labels, annotations or owner
    references changes the metadata part. Objects without one fall back to ``resourceVersion``.
    """
    meta = meta_of(live)
    generation = meta.get("generation")
    version = f"g{generation}" if generation is not None else f"rv{meta.get('resourceVersion')}"
    want = manifest.get("metadata") or {}
    ours = {
        "labels": {key: (meta.get("labels") or {}).get(key) for key in want.get("labels") or {}},
        "annotations": {
            key: (meta.get("annotations") or {}).get(key) for key in want.get("annotations") or {}
        },
        "ownerReferences": meta.get("ownerReferences") or [],
    }
    return (str(meta.get("uid")), version, digest, manifest_hash(ours))


# -- the manifest-hash annotation ----------------------------------------------------------------


def with_manifest_hash(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest as applied: the built one plus the annotation with its own hash."""
    out = copy.deepcopy(dict(manifest))
    meta = out.setdefault("metadata", {})
    meta["annotations"] = {
        **(meta.get("annotations") or {}),
        HASH_ANNOTATION: manifest_hash(manifest),
    }
    return out


def _foreign_fields(entry: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    """Whether a managedFields entry of another manager touches anything an apply of ``ours``
    could have set: any field outside ``metadata.annotations``, or one of our own annotations.
    (The Deployment controller's ``deployment.kubernetes.io/revision`` is not ours.)"""
    fields = entry.get("fieldsV1") or {}
    if set(fields) - {"f:metadata"}:
        return True
    metadata = fields.get("f:metadata") or {}
    if set(metadata) - {"f:annotations"}:
        return True
    annotations = set(metadata.get("f:annotations") or {})
    return bool(annotations & {f"f:{key}" for key in ours})


def trusted_by_annotation(live: Mapping[str, Any], manifest: Mapping[str, Any]) -> bool:
    """Whether ``live`` is what applying ``manifest`` (as :func:`with_manifest_hash` made it)
    would leave, without asking the API server: what a restarted operator relies on.

    True when the object carries the annotation with this manifest's hash and no other field
    manager has written anything an apply would set (a ``kubectl scale``, an edited image or one
    of our labels each leave a managedFields entry of their own). Status and other subresources
    the operator never writes are not looked at.
    """
    meta = meta_of(live)
    want = manifest.get("metadata") or {}
    wanted_hash = (want.get("annotations") or {}).get(HASH_ANNOTATION)
    if wanted_hash is None or (meta.get("annotations") or {}).get(HASH_ANNOTATION) != wanted_hash:
        return False
    entries = meta.get("managedFields") or []
    if not any(
        e.get("manager") == FIELD_MANAGER and e.get("operation") == "Apply" for e in entries
    ):
        return False
    ours = (want.get("annotations") or {}).keys()
    return not any(
        _foreign_fields(e, dict.fromkeys(ours))
        for e in entries
        if e.get("manager") != FIELD_MANAGER and e.get("subresource", "") != "status"
    )


# -- plans -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class InvalidPlan:
    """The spec can never work: write ``Ready=False/InvalidSpec``, touch no child."""

    generation: int
    problems: Sequence[str]


@dataclass(frozen=True)
class FleetPlan:
    """A valid spec: the parsed resource, its children as they are applied, and the status inputs."""

    cr: KvRetentionDeployment
    uid: str
    desired: Sequence[dict[str, Any]]
    fleet: Fleet
    master_metrics_url: str | None = None
    """The managed Mooncake master's /metrics (its Service's metrics port); None without one."""
    auth_secrets: tuple[str, ...] = ()
    """The Secrets ``spec.frontend.auth`` names (in the fleet's namespace): the frontend mounts
    them, so one that is missing keeps its pods from starting."""
    hop_key_secret: str | None = None
    """The fleet's hop-key Secret (auth fleets): created with a random key when absent, never
    rewritten (:mod:`kvretention.controller.resources.hop_key`)."""
    codex_instructions: tuple[str, str] | None = None
    """The (ConfigMap, key) ``spec.frontend.codexInstructions`` names: the frontend mounts the key,
    so a ConfigMap or key that is missing keeps its pods from starting."""

    @property
    def key(self) -> Key:
        """The fleet's (namespace, name), as the controller files it."""
        return (self.cr.namespace, self.cr.name)


def plan_fleet(body: Mapping[str, Any]) -> InvalidPlan | FleetPlan:
    """Parse and check the custom resource, and build every child it wants (pure builders)."""
    generation = int(meta_of(body).get("generation") or 0)
    spec_only = {key: v for key, v in body.items() if key != "status"}
    try:
        cr = KvRetentionDeployment.from_k8s(spec_only)
        problems = check_spec(cr)
    except SpecError as exc:
        problems = exc.problems
    if problems:
        return InvalidPlan(generation=generation, problems=problems)
    desired = [with_manifest_hash(m) for m in build_children(cr)]
    mooncake = cr.spec.kv_store.mooncake
    fleet = Fleet(
        name=cr.name,
        namespace=cr.namespace,
        generation=generation,
        hints_required=cr.spec.hints.policy == "Required",
        desired=desired,
        kvstore_external=(
            mooncake.external.master_address
            if mooncake.mode == "external" and mooncake.external is not None
            else None
        ),
        retention_budget=mooncake.master.soft_pin.budget_ratio,
        longest_pin_s=mooncake.master.soft_pin.max_ttl_seconds,
        retention=plan_retention(cr.spec),
        endpoint=Endpoint(service=child_name(cr, FRONTEND_SUFFIX), url=frontend_endpoint(cr)),
        scale=Scale(workload=scaled_workload(cr), selector=scale_selector(cr)),
        inference_pool=(
            inference_pool_name(cr) if cr.spec.gateway.inference_pool.enabled else None
        ),
    )
    metrics_url = (
        master_metrics_url(host=service_host(cr, MASTER_SUFFIX), port=mooncake.master.metrics_port)
        if mooncake.mode == "managed" and uses_mooncake(cr.spec)
        else None
    )
    auth = cr.spec.frontend.auth
    return FleetPlan(
        cr=cr,
        uid=uid_of(body),
        desired=desired,
        fleet=fleet,
        master_metrics_url=metrics_url,
        auth_secrets=tuple(ref.name for ref in auth.secret_refs) if auth is not None else (),
        hop_key_secret=hop_key_secret(cr),
        codex_instructions=(
            (codex.config_map_key_ref.name, codex.config_map_key_ref.key)
            if (codex := cr.spec.frontend.codex_instructions) is not None
            else None
        ),
    )


def plan_secret_reads(plan: FleetPlan, previous: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The auth Secrets to look up this reconcile: all of them while the frontend is not known to
    be ready (the first reconcile, or a previous status that says it is not), none once it is. A
    missing Secret only matters while it keeps frontend pods from starting, and a fleet at rest
    then reads nothing."""
    return () if _frontend_ready(previous) else plan.auth_secrets


def plan_codex_read(plan: FleetPlan, previous: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """The codexInstructions (ConfigMap, key) to look up this reconcile: as the auth Secrets,
    only while the frontend is not known to be ready."""
    return None if _frontend_ready(previous) else plan.codex_instructions


def _frontend_ready(previous: Mapping[str, Any] | None) -> bool:
    """Whether the previous status says the frontend is ready."""
    conditions = (previous or {}).get("conditions") or []
    return any(c.get("type") == FRONTEND_READY and c.get("status") == "True" for c in conditions)


def plan_hop_key(
    plan: FleetPlan, previous: Mapping[str, Any] | None, *, ensured: bool
) -> str | None:
    """The hop-key Secret to create if it is absent this reconcile: the first time the operator
    sees the fleet (``ensured``: it made sure of it since it started), then again only while the
    frontend is not known to be ready (a deleted Secret keeps new pods from starting)."""
    if ensured and _frontend_ready(previous):
        return None
    return plan.hop_key_secret


def plan_hop_key_retired(plan: FleetPlan, live: Mapping[ChildKey, Mapping[str, Any]]) -> str | None:
    """The hop-key Secret to delete once this reconcile's children are applied: the fleet signs
    nothing now (no auth) while its live frontend Deployment still mounts the key, so auth was
    just turned off. Whether the Secret is the fleet's own to delete is read on the Secret."""
    if plan.hop_key_secret is not None:
        return None
    frontend = live.get(("Deployment", child_name(plan.cr, FRONTEND_SUFFIX)))
    if frontend is None or not is_controlled_by(frontend, plan.uid):
        return None
    name = child_name(plan.cr, HOP_KEY_SUFFIX)
    volumes = frontend.get("spec", {}).get("template", {}).get("spec", {}).get("volumes") or []
    mounted = any((v.get("secret") or {}).get("secretName") == name for v in volumes)
    return name if mounted else None


def plan_lookups(
    desired: Sequence[Mapping[str, Any]], live: Mapping[ChildKey, Any]
) -> list[Mapping[str, Any]]:
    """Desired children the operator's watches do not show: they must be read by name before
    anything is applied, in case an object it did not create has the name."""
    return [m for m in desired if child_key(m) not in live]


def plan_conflicts(
    desired: Sequence[Mapping[str, Any]], live: Mapping[ChildKey, Mapping[str, Any]], *, uid: str
) -> dict[ChildKey, Mapping[str, Any]]:
    """Desired children whose name an object this fleet does not control already has.

    Such an object is never adopted (a server-side apply would take it over, and the garbage
    collector would delete it with the fleet): it is reported and left alone.
    """
    return {
        child_key(m): live[child_key(m)]
        for m in desired
        if child_key(m) in live and not is_controlled_by(live[child_key(m)], uid)
    }


@dataclass(frozen=True)
class Reference:
    """One child naming another: ``how`` says in words how (``mounts``, ``calls``, ...)."""

    how: str
    target: ChildKey


_POD_REFERENCES: Final = (
    # (path inside a pod spec, the kind it names, how)
    (("volumes", "*", "configMap", "name"), "ConfigMap", "mounts"),
    (("volumes", "*", "secret", "secretName"), "Secret", "mounts"),
    (("volumes", "*", "projected", "sources", "*", "configMap", "name"), "ConfigMap", "mounts"),
    (("volumes", "*", "projected", "sources", "*", "secret", "name"), "Secret", "mounts"),
    (
        ("volumes", "*", "persistentVolumeClaim", "claimName"),
        "PersistentVolumeClaim",
        "mounts",
    ),
    (("serviceAccountName",), "ServiceAccount", "runs as"),
    *(
        (
            (containers, "*", "env", "*", "valueFrom", key, "name"),
            kind,
            "reads its environment from",
        )
        for containers in ("initContainers", "containers")
        for key, kind in (("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret"))
    ),
    *(
        ((containers, "*", "envFrom", "*", key, "name"), kind, "reads its environment from")
        for containers in ("initContainers", "containers")
        for key, kind in (("configMapRef", "ConfigMap"), ("secretRef", "Secret"))
    ),
)
"""Where a pod spec names another object of its namespace."""


def _at(obj: Any, path: Sequence[str]) -> list[Any]:
    """The values at ``path`` (``*``: every item of a list)."""
    if not path:
        return [obj]
    head, rest = path[0], path[1:]
    if head == "*":
        return [v for item in obj if isinstance(obj, list) for v in _at(item, rest)]
    if isinstance(obj, Mapping) and head in obj:
        return _at(obj[head], rest)
    return []


def _pod_specs(obj: Any) -> list[Mapping[str, Any]]:
    """Every pod spec in a manifest (a Deployment's template, each template of a group kind)."""
    if isinstance(obj, Mapping):
        if isinstance(obj.get("containers"), list):
            return [obj]
        return [s for v in obj.values() for s in _pod_specs(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _pod_specs(v)]
    return []


def _strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, Mapping):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def _addressed(manifest: Mapping[str, Any]) -> list[str]:
    """The strings of a manifest that can hold a Service's address: a container's command, args
    and env values, a ConfigMap's data (never labels or selectors)."""
    if manifest.get("kind") == "ConfigMap":
        return _strings(manifest.get("data") or {})
    out = []
    for pod in _pod_specs(manifest.get("spec") or {}):
        for container in [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]:
            out += _strings(container.get("command") or [])
            out += _strings(container.get("args") or [])
            out += [str(e["value"]) for e in container.get("env") or [] if "value" in e]
    return out


def _calls(service: str, text: str) -> bool:
    """Whether ``text`` addresses ``service`` by its DNS name (``svc``, ``svc.ns.svc``,
    ``http://svc:80``): the name not glued to a longer name on either side."""
    return re.search(rf"(?<![\w.-]){re.escape(service)}(?![\w-])", text) is not None


def references(manifest: Mapping[str, Any], children: Sequence[ChildKey]) -> list[Reference]:
    """The other children (of ``children``) that ``manifest`` names: what its pods mount, read
    their environment from or run as, and the Services its containers or data address."""
    found: list[Reference] = []
    names = {key for key in children if key != child_key(manifest)}
    for pod in _pod_specs(manifest.get("spec") or {}):
        for path, kind, how in _POD_REFERENCES:
            for name in _at(pod, path):
                if (kind, str(name)) in names:
                    found.append(Reference(how, (kind, str(name))))
    texts = _addressed(manifest)
    for kind, name in sorted(names):
        if kind == "Service" and any(_calls(name, t) for t in texts):
            found.append(Reference("addresses", (kind, name)))
    return list(dict.fromkeys(found))


def plan_holds(
    desired: Sequence[Mapping[str, Any]], taken: Mapping[ChildKey, Any]
) -> dict[ChildKey, str]:
    """Children that must not be created or updated while a name they depend on is taken.

    A child that names a taken object (a worker mounting a foreign ConfigMap, a router calling a
    foreign Service) would hand the fleet's traffic or configuration to whoever made it; so would
    a child that names a held one (the ConfigMap that addresses a foreign master Service). Each
    held child maps to why, in words; a taken child itself is not held (it is never written).
    """
    keys = [child_key(m) for m in desired]
    refs = {child_key(m): references(m, keys) for m in desired}
    why: dict[ChildKey, str] = {}
    changed = True
    while changed:
        changed = False
        for key in keys:
            if key in taken or key in why:
                continue
            for ref in refs[key]:
                kind, name = ref.target
                if ref.target in taken:
                    why[key] = f"{ref.how} {kind} {name}, which is taken"
                elif ref.target in why:
                    why[key] = f"{ref.how} {kind} {name}, which {why[ref.target]}"
                else:
                    continue
                changed = True
                break
    return {key: why[key] for key in keys if key in why}


def held_message(key: ChildKey, why: str) -> str:
    """One held child, as status says it."""
    return f"{key[0]} {key[1]} is not created or updated until the conflict is gone: it {why}"


ChildAction = Literal["keep", "verify", "apply"]


def plan_child(
    manifest: Mapping[str, Any], live: Mapping[str, Any] | None, *, remembered: Stamp | None
) -> ChildAction:
    """What one child needs: ``keep`` (the live object is known to match), ``verify`` (a dry-run
    apply decides), or ``apply`` (it does not exist)."""
    if live is None:
        return "apply"
    if remembered is not None:
        digest = manifest_hash(manifest)
        return "keep" if remembered == stamp_of(live, manifest, digest=digest) else "verify"
    return "keep" if trusted_by_annotation(live, manifest) else "verify"


def plan_after_dry_run(dry: Mapping[str, Any], live: Mapping[str, Any]) -> Literal["keep", "apply"]:
    """A dry-run apply that leaves the object as it is means nothing to write."""
    return "keep" if comparable(dry) == comparable(live) else "apply"


def dry_run_saw_stale_copy(dry: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """The dry run came back from a newer object than the copy the reconcile holds (e.g. the
    Deployment controller just annotated it): re-read before deciding."""
    return comparable(dry) != comparable(live) and resource_version(dry) != resource_version(live)


@dataclass(frozen=True)
class Prune:
    kind: str
    name: str
    uid: str
    api_version: str


def plan_prune(
    desired: Sequence[Mapping[str, Any]], live: Mapping[ChildKey, Mapping[str, Any]], *, uid: str
) -> list[Prune]:
    """Children this fleet controls that the spec no longer wants (mode changes), in name order."""
    wanted = {child_key(m) for m in desired}
    return [
        Prune(kind=kind, name=name, uid=uid_of(obj), api_version=str(obj.get("apiVersion")))
        for (kind, name), obj in sorted(live.items())
        if (kind, name) not in wanted and is_controlled_by(obj, uid)
    ]


def refused_message(manifest: Mapping[str, Any], message: str) -> str:
    return f"{manifest['kind']} {manifest['metadata']['name']}: {message}"


def worker_pods(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The fleet's worker pods: those that carry probe reports."""
    return [p for p in pods if component_of(p) in WORKER_COMPONENTS]


@dataclass(frozen=True)
class StatusPlan:
    """Whether to write the status subresource, and the Events its condition flips post."""

    write: bool
    events: Sequence[Mapping[str, Any]] = field(default_factory=tuple)


def plan_status(previous: Mapping[str, Any] | None, status: Mapping[str, Any]) -> StatusPlan:
    """Write only a status that differs from the stored one; one Event per real transition."""
    if owned_part(previous) == status:
        return StatusPlan(write=False)
    return StatusPlan(write=True, events=tuple(transitions(previous, status)))


def status_patch(body: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
    """The server-side apply body of the status subresource."""
    meta = body["metadata"]
    return {
        "apiVersion": body["apiVersion"],
        "kind": body["kind"],
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "status": dict(status),
    }


def event_message(condition: Mapping[str, Any]) -> str:
    return f"{condition['type']} is {condition['status']}: {condition['message']}"
