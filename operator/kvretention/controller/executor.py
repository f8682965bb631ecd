"""The executor: runs the work queue and carries out the planner's decisions.

A reconcile reads one fleet from kopf's indexes (:mod:`kvretention.controller.cache`; no request
at all when nothing changed), asks :mod:`kvretention.controller.planner` what to do, and does only
that through :mod:`kvretention.controller.kube`: the applies and dry runs the plan calls for, the
prunes, the status write and its Events.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import ChainMap
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

from kvretention.api.names import fleet_pods_selector
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller import named_objects as named
from kvretention.controller.cache import (
    CR_KIND,
    AppliedState,
    IndexedView,
    ListedView,
    OwnWrites,
    Relists,
    Snapshot,
    Tombstones,
)
from kvretention.controller.kvstore_client import read_master_metrics, read_worker_failures
from kvretention.controller.kvstore_metrics import (
    READ_INTERVAL_SECONDS,
    KvStoreReading,
    plan_metrics_read,
    plan_read_interval,
    plan_reading,
    reading_from_status,
)
from kvretention.controller.metrics import Metrics
from kvretention.controller.objects import ChildKey, Key, child_key, uid_of
from kvretention.controller.planner import (
    REFUSED_STATUSES,
    FleetPlan,
    InvalidPlan,
    Prune,
    conflict_message,
    dry_run_saw_stale_copy,
    event_message,
    event_type,
    held_message,
    manifest_hash,
    plan_after_dry_run,
    plan_child,
    plan_conflicts,
    plan_fleet,
    plan_holds,
    plan_lookups,
    plan_prune,
    plan_status,
    refused_message,
    stamp_of,
    status_patch,
    worker_pods,
)
from kvretention.controller.rollout_order import plan_workers_first, waiting_message
from kvretention.controller.status import (
    WORKLOAD_KINDS,
    Observed,
    compute_invalid_status,
    compute_status,
)
from kvretention.controller.worker_metrics import (
    SCRAPES_AT_ONCE,
    FleetFailures,
    PodFailures,
    plan_failures,
    scrape_targets,
)
from kvretention.controller.workqueue import WorkQueue, backoff_delay

log = logging.getLogger(__name__)
T = TypeVar("T")
UNSERVED_RETRY_S: Final = 30.0
"""How soon a fleet whose child kind is not served (the LWS CRD missing) is reconciled again."""


@dataclass(frozen=True)
class _SideReads:
    """The reads a reconcile runs alongside its applies (metrics, Secrets); each never raises."""

    kvstore: asyncio.Future[KvStoreReading | None]
    failures: asyncio.Future[FleetFailures]
    secrets: asyncio.Future[list[str]]
    codex: asyncio.Future[str | None]

    def cancel(self) -> None:
        for read in (self.kvstore, self.failures, self.secrets, self.codex):
            read.cancel()


async def _outcome(call: Awaitable[T]) -> T | Exception:
    """The result of ``call``, or the exception it raised, as a value.

    Concurrent calls go through this so no task of the executor ever ends with an exception:
    when kopf stops, it re-raises the exception of every task in the loop that ended with one
    (not only its own), which would turn a refused apply in flight at SIGTERM into exit status 1.
    """
    try:
        return await call
    except Exception as exc:
        return exc


@dataclass
class _Applies:
    """What the applies of one reconcile showed: the workloads, the InferencePool, the refusals
    and the kinds the API server does not serve."""

    deployments: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    inference_pool: Mapping[str, Any] | None = None
    refused: list[str] = field(default_factory=list)
    unserved: set[str] = field(default_factory=set)


def _read_applies(
    ours: Sequence[Mapping[str, Any]],
    results: Sequence[Mapping[str, Any] | BaseException],
    live: Mapping[ChildKey, Mapping[str, Any]],
) -> _Applies:
    """Sort each apply's result; an error that is neither a refusal nor an unserved kind raises."""
    applies = _Applies()
    for manifest, result in zip(ours, results, strict=True):
        current: Mapping[str, Any] | None
        if isinstance(result, k.ApiError) and result.status in REFUSED_STATUSES:
            applies.refused.append(refused_message(manifest, result.said))
            current = live.get(child_key(manifest))
        elif isinstance(result, k.NotFound) and kinds.kind_of(manifest) in kinds.OPTIONAL_KINDS:
            applies.unserved.add(str(manifest["kind"]))  # its CRD is not installed: status says so
            current = None
        elif isinstance(result, BaseException):
            raise result
        else:
            current = result
        if manifest["kind"] in WORKLOAD_KINDS and current is not None:
            applies.deployments[manifest["metadata"]["name"]] = current
        if kinds.kind_of(manifest) is kinds.INFERENCE_POOL:
            applies.inference_pool = current  # its status.parents: which Gateways accepted it
    return applies


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
    read_worker: Callable[..., Awaitable[PodFailures]] = read_worker_failures
    """Reads one worker pod's hook failure counts (bounded, never raises); tests inject a fake."""
    indices: Mapping[str, Any] | None = None
    """kopf's index of the fleets plus ``children`` (bound by the first handler call); None:
    read from the API server."""
    children: Mapping[str, Any] | None = None
    """The informers' indexes of the children and pods (:mod:`~kvretention.controller.informer`)."""
    synced: Callable[[], Awaitable[None]] | None = None
    """Returns once every informer has listed: no reconcile reads a half-filled index."""

    def __post_init__(self) -> None:
        self.queue: WorkQueue[Key] = WorkQueue()
        self.known: set[Key] = set()
        self.failures: dict[Key, int] = {}
        self.applied = AppliedState()
        self.own_writes = OwnWrites()
        self.relists = Relists()
        self.tombstones = Tombstones()
        self._verified: dict[Key, int] = {}
        """Per fleet, the re-list count it was last checked against the API server at."""
        self._uids: dict[Key, str] = {}
        self._kvstore_reads: dict[Key, tuple[dt.datetime, KvStoreReading]] = {}
        """Each fleet's last read of its master's /metrics, and when (rate-limits the reads)."""
        self._worker_reads: dict[Key, tuple[dt.datetime, FleetFailures]] = {}
        """Each fleet's last read of its workers' hook failures, and when (the baseline of the
        next read's increases, and its rate limit)."""
        self._hop_keys: set[tuple[str, str]] = set()
        """(fleet uid, Secret) of the hop keys made sure of since the operator started."""
        self._hop_key_retries: set[tuple[str, str]] = set()
        """(fleet uid, Secret) of hop keys of fleets without auth whose delete failed: tried
        again on the fleet's next reconciles."""
        self.terminating: set[str] = set()
        """Namespaces being deleted: nothing is applied there (every create would be refused)
        until the last fleet in one is gone (a namespace of that name made later is new)."""

    # triggers

    def bind(self, indices: Mapping[str, Any]) -> None:
        """Read from kopf's indexes (kopf passes them to every handler) and the informers' from
        now on."""
        if self.indices is None:
            # A view, not a copy: an index read at bind time would be frozen there.
            self.indices = ChainMap(cast(Any, indices), cast(Any, self.children or {}))

    def observe(self, key: Key, *, deleted: bool = False, uid: str | None = None) -> None:
        """A watch event about a KvRetentionDeployment."""
        if deleted:
            self.known.discard(key)
            self.failures.pop(key, None)
            self.metrics.forget_kvstore(*key)
            self.metrics.forget_conditions(*key)
            self._kvstore_reads.pop(key, None)
            self._worker_reads.pop(key, None)
            self._verified.pop(key, None)
            owner = uid or self._uids.get(key)
            if owner is not None:
                self.applied.forget_owner(owner)
                self.own_writes.forget(owner)
                self._hop_key_retries = {r for r in self._hop_key_retries if r[0] != owner}
            if owner is None or self._uids.get(key) == owner:
                self._uids.pop(key, None)
            if not any(ns == key[0] for ns, _ in self.known):
                self.terminating.discard(key[0])
        else:
            self.known.add(key)
            self.queue.add(key)
        self.metrics.watched_objects.set(len(self.known))

    def touch(self, key: Key | None) -> None:
        """A watch event about a child: reconcile its owner (if we know it)."""
        if key is not None and key in self.known:
            self.queue.add(key)

    def informed(self, owner: Key | None, uid: str, event_type: str | None) -> None:
        """An informer's event about a child or pod (``event_type`` None: after a re-list)."""
        if event_type == "DELETED":
            self.own_writes.forget(uid)
        self.touch(owner)

    def saw(self, plural: str, body: Mapping[str, Any], *, event_type: str | None) -> None:
        """A kopf watch event (the fleets): notices kopf re-listing a kind. A deleted fleet's own
        writes are forgotten by :meth:`observe`."""
        self.relists.saw(plural, uid_of(body), event_type=event_type)

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
        if self.synced is not None:
            await self.synced()
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
            if isinstance(exc, k.RetryLater) and exc.delay:
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

    # the reconcile

    async def _snapshot(self, key: Key) -> Snapshot:
        """The fleet as the indexes show it; from the API server when there are none, and once
        per fleet after kopf re-listed a kind (forgetting index entries the server no longer has)."""
        selector = fleet_pods_selector(key[1])
        if self.indices is None:
            return await ListedView(self.kube).snapshot(key, selector=selector)
        indexed = await IndexedView(self.indices, self.tombstones).snapshot(key, selector=selector)
        epoch = self.relists.epoch
        if self._verified.get(key, 0) >= epoch:
            return indexed
        listed = await ListedView(self.kube).snapshot(key, selector=selector)
        self.tombstones.uids |= indexed.uids() - listed.uids()
        self._verified[key] = epoch
        return listed

    async def reconcile(self, key: Key) -> str:
        """One level-based pass over one object. Returns ``ok``, ``invalid`` or ``gone``."""
        namespace = key[0]
        snapshot = await self._snapshot(key)
        body = self.own_writes.resolve(CR_KIND.kind, key, snapshot.fleet)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return "gone"  # owner references let the garbage collector take the children
        self._uids[key] = uid_of(body)
        if namespace in self.terminating:
            return "terminating"  # the namespace's deletion takes the fleet and its children
        previous = body.get("status")
        plan = plan_fleet(body)
        if isinstance(plan, InvalidPlan):
            status = compute_invalid_status(
                generation=plan.generation,
                problems=plan.problems,
                previous=previous,
                now=self.clock(),
            )
            await self._write_status(body, previous, status)
            return "invalid"
        # The master's /metrics is read alongside the applies (bounded, never raises), so a slow
        # or absent master delays nothing else.
        reads = _SideReads(
            kvstore=asyncio.ensure_future(self._kvstore_reading(plan, previous)),
            failures=asyncio.ensure_future(self._hook_failures(plan, snapshot.pods)),
            secrets=asyncio.ensure_future(self._missing_secrets(plan, previous)),
            codex=asyncio.ensure_future(self._missing_codex_instructions(plan, previous)),
        )
        try:
            return await self._apply(key, body, plan, snapshot, reads)
        finally:
            reads.cancel()  # a reconcile that failed or was cancelled leaves no read running

    async def _apply(
        self,
        key: Key,
        body: Mapping[str, Any],
        plan: FleetPlan,
        snapshot: Snapshot,
        reads: _SideReads,
    ) -> str:
        """Apply the plan's children and write the status they and the side reads show."""
        namespace, name = key
        previous = body.get("status")
        live = await self._live_children(namespace, plan, snapshot)
        taken = plan_conflicts(plan.desired, live, uid=plan.uid)
        conflicts = [
            conflict_message(kind, obj, owner=name) for (kind, _), obj in sorted(taken.items())
        ]
        holds = plan_holds(plan.desired, taken)
        held = [held_message(ck, why) for ck, why in holds.items()]
        waits = plan_workers_first(plan.desired, live)
        ours = [m for m in plan.desired if child_key(m) not in {*taken, *holds, *waits}]
        # Children are independent objects: apply them concurrently (server-side apply needs no
        # order; a pod waits for its ConfigMap by itself).
        results = await asyncio.gather(
            *(_outcome(self._ensure(plan.uid, m, live.get(child_key(m)))) for m in ours)
        )
        if any(isinstance(r, k.ApiError) and r.namespace_terminating for r in results):
            # No re-create attempts, status writes or Events into a namespace being deleted.
            self.terminating.add(namespace)
            log.info("namespace %s is being deleted: leaving %s to it", namespace, name)
            return "terminating"
        applies = _read_applies(ours, results, live)
        observed_deployments, inference_pool = applies.deployments, applies.inference_pool
        refused, unserved = applies.refused, applies.unserved
        for ck in [*holds, *waits]:
            if ck[0] in WORKLOAD_KINDS and ck in live:
                observed_deployments[ck[1]] = live[ck]
        refused += await self._hop_key(plan, previous)
        if not refused:
            await self._prune(namespace, plan_prune(plan.desired, live, uid=plan.uid))
            await named.retire_hop_key(
                self.kube,
                plan,
                live,
                ensured=self._hop_keys,
                retries=self._hop_key_retries,
                deletes=self.metrics.deletes,
            )
        # Every pod of the fleet: worker pods carry the probe reports, and any pod that is not
        # ready says why (the scheduler's message, the kubelet's waiting reason).
        observed = Observed(
            deployments=observed_deployments,
            worker_pods=worker_pods(snapshot.pods),
            pods=snapshot.pods,
            apply_errors=refused,
            kvstore=await reads.kvstore,
            hook_failures=(await reads.failures).increases,
            missing_secrets=await reads.secrets,
            missing_codex_instructions=await reads.codex,
            conflicts=conflicts,
            taken=frozenset(taken),
            held=dict(zip(holds, held, strict=True)),
            waiting=[waiting_message(ck, why) for ck, why in waits.items()],
            unserved_kinds=frozenset(unserved),
            inference_pool=inference_pool,
        )
        status = compute_status(plan.fleet, observed, previous=previous, now=self.clock())
        await self._write_status(body, previous, status)
        if refused:
            # Said so in status; now fail so the queue retries with backoff.
            raise k.RetryLater("the API server refused: " + "; ".join(refused))
        if unserved:
            # Said so in status; look again until the CRD is installed.
            raise k.RetryLater(
                "the API server does not serve " + ", ".join(sorted(unserved)),
                delay=UNSERVED_RETRY_S,
            )
        return "ok"

    async def _live_children(
        self, namespace: str, plan: FleetPlan, snapshot: Snapshot
    ) -> dict[ChildKey, Mapping[str, Any]]:
        """The fleet's children: the snapshot's, the operator's own fresher writes, and desired
        children the watches do not show read by name (only a fleet's first reconcile, or one
        after a child was deleted, pays a read per child)."""
        live: dict[ChildKey, Mapping[str, Any]] = {}
        for ck in {*snapshot.children, *(child_key(m) for m in plan.desired)}:
            obj = self.own_writes.resolve(ck[0], (namespace, ck[1]), snapshot.children.get(ck))
            if obj is not None:
                live[ck] = obj
        missing = plan_lookups(plan.desired, live)
        found = await asyncio.gather(
            *(
                _outcome(
                    self.kube.get_or_none(kinds.kind_of(m), namespace, str(m["metadata"]["name"]))
                )
                for m in missing
            )
        )
        for manifest, obj in zip(missing, found, strict=True):
            if isinstance(obj, Exception):
                raise obj
            if obj is not None:
                live[child_key(manifest)] = obj
        return live

    async def _kvstore_reading(
        self, plan: FleetPlan, previous: Mapping[str, Any] | None
    ) -> KvStoreReading | None:
        """The managed master's usage: read at most every READ_INTERVAL_SECONDS per fleet, and
        every RETRY_SECONDS while a failure is still within the grace period (the fleet is
        queued again for that: nothing else may come to reconcile it)."""
        url = plan.master_metrics_url
        if url is None:
            return None
        budget = plan.fleet.retention_budget
        key = plan.key
        now = self.clock()
        recorded = reading_from_status(previous)
        interval = plan_read_interval(recorded)
        last = self._kvstore_reads.get(key)
        if last is not None and not plan_metrics_read(last[0], now=now, interval_seconds=interval):
            reading = last[1]
        else:
            reading = await self.read_kvstore(url, now=now)
            self._kvstore_reads[key] = (now, reading)
            self.metrics.observe_kvstore(*key, reading, budget=budget)
        shown = plan_reading(recorded, reading, now=now)
        if shown.stale_since is not None:
            self.queue.add_after(key, plan_read_interval(shown))
        return shown

    async def _hook_failures(
        self, plan: FleetPlan, pods: Sequence[Mapping[str, Any]]
    ) -> FleetFailures:
        """The retention hook failures the ready worker pods report since the last read: read at
        most every READ_INTERVAL_SECONDS per fleet (the same reading in between), at most
        SCRAPES_AT_ONCE pods at a time, each read time-bounded. Only with hints on: without them
        no hook has anything to do. While a read shows failures, the fleet is queued again for
        the next one, so a counter that stays flat clears the condition without other events."""
        if not plan.fleet.retention.hints:
            return FleetFailures()
        key = plan.key
        now = self.clock()
        last = self._worker_reads.get(key)
        if last is not None and not plan_metrics_read(last[0], now=now):
            return last[1]
        gate = asyncio.Semaphore(SCRAPES_AT_ONCE)

        async def read(pod: str, url: str) -> PodFailures:
            async with gate:
                return await self.read_worker(pod, url)

        targets = scrape_targets(worker_pods(pods))
        reads = await asyncio.gather(*(read(pod, url) for pod, url in targets))
        reading = plan_failures(last[1] if last is not None else None, reads)
        self._worker_reads[key] = (now, reading)
        for r in reads:
            if r.error is not None:
                log.debug("hook failures of %s/%s not read: %s", key[0], r.pod, r.error)
        if reading.increases:
            self.queue.add_after(key, READ_INTERVAL_SECONDS)
        return reading

    async def _missing_secrets(
        self, plan: FleetPlan, previous: Mapping[str, Any] | None
    ) -> list[str]:
        return await named.missing_secrets(self.kube, plan, previous)

    async def _missing_codex_instructions(
        self, plan: FleetPlan, previous: Mapping[str, Any] | None
    ) -> str | None:
        return await named.missing_codex_instructions(self.kube, plan, previous)

    async def _hop_key(self, plan: FleetPlan, previous: Mapping[str, Any] | None) -> list[str]:
        return await named.ensure_hop_key(
            self.kube, plan, previous, ensured=self._hop_keys, writes=self.metrics.apply_writes
        )

    async def _ensure(
        self, owner_uid: str, manifest: Mapping[str, Any], live: Mapping[str, Any] | None
    ) -> Mapping[str, Any]:
        """Apply ``manifest`` unless the live object already is what an apply would make it."""
        kind = kinds.kind_of(manifest)
        meta = manifest["metadata"]
        ck = child_key(manifest)
        digest = manifest_hash(manifest)
        action = plan_child(manifest, live, remembered=self.applied.get(owner_uid, ck))
        if live is not None and action == "keep":
            self.applied.remember(owner_uid, ck, stamp_of(live, manifest, digest=digest))
            return live
        if live is not None and action == "verify":
            self.metrics.dry_runs.labels(kind.kind).inc()
            dry = await self.kube.apply(manifest, dry_run=True)
            if dry_run_saw_stale_copy(dry, live):
                fresh = await self.kube.get_or_none(kind, str(meta.get("namespace")), meta["name"])
                live = fresh if fresh is not None else {}
            if live and plan_after_dry_run(dry, live) == "keep":
                self.applied.remember(owner_uid, ck, stamp_of(live, manifest, digest=digest))
                return live
        result = await self.kube.apply(manifest)
        self.metrics.apply_writes.labels(kind.kind).inc()
        log.info("applied %s %s/%s", kind.kind, meta.get("namespace"), meta["name"])
        self.own_writes.record(kind.kind, live or None, result)
        self.applied.remember(owner_uid, ck, stamp_of(result, manifest, digest=digest))
        return result

    async def _prune(self, namespace: str, prunes: list[Prune]) -> None:
        """Delete children this object controls that the spec no longer wants (mode changes)."""
        for prune in prunes:
            kind = kinds.kind_of({"apiVersion": prune.api_version, "kind": prune.kind})
            await self.kube.delete(kind, namespace, prune.name, uid=prune.uid)
            self.metrics.deletes.labels(prune.kind).inc()
            log.info("deleted %s %s/%s (no longer in the spec)", prune.kind, namespace, prune.name)

    async def _write_status(
        self,
        body: Mapping[str, Any],
        previous: Mapping[str, Any] | None,
        status: dict[str, Any],
    ) -> None:
        """Apply the status subresource only when it changed; post an Event per flip."""
        meta = body["metadata"]
        self.metrics.observe_conditions(
            meta["namespace"], meta["name"], status.get("conditions") or ()
        )
        plan = plan_status(previous, status)
        if not plan.write:
            return
        try:
            result = await self.kube.apply(
                status_patch(body, status), kind=CR_KIND, subresource="status"
            )
        except k.NotFound as gone:  # deleted since it was read: its watch event says so
            log.debug("no status written: %s", gone)
            return
        self.own_writes.record(CR_KIND.kind, body, result)
        self.metrics.status_writes.inc()
        now = self.clock()
        for cond in plan.events:
            await self.kube.post_event(
                body,
                type_=event_type(cond),
                reason=cond["reason"],
                message=event_message(cond),
                now=now,
            )
            self.metrics.events.inc()
