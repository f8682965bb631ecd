"""Thin kopf glue: watch events in, one level-based reconcile out.

kopf watches the custom resource and the children; every event only *enqueues* the owning
``KvRetentionDeployment``. A small work queue (one in-flight reconcile per object, coalesced
triggers, backoff on failure, a periodic resync) runs the one reconcile: parse -> build -> apply
-> observe -> compute status -> write status if it changed.

Only ``@kopf.on.event`` handlers are registered, on purpose: kopf's change-detection handlers
(``on.create``/``on.update``/``on.resume``) keep their bookkeeping in the user's object
(annotations or status), and its timers and daemons add a finalizer. This operator keeps nothing in
the user's object and adds no finalizer: a re-list after a restart is enough to converge.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import kopf

from kvretention.api.models import GROUP, KIND, PLURAL, VERSION, KvRetentionDeployment, SpecError
from kvretention.controller import kube as k
from kvretention.controller.kvstore_client import read_master_metrics
from kvretention.controller.kvstore_metrics import (
    KvStoreReading,
    keep_unchanged,
    master_metrics_url,
    plan_metrics_read,
    reading_from_status,
)
from kvretention.controller.metrics import Metrics
from kvretention.controller.resources import build_children, check_spec
from kvretention.controller.resources.common import (
    APP_NAME,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    service_host,
)
from kvretention.controller.resources.mooncake import MASTER_SUFFIX, uses_mooncake
from kvretention.controller.status import (
    WORKER_COMPONENTS,
    Fleet,
    Observed,
    compute_invalid_status,
    compute_status,
    is_problem,
    owned_part,
    transitions,
)

log = logging.getLogger(__name__)

MANAGED_BY: Final = LABEL_MANAGED_BY
INSTANCE: Final = LABEL_INSTANCE
COMPONENT: Final = LABEL_COMPONENT
NAME: Final = LABEL_NAME
CR_KIND: Final = k.custom_kind(group=GROUP, version=VERSION, kind=KIND, plural=PLURAL)

Key = tuple[str, str]
"""(namespace, name) of a KvRetentionDeployment."""

CHILD_WATCH_SELECTORS: Final[tuple[tuple[tuple[str, str] | tuple[str, str, str], str], ...]] = (
    (("apps", "v1", "deployments"), f"{MANAGED_BY}={k.FIELD_MANAGER}"),
    (("v1", "services"), f"{MANAGED_BY}={k.FIELD_MANAGER}"),
    (("v1", "configmaps"), f"{MANAGED_BY}={k.FIELD_MANAGER}"),
    (("policy", "v1", "poddisruptionbudgets"), f"{MANAGED_BY}={k.FIELD_MANAGER}"),
    (("networking.k8s.io", "v1", "networkpolicies"), f"{MANAGED_BY}={k.FIELD_MANAGER}"),
    (("v1", "pods"), f"{NAME}={APP_NAME},{INSTANCE}"),
)
"""Server-side label selectors of the child watches: the API server sends only our objects, so
unrelated ConfigMaps or Pods cost the operator nothing (kopf's ``labels=`` filters client-side,
after every object in the cluster has been streamed and parsed)."""

MAX_BACKOFF_S: Final = 60.0
REFUSED_STATUSES: Final = frozenset({400, 403, 422})
"""Apply failures worth telling the user in status (RBAC, admission, a bad manifest)."""


# -- pure helpers ------------------------------------------------------------------------------


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


def owner_key(body: Mapping[str, Any]) -> Key | None:
    """The KvRetentionDeployment that owns a child: its controller reference, else its labels."""
    meta = body.get("metadata") or {}
    namespace = meta.get("namespace")
    if not namespace:
        return None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return (namespace, ref["name"])
    instance = (meta.get("labels") or {}).get(INSTANCE)
    return (namespace, instance) if instance else None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def _rv(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("resourceVersion"))


Stamp = tuple[str, str, str, str]


def stamp_of(live: Mapping[str, Any], manifest: Mapping[str, Any], *, digest: str) -> Stamp:
    """What must stay the same for ``live`` to still match ``manifest`` without asking the server.

    Objects with a ``generation`` (Deployments) are compared by it, so status updates and the
    controller's own annotations (which bump only ``resourceVersion``) cost no dry run; a hand
    edit of the spec bumps the generation, and one of our labels, annotations or owner
    references changes the metadata part. Objects without one fall back to ``resourceVersion``.
    """
    meta = _meta(live)
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


def fleet_pods_selector(name: str) -> str:
    """The label selector of every pod of fleet ``name`` (the Deployments' immutable selector
    labels, so pods made before a label change still match)."""
    return f"{NAME}={APP_NAME},{INSTANCE}={name}"


def _component(obj: Mapping[str, Any]) -> str | None:
    return (_meta(obj).get("labels") or {}).get(COMPONENT)


def backoff_delay(failures: int) -> float:
    """0.5 s, 1 s, 2 s, ... capped at a minute."""
    return float(min(MAX_BACKOFF_S, 0.5 * 2 ** max(0, failures - 1)))


def child_key(manifest: Mapping[str, Any]) -> tuple[str, str]:
    return (str(manifest["kind"]), str(manifest["metadata"]["name"]))


def is_controlled_by(child: Mapping[str, Any], uid: str) -> bool:
    refs = (child.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def conflict_message(kind: str, obj: Mapping[str, Any], *, owner: str) -> str:
    """Why a child was not created: its name is taken by an object we do not control."""
    meta = _meta(obj)
    return (
        f"{kind} {meta.get('namespace')}/{meta.get('name')} already exists and is not "
        f"controlled by {KIND} {owner}; the operator does not adopt objects it did not create: "
        "delete or rename it"
    )


def event_type(condition: Mapping[str, Any]) -> str:
    """Warning when a health condition turns False for a problem someone must act on; Normal
    otherwise (pods still starting, a rollout, a component scaled to zero on purpose)."""
    return "Warning" if is_problem(condition) else "Normal"


# -- the work queue ----------------------------------------------------------------------------


@dataclass
class WorkQueue:
    """client-go's workqueue semantics: a key is queued once, and never processed twice at once."""

    queue: asyncio.Queue[Key] = field(default_factory=asyncio.Queue)
    dirty: set[Key] = field(default_factory=set)
    processing: set[Key] = field(default_factory=set)

    def add(self, key: Key) -> None:
        if key in self.dirty:
            return
        self.dirty.add(key)
        if key not in self.processing:
            self.queue.put_nowait(key)

    def add_after(self, key: Key, delay: float) -> None:
        asyncio.get_running_loop().call_later(delay, self.add, key)

    async def get(self) -> Key:
        key = await self.queue.get()
        self.dirty.discard(key)
        self.processing.add(key)
        return key

    def done(self, key: Key) -> None:
        self.processing.discard(key)
        if key in self.dirty:
            self.queue.put_nowait(key)


