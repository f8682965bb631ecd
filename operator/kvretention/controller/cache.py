"""What the reconcile knows without asking the API server: the in-memory indexes of the watched
objects, the operator's own recent writes on top of them, and the applied-state cache.

kopf fills the fleets' index and the informers those of the children and pods (both wired in
:mod:`kvretention.controller.watch`), all with :func:`index_by_instance` entries. kopf calls no event handler before its index has its initial
list, and the reconcile workers wait for every informer's; the controller only learns of a fleet
from such a handler, so no reconcile reads a half-filled index. A later kopf re-list of the fleets
(after the watch's resourceVersion expired) can leave an entry of a fleet deleted in between;
:class:`Relists` notices re-lists, and the next reconcile of each fleet then reads from the API
server once and forgets such entries (:class:`Tombstones`). The informers replace their stores on
a re-list, so they leave none.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.api.models import GROUP, KIND, PLURAL, VERSION
from kvretention.api.names import LABEL_INSTANCE as _INSTANCE
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.objects import (
    ChildKey,
    Key,
    Stamp,
    instance_key,
    resource_version,
    uid_of,
)

CR_KIND: Final = kinds.custom_kind(group=GROUP, version=VERSION, kind=KIND, plural=PLURAL)
FLEETS_INDEX: Final = "fleets"
CHILD_INDEXES: Final[dict[str, kinds.ResourceKind]] = {
    kind.plural: kind for kind in kinds.CHILD_KINDS
}
PODS_INDEX: Final = "pods"
ENTRY_COMPRESSION: Final = 1
"""zlib's fastest level: most of the gain (JSON repeats its keys), at a fraction of the CPU."""
RELIST_QUIET_S: Final = 10.0
"""Listing events of one kind closer together than this belong to one re-list."""


@dataclass(frozen=True)
class Snapshot:
    """One fleet as the cluster shows it: the custom resource, its children, its pods."""

    fleet: Mapping[str, Any] | None
    children: dict[ChildKey, Mapping[str, Any]]
    pods: list[Mapping[str, Any]]

    def uids(self) -> set[str]:
        """The uid of every object it shows."""
        fleet = [] if self.fleet is None else [self.fleet]
        return {uid_of(o) for o in [*self.children.values(), *self.pods, *fleet]}


@dataclass
class ListedView:
    """From the API server: one GET and one LIST per kind. Used when no index is bound (unit
    tests, a process without kopf) and to check a fleet once after a re-list."""

    kube: k.Kube

    async def snapshot(self, key: Key, *, selector: str) -> Snapshot:
        namespace, name = key
        fleet = await self.kube.get_or_none(CR_KIND, namespace, name)
        children: dict[ChildKey, Mapping[str, Any]] = {}
        for kind in kinds.CHILD_KINDS:
            try:
                items = await self.kube.list(kind, namespace, selector=f"{_INSTANCE}={name}")
            except (k.NotFound, k.ApiError):
                if kind not in kinds.OPTIONAL_KINDS:
                    raise
                items = []  # its API is absent or not granted: none exist for us
            for item in items:
                children[(kind.kind, item["metadata"]["name"])] = item
        pods = await self.kube.list(kinds.POD, namespace, selector=selector)
        return Snapshot(fleet=fleet, children=children, pods=list(pods))