# -- the reconcile -----------------------------------------------------------------------------


@dataclass
class Controller:
    """Owns the queue and the one reconcile; kopf handlers reach it through ``memo.controller``."""

    kube: k.Kube
    metrics: Metrics = field(default_factory=Metrics)
    resync_seconds: float = 60.0
    workers: int = 4
    clock: Callable[[], dt.datetime] = field(default=lambda: dt.datetime.now(dt.UTC))
    read_kvstore: Callable[..., Awaitable[KvStoreReading]] = read_master_metrics
    """Reads a managed master's /metrics (bounded, never raises); tests inject a fake."""
    hold_after_applies: int | None = None
    """Test hook: after this many applies, hold every later one forever (see ``_gate``)."""

    def __post_init__(self) -> None:
        self.queue = WorkQueue()
        self.known: set[Key] = set()
        self.failures: dict[Key, int] = {}
        self._applied: dict[tuple[str, str, str], Stamp] = {}
        """(kind, ns, name) -> the ``stamp_of`` a live object known to match what we want."""
        self._kvstore_reads: dict[Key, tuple[dt.datetime, KvStoreReading]] = {}
        """Each fleet's last read of its master's /metrics, and when (rate-limits the reads)."""
        self._applies_started = 0

    # triggers

    def observe(self, key: Key, *, deleted: bool = False) -> None:
        """A watch event about a KvRetentionDeployment."""
        if deleted:
            self.known.discard(key)
            self.failures.pop(key, None)
            self.metrics.forget_kvstore(*key)
            self._kvstore_reads.pop(key, None)
            namespace, name = key
            for memo_key in [m for m in self._applied if m[1] == namespace]:
                if memo_key[2].startswith(f"{name}-"):
                    del self._applied[memo_key]
        else:
            self.known.add(key)
            self.queue.add(key)
        self.metrics.watched_objects.set(len(self.known))

    def touch(self, key: Key | None) -> None:
        """A watch event about a child: reconcile its owner (if we know it)."""
        if key is not None and key in self.known:
            self.queue.add(key)

    # loops

    async def run(self) -> None:
        """Workers plus the resync ticker; runs until cancelled."""
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.workers):
                tg.create_task(self._worker())
            tg.create_task(self._resync())

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.resync_seconds)
            for key in sorted(self.known):
                self.queue.add(key)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._process(key)
            finally:
                self.queue.done(key)

    async def _process(self, key: Key) -> None:
        started = time.monotonic()
        try:
            result = await self.reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            failures = self.failures.get(key, 0) + 1
            self.failures[key] = failures
            delay = backoff_delay(failures)
            if isinstance(exc, kopf.TemporaryError) and exc.delay:
                delay = max(delay, float(exc.delay))
            self.metrics.errors.inc()
            self.metrics.reconciles.labels("error").inc()
            log.warning("reconcile %s/%s failed (retry in %.1fs): %s", *key, delay, exc)
            if key in self.known:
                self.queue.add_after(key, delay)
        else:
            self.failures.pop(key, None)
            self.metrics.reconciles.labels(result).inc()
        finally:
            self.metrics.reconcile_seconds.observe(time.monotonic() - started)

    async def reconcile(self, key: Key) -> str:
        """One level-based pass over one object. Returns ``ok``, ``invalid`` or ``gone``."""
        namespace, name = key
        body = await self.kube.get_or_none(CR_KIND, namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return "gone"  # owner references let the garbage collector take the children
        generation = int(body["metadata"].get("generation") or 0)
        previous = body.get("status")
        spec_only = {key_: v for key_, v in body.items() if key_ != "status"}
        try:
            cr = KvRetentionDeployment.from_k8s(spec_only)
            problems = check_spec(cr)
        except SpecError as exc:
            problems = exc.problems
        if problems:
            status = compute_invalid_status(
                generation=generation, problems=problems, previous=previous, now=self.clock()
            )
            await self._write_status(body, previous, status)
            return "invalid"

        desired = build_children(cr)
        # The master's /metrics is read alongside the applies (bounded, never raises), so a slow
        # or absent master delays nothing else.
        kvstore_read = asyncio.ensure_future(self._kvstore_reading(cr, previous))
        live = await self._list_children(namespace, name)
        uid = str(body["metadata"]["uid"])
        taken = await self._taken_names(namespace, desired, live, uid=uid)
        conflicts = [
            conflict_message(kind, obj, owner=name) for (kind, _), obj in sorted(taken.items())
        ]
        ours = [m for m in desired if child_key(m) not in taken]
        observed_deployments: dict[str, Mapping[str, Any]] = {}
        refused: list[str] = []
        # Children are independent objects: apply them concurrently (server-side apply needs no
        # order; a pod waits for its ConfigMap by itself).
        results = await asyncio.gather(
            *(self._ensure(m, live.get(child_key(m))) for m in ours), return_exceptions=True
        )
        for manifest, result in zip(ours, results, strict=True):
            current: Mapping[str, Any] | None
            if isinstance(result, k.ApiError) and result.status in REFUSED_STATUSES:
                refused.append(
                    f"{manifest['kind']} {manifest['metadata']['name']}: {result.message}"
                )
                current = live.get(child_key(manifest))
            elif isinstance(result, BaseException):
                raise result
            else:
                current = result
            if manifest["kind"] == "Deployment" and current is not None:
                observed_deployments[manifest["metadata"]["name"]] = current
        if not refused:
            await self._prune(body, desired, live)
        # Every pod of the fleet, once: worker pods carry the probe reports, and any pod that is
        # not ready says why (the scheduler's message, the kubelet's waiting reason).
        pods = await self.kube.list(k.POD, namespace, selector=fleet_pods_selector(name))
        mooncake = cr.spec.kv_store.mooncake
        fleet = Fleet(
            name=name,
            namespace=namespace,
            generation=generation,
            hints_required=cr.spec.hints.policy == "Required",
            desired=desired,
            kvstore_external=(
                mooncake.external.master_address
                if mooncake.mode == "external" and mooncake.external is not None
                else None
            ),
            retention_budget=mooncake.master.soft_pin.budget_ratio,
        )
        observed = Observed(
            deployments=observed_deployments,
            worker_pods=[p for p in pods if _component(p) in WORKER_COMPONENTS],
            pods=pods,
            apply_errors=refused,
            kvstore=await kvstore_read,
            conflicts=conflicts,
        )
        status = compute_status(fleet, observed, previous=previous, now=self.clock())
        await self._write_status(body, previous, status)
        if refused:
            # Said so in status; now fail so the queue retries with backoff.
            raise kopf.TemporaryError("the API server refused: " + "; ".join(refused))
        return "ok"

    async def _kvstore_reading(
        self, cr: KvRetentionDeployment, previous: Mapping[str, Any] | None
    ) -> KvStoreReading | None:
        """The managed master's usage: read at most every READ_INTERVAL_SECONDS per fleet."""
        mooncake = cr.spec.kv_store.mooncake
        if mooncake.mode != "managed" or not uses_mooncake(cr.spec):
            return None
        key = (cr.namespace, cr.name)
        now = self.clock()
        last = self._kvstore_reads.get(key)
        if last is not None and not plan_metrics_read(last[0], now=now):
            reading = last[1]
        else:
            url = master_metrics_url(
                host=service_host(cr, MASTER_SUFFIX), port=mooncake.master.metrics_port
            )
            reading = await self.read_kvstore(url, now=now)
            self._kvstore_reads[key] = (now, reading)
            self.metrics.observe_kvstore(
                *key, reading, budget=mooncake.master.soft_pin.budget_ratio
            )
        return keep_unchanged(reading_from_status(previous), reading)

    async def _taken_names(
        self,
        namespace: str,
        desired: list[dict[str, Any]],
        live: dict[tuple[str, str], Any],
        *,
        uid: str,
    ) -> dict[tuple[str, str], Mapping[str, Any]]:
        """Desired children whose name an object this fleet does not control already has.

        Such an object is never adopted (a server-side apply would take it over, and the garbage
        collector would delete it with the fleet): it is reported and left alone. Children our
        label selector did not list are looked up by name, so only a fleet's first reconcile (or
        one after a child was deleted) pays a read per child; ``live`` gets what was found.
        """
        missing = [m for m in desired if child_key(m) not in live]
        found = await asyncio.gather(
            *(
                self.kube.get_or_none(k.kind_of(m), namespace, str(m["metadata"]["name"]))
                for m in missing
            )
        )
        for manifest, obj in zip(missing, found, strict=True):
            if obj is not None:
                live[child_key(manifest)] = obj
        return {
            child_key(m): live[child_key(m)]
            for m in desired
            if child_key(m) in live and not is_controlled_by(live[child_key(m)], uid)
        }

    async def _list_children(self, namespace: str, name: str) -> dict[tuple[str, str], Any]:
        out: dict[tuple[str, str], Any] = {}
        for kind in k.CHILD_KINDS:
            for item in await self.kube.list(kind, namespace, selector=f"{INSTANCE}={name}"):
                out[(kind.kind, item["metadata"]["name"])] = item
        return out

    async def _ensure(
        self, manifest: Mapping[str, Any], live: Mapping[str, Any] | None
    ) -> Mapping[str, Any]:
        """Apply ``manifest`` unless the live object already is what an apply would make it."""
        kind = k.kind_of(manifest)
        meta = manifest["metadata"]
        memo_key = (kind.kind, str(meta.get("namespace")), str(meta["name"]))
        digest = manifest_hash(manifest)
        if live is not None:
            if self._applied.get(memo_key) == stamp_of(live, manifest, digest=digest):
                return live
            self.metrics.dry_runs.labels(kind.kind).inc()
            dry = await self.kube.apply(manifest, dry_run=True)
            if comparable(dry) != comparable(live) and _rv(dry) != _rv(live):
                # The listed copy is stale (e.g. the Deployment controller just annotated it).
                live = await self.kube.get_or_none(kind, str(meta.get("namespace")), meta["name"])
                live = live if live is not None else {}
            if live and comparable(dry) == comparable(live):
                self._applied[memo_key] = stamp_of(live, manifest, digest=digest)
                return live
        await self._gate(kind.kind, meta)
        result = await self.kube.apply(manifest)
        self.metrics.apply_writes.labels(kind.kind).inc()
        log.info("applied %s %s/%s", kind.kind, meta.get("namespace"), meta["name"])
        self._applied[memo_key] = stamp_of(result, manifest, digest=digest)
        return result

    async def _gate(self, kind: str, meta: Mapping[str, Any]) -> None:
        """The test hook that makes "killed mid-reconcile" deterministic.

        With ``hold_after_applies=N`` exactly N applies reach the API server; every later one
        waits forever, so a test can see N children in the cluster, know the reconcile is stuck
        half-way, and SIGKILL the process there instead of racing it.
        """
        if self.hold_after_applies is None:
            return
        if self._applies_started < self.hold_after_applies:
            self._applies_started += 1
            return
        log.warning(
            "test hook: holding the apply of %s %s/%s", kind, meta.get("namespace"), meta["name"]
        )
        await asyncio.Event().wait()

    async def _prune(
        self,
        owner: Mapping[str, Any],
        desired: list[dict[str, Any]],
        live: Mapping[tuple[str, str], Any],
    ) -> None:
        """Delete children this object controls that the spec no longer wants (mode changes)."""
        uid = str(owner["metadata"]["uid"])
        wanted = {child_key(m) for m in desired}
        for (kind_name, name), obj in sorted(live.items()):
            if (kind_name, name) in wanted or not is_controlled_by(obj, uid):
                continue
            kind = k.kind_of(obj)
            namespace = owner["metadata"]["namespace"]
            await self.kube.delete(kind, namespace, name, uid=obj["metadata"]["uid"])
            self.metrics.deletes.labels(kind_name).inc()
            log.info("deleted %s %s/%s (no longer in the spec)", kind_name, namespace, name)

    async def _write_status(
        self,
        body: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        status: dict[str, Any],
    ) -> None:
        """Apply the status subresource only when it changed; post an Event per flip."""
        if owned_part(previous) == status:
            return
        meta = body["metadata"]
        patch = {
            "apiVersion": body["apiVersion"],
            "kind": body["kind"],
            "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
            "status": status,
        }
        await self.kube.apply(patch, kind=CR_KIND, subresource="status")
        self.metrics.status_writes.inc()
        now = self.clock()
        for cond in transitions(previous, status):
            await self.kube.post_event(
                body,
                type_=event_type(cond),
                reason=cond["reason"],
                message=f"{cond['type']} is {cond['status']}: {cond['message']}",
                now=now,
            )
            self.metrics.events.inc()


# -- kopf registration -------------------------------------------------------------------------


def _controller(memo: Any) -> Controller:
    controller = memo.controller
    assert isinstance(controller, Controller)
    return controller


def build_registry() -> kopf.OperatorRegistry:
    """A fresh registry with this operator's handlers (no module-level side effects)."""
    registry = kopf.OperatorRegistry()
    managed = {MANAGED_BY: k.FIELD_MANAGER}

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # Our own Events (on condition flips) replace kopf's per-log-line events.
        settings.posting.enabled = False
        # Nothing in the user's object: keep kopf's (unused) bookkeeping out of annotations.
        settings.persistence.progress_storage = kopf.StatusProgressStorage()
        settings.persistence.diffbase_storage = kopf.StatusDiffBaseStorage()
        # The chart's RBAC grants no cluster-wide namespace/CRD listing.
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        settings.watching.connect_timeout = 10
        settings.networking.request_timeout = 60
        for resource, selector in CHILD_WATCH_SELECTORS:
            settings.watching.label_selectors[resource] = selector

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of kopf's default login handlers: in-cluster, then KUBECONFIG.
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
            **kwargs
        ) or kopf.login_with_kubeconfig(**kwargs)
        return info

    @kopf.on.event(GROUP, VERSION, PLURAL, id="kvretentiondeployment", registry=registry)
    def on_cr(event: Mapping[str, Any], body: Mapping[str, Any], memo: Any, **_: Any) -> None:
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        _controller(memo).observe(key, deleted=event.get("type") == "DELETED")

    def on_child(body: Mapping[str, Any], memo: Any, **_: Any) -> None:
        _controller(memo).touch(owner_key(body))

    kopf.on.event(
        "apps", "v1", "deployments", id="child-deployments", labels=managed, registry=registry
    )(on_child)
    kopf.on.event("v1", "services", id="child-services", labels=managed, registry=registry)(
        on_child
    )
    kopf.on.event("v1", "configmaps", id="child-configmaps", labels=managed, registry=registry)(
        on_child
    )
    kopf.on.event(
        "policy",
        "v1",
        "poddisruptionbudgets",
        id="child-poddisruptionbudgets",
        labels=managed,
        registry=registry,
    )(on_child)
    kopf.on.event(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        id="child-networkpolicies",
        labels=managed,
        registry=registry,
    )(on_child)
    # Pods are matched on their Deployment's selector labels (immutable, on every fleet pod).
    fleet_pod: dict[str, Any] = {NAME: APP_NAME, INSTANCE: kopf.PRESENT}
    kopf.on.event("v1", "pods", id="child-pods", labels=fleet_pod, registry=registry)(on_child)
    return registry