@dataclass
class Tombstones:
    """uids of objects an index still holds although the API server no longer has them."""

    uids: set[str] = field(default_factory=set)

    def live(self, objs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return [o for o in objs if uid_of(o) not in self.uids]


@dataclass
class IndexedView:
    """From kopf's indexes: no request at all. Each index maps (namespace, fleet name) to the
    bodies of the objects labelled with that fleet's instance (``index_by_instance``)."""

    indices: Mapping[str, Any]
    tombstones: Tombstones = field(default_factory=Tombstones)

    def _get(self, index: str, key: Key) -> list[Mapping[str, Any]]:
        store = self.indices[index].get(key)
        return self.tombstones.live(decode_entry(e) for e in store) if store is not None else []

    async def snapshot(self, key: Key, *, selector: str) -> Snapshot:
        fleets = self._get(FLEETS_INDEX, key)
        children: dict[ChildKey, Mapping[str, Any]] = {}
        for plural, kind in CHILD_INDEXES.items():
            for item in self._get(plural, key):
                children[(kind.kind, item["metadata"]["name"])] = item
        pods = sorted(self._get(PODS_INDEX, key), key=lambda p: str(p["metadata"]["name"]))
        return Snapshot(fleet=fleets[0] if fleets else None, children=children, pods=pods)


ABSENT: Final = ""
"""Stands for "not in the index" among the superseded versions of an object."""


@dataclass(frozen=True)
class _Write:
    superseded: frozenset[str]
    """resourceVersions (or ABSENT) older than ``result``: an index copy at one of them is stale."""
    version: str
    uid: str
    entry: bytes
    """The API server's answer, kept as an index entry is (:func:`slim_entry`): when hundreds of
    fleets are created at once, thousands of answers wait here for the watch to catch up."""


@dataclass
class OwnWrites:
    """Read-your-writes over an index: the API server's answer to the operator's own last write
    of an object stands in for the index's copy until the watch delivers a newer one. Without it
    a reconcile that starts before that watch event would see the status it just replaced (and
    post its Events twice) or miss a child it just created."""

    _writes: dict[tuple[str, str, str], _Write] = field(default_factory=dict)

    def record(
        self, kind: str, before: Mapping[str, Any] | None, result: Mapping[str, Any]
    ) -> None:
        meta = result.get("metadata") or {}
        key = (kind, str(meta.get("namespace")), str(meta.get("name")))
        earlier = self._writes.get(key)
        if earlier is not None:  # every version up to the previous write is older than this one
            superseded = earlier.superseded | {earlier.version}
        else:
            superseded = frozenset({ABSENT if before is None else resource_version(before)})
        version = resource_version(result)
        self._writes[key] = _Write(
            superseded=superseded - {version},
            version=version,
            uid=uid_of(result),
            entry=slim_entry(result),
        )

    def resolve(self, kind: str, key: tuple[str, str], seen: Mapping[str, Any] | None) -> Any:
        """The freshest copy: the index's, unless it predates the operator's own write."""
        full = (kind, *key)
        write = self._writes.get(full)
        if write is None:
            return seen
        if (ABSENT if seen is None else resource_version(seen)) in write.superseded:
            return decode_entry(write.entry)
        del self._writes[full]  # the index caught up (or someone wrote after us)
        return seen

    def forget(self, uid: str) -> None:
        """The object is gone (a DELETED event): its last write no longer stands."""
        for full in [f for f, w in self._writes.items() if w.uid == uid]:
            del self._writes[full]


@dataclass
class AppliedState:
    """Per owner UID: each child's :func:`~kvretention.controller.planner.stamp_of` when the
    operator last applied it or verified it matched. Keyed by the owner's UID, so deleting one
    fleet forgets exactly its own children (never another fleet whose name it prefixes), and a
    fleet re-created under the same name starts afresh."""

    _by_owner: dict[str, dict[ChildKey, Stamp]] = field(default_factory=dict)

    def get(self, owner_uid: str, child: ChildKey) -> Stamp | None:
        return self._by_owner.get(owner_uid, {}).get(child)

    def remember(self, owner_uid: str, child: ChildKey, stamp: Stamp) -> None:
        self._by_owner.setdefault(owner_uid, {})[child] = stamp

    def forget_owner(self, owner_uid: str) -> None:
        self._by_owner.pop(owner_uid, None)

    def owners(self) -> set[str]:
        return set(self._by_owner)


@dataclass
class Relists:
    """Notices kopf re-listing a kind (a listing event for an object it has already seen) and
    counts re-lists, so each fleet can be checked against the API server once after one."""

    clock: Callable[[], float] = time.monotonic
    epoch: int = 0
    _seen: dict[str, set[str]] = field(default_factory=dict)
    _last: dict[str, float] = field(default_factory=dict)

    def saw(self, plural: str, uid: str, *, event_type: str | None) -> None:
        seen = self._seen.setdefault(plural, set())
        if event_type == "DELETED":
            seen.discard(uid)
            return
        if event_type is None and uid in seen:
            now = self.clock()
            if now - self._last.get(plural, float("-inf")) > RELIST_QUIET_S:
                self.epoch += 1
            self._last[plural] = now
        seen.add(uid)


def index_by_instance(
    body: Mapping[str, Any], *, fleet: bool = False, pod: bool = False
) -> dict[Key, Any] | None:
    """The value of every index: the object's body (as :func:`encode_entry` stores it) under
    its fleet's key (:func:`~kvretention.controller.objects.instance_key`: a fleet under its own
    name, a child or pod under its ``app.kubernetes.io/instance`` label, what the operator's
    LISTs use too). Field managers are kept only in the slim form the restart check needs, and
    not at all for pods."""
    key = instance_key(body, fleet=fleet)
    return None if key is None else {key: slim_entry(body, pod=pod)}


def slim_entry(body: Mapping[str, Any], *, pod: bool = False) -> bytes:
    """``body`` as the caches keep it: managed fields reduced to who wrote what (none for pods),
    then :func:`encode_entry`."""
    plain = _plain(body)
    managed = plain.setdefault("metadata", {}).pop("managedFields", None)
    if managed and not pod:
        plain["metadata"]["managedFields"] = [_slim(entry) for entry in managed]
    return encode_entry(plain)


def encode_entry(body: Mapping[str, Any]) -> bytes:
    """An index entry as compact, deflated JSON: about 1 KiB per Deployment, where the same body
    as Python dicts takes ten times that (the indexes hold every watched child and pod, and a
    reconcile decodes only its own fleet's, a few hundred microseconds)."""
    return zlib.compress(json.dumps(body, separators=(",", ":")).encode(), ENTRY_COMPRESSION)


def decode_entry(entry: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(zlib.decompress(entry))
    return body


def _slim(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A managedFields entry with only what :func:`~kvretention.controller.planner.
    trusted_by_annotation` reads (who wrote, and which top-level fields and which annotations):
    the full field sets would be most of an index's memory."""
    fields = entry.get("fieldsV1") or {}
    metadata = fields.get("f:metadata") or {}
    slim_metadata: dict[str, Any] = {key: {} for key in metadata}
    if "f:annotations" in metadata:
        slim_metadata["f:annotations"] = {key: {} for key in metadata["f:annotations"]}
    slim_fields: dict[str, Any] = {key: {} for key in fields}
    if metadata:
        slim_fields["f:metadata"] = slim_metadata
    return {
        **{key: entry[key] for key in ("manager", "operation", "subresource") if key in entry},
        "fieldsV1": slim_fields,
    }


def _plain(value: Any) -> Any:
    """A deep, plain copy (kopf hands out read-only views whose contents it may replace)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(v) for key, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
