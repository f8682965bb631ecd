"""Informers for the fleets' children and pods: list, then watch, keeping only the slim entry.

kopf would keep every watched object's full body alive while it waits for all its indexes to fill
(and for seconds after each event), so the operator's memory followed the largest set of raw
objects it had seen at once, not what it keeps. Here each object is slimmed the moment it is
parsed (:func:`~kvretention.controller.cache.index_by_instance`, client-go's "transform" step),
lists come in pages, and a re-list replaces a kind's store as a whole, so an object deleted while
the watch was down cannot linger. The custom resources themselves stay with kopf; both are wired
to the controller in :mod:`kvretention.controller.watch`.

Watches block on a socket, so each runs in a daemon thread of its own, never in the thread pool
the reconciles' API calls share; the thread hands slim events to the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.api.names import (
    FIELD_MANAGER,
    FLEET_PODS_SELECTOR,
    LABEL_MANAGED_BY,
)
from kvretention.controller import kinds
from kvretention.controller import kube as k
from kvretention.controller.cache import PODS_INDEX, index_by_instance
from kvretention.controller.objects import Key, owner_key, uid_of

log = logging.getLogger(__name__)

LIST_PAGE: Final = 250
"""Objects per LIST page: at most one page of raw objects is in memory at a time."""
WATCH_TIMEOUT_S: Final = 300
"""The API server ends each watch after this long; the informer resumes from the last version."""
RETRY_S: Final = 2.0
OPTIONAL_RETRY_S: Final = 30.0
"""How often an informer of an optional kind whose API is absent looks for it again."""

MANAGED_SELECTOR: Final = f"{LABEL_MANAGED_BY}={FIELD_MANAGER}"
POD_SELECTOR: Final = FLEET_PODS_SELECTOR
WATCHED: Final[tuple[tuple[str, kinds.ResourceKind, str], ...]] = (
    *((kind.plural, kind, MANAGED_SELECTOR) for kind in kinds.CHILD_KINDS),
    (PODS_INDEX, kinds.POD, POD_SELECTOR),
)
"""(index id, kind, server-side label selector): only our objects are ever sent to us."""


@dataclass(frozen=True)
class Slim:
    """One object as the informer keeps it, and what the controller is told about it."""

    uid: str
    key: Key | None
    """The (namespace, fleet) it is indexed under; None: not one of a fleet's objects."""
    owner: Key | None
    entry: bytes


def slim(body: Mapping[str, Any], *, pod: bool) -> Slim:
    """The entry an index keeps for ``body`` (parsed once, then dropped)."""
    indexed = index_by_instance(body, pod=pod)
    key, entry = next(iter(indexed.items())) if indexed else (None, b"")
    return Slim(uid=uid_of(body), key=key, owner=owner_key(body), entry=entry)


class Gone(Exception):
    """The watch's resourceVersion expired (HTTP 410): list again."""


@dataclass
class Store:
    """One kind's entries by (namespace, fleet), as kopf's index handed them out."""

    _by_key: dict[Key, dict[str, bytes]] = field(default_factory=dict)
    _key_of: dict[str, Key] = field(default_factory=dict)

    def get(self, key: Key) -> list[bytes] | None:
        entries = self._by_key.get(key)
        return list(entries.values()) if entries else None

    def keys(self) -> set[Key]:
        return set(self._by_key)

    def put(self, obj: Slim) -> None:
        self.remove(obj.uid)
        if obj.key is not None:
            self._by_key.setdefault(obj.key, {})[obj.uid] = obj.entry
            self._key_of[obj.uid] = obj.key

    def remove(self, uid: str) -> None:
        key = self._key_of.pop(uid, None)
        if key is None:
            return
        entries = self._by_key.get(key, {})
        entries.pop(uid, None)
        if not entries:
            self._by_key.pop(key, None)

    def __len__(self) -> int:
        return len(self._key_of)


Notify = Callable[[Key | None, str, str | None], None]
"""(the owning fleet, the object's uid, the event type: ADDED/MODIFIED/DELETED, or None after a
re-list, once per fleet, with no uid)."""


@dataclass
class Informer:
    """List-then-watch of one kind in one namespace (None: all namespaces)."""

    kube: k.Kube
    index: str
    kind: kinds.ResourceKind
    selector: str
    namespace: str | None
    notify: Notify
    store: Store = field(default_factory=Store)
    synced: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def pod(self) -> bool:
        return self.kind is kinds.POD

    async def run(self) -> None:
        """Forever: list, then watch until the version expires or the connection drops."""
        while True:
            try:
                version = await self._relist()
                while True:
                    version = await self._watch(version)
            except asyncio.CancelledError:
                raise
            except Gone:
                log.debug("%s watch expired: listing again", self.index)
            except (k.NotFound, k.ApiError) as exc:
                if self.kind not in kinds.OPTIONAL_KINDS:
                    log.warning(
                        "%s informer: %s (listing again in %.0fs)", self.index, exc, RETRY_S
                    )
                    await asyncio.sleep(RETRY_S)
                    continue
                # The kind's API is not served (its CRD is absent) or not granted: nothing of it
                # exists for us, so the reconciles go on without it; look again now and then.
                self._absent(exc)
                await asyncio.sleep(OPTIONAL_RETRY_S)
            except Exception as exc:
                log.warning("%s informer: %s (listing again in %.0fs)", self.index, exc, RETRY_S)
                await asyncio.sleep(RETRY_S)

    def _absent(self, exc: BaseException) -> None:
        if not self.synced.is_set():
            log.info("%s are not served here (%s); fleets that need them say so", self.index, exc)
        gone = self.store.keys()
        self.store = Store()
        for key in gone:
            self.notify(key, "", None)
        self.synced.set()

    async def _relist(self) -> str:
        fresh = Store()
        token = ""
        while True:
            page = await self.kube.list_page(
                self.kind, self.namespace, selector=self.selector, limit=LIST_PAGE, token=token
            )
            for item in page.get("items") or []:
                fresh.put(slim(item, pod=self.pod))
            meta = page.get("metadata") or {}
            token = str(meta.get("continue") or "")
            if not token:
                version = str(meta.get("resourceVersion") or "")
                break
        stale = self.store
        self.store = fresh
        for key in stale.keys() | fresh.keys():  # a re-list can hide any change: check each fleet
            self.notify(key, "", None)
        self.synced.set()
        return version

    async def _watch(self, version: str) -> str:
        """One watch call in its own thread; returns the version to resume from."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[str] = loop.create_future()

        def deliver(event: tuple[str, Slim] | None, last: str, error: BaseException | None) -> None:
            if event is not None:
                self._apply(*event)
            elif not done.done():
                if error is not None:
                    done.set_exception(error)
                else:
                    done.set_result(last)

        def pump() -> None:
            last, error = version, None
            try:
                for line in self.kube.watch_lines(
                    self.kind,
                    self.namespace,
                    selector=self.selector,
                    version=version,
                    timeout_s=WATCH_TIMEOUT_S,
                ):
                    last, event = self._parse(line, last)
                    if event is not None:
                        loop.call_soon_threadsafe(deliver, event, last, None)
            except BaseException as exc:  # handed to the loop, which decides
                error = exc
            with contextlib.suppress(RuntimeError):  # a closed loop: the operator is exiting
                loop.call_soon_threadsafe(deliver, None, last, error)

        threading.Thread(target=pump, name=f"watch-{self.index}", daemon=True).start()
        return await done

    def _parse(self, line: bytes, last: str) -> tuple[str, tuple[str, Slim] | None]:
        """One watch line: the version to resume from, and the event it carries (if any)."""
        raw = json.loads(line)
        kind, obj = raw.get("type"), raw.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone(obj.get("message"))
            raise k.ApiError(
                int(obj.get("code") or 0),
                str(obj.get("message")),
                reason=str(obj.get("reason") or ""),
                what=f"watch {self.kind.collection_path(self.namespace)}",
            )
        version = str((obj.get("metadata") or {}).get("resourceVersion") or last)
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return version, None  # BOOKMARK: only the version moves
        return version, (str(kind), slim(obj, pod=self.pod))

    def _apply(self, event_type: str, obj: Slim) -> None:
        if event_type == "DELETED":
            self.store.remove(obj.uid)
        else:
            self.store.put(obj)
        self.notify(obj.owner, obj.uid, event_type)


@dataclass
class MergedIndex:
    """One kind's stores across the watched namespaces, read as one index (each informer's
    current store: a re-list replaces it)."""

    informers: list[Informer]

    def get(self, key: Key) -> list[bytes] | None:
        found = [e for i in self.informers for e in (i.store.get(key) or [])]
        return found or None


@dataclass
class Informers:
    """Every child kind and the pods, in each watched namespace (or cluster-wide)."""

    members: list[Informer]

    @classmethod
    def build(cls, kube: k.Kube, *, namespaces: tuple[str, ...], notify: Notify) -> Informers:
        scopes: tuple[str | None, ...] = namespaces or (None,)
        return cls(
            [
                Informer(kube, index, kind, selector, namespace, notify)
                for index, kind, selector in WATCHED
                for namespace in scopes
            ]
        )

    def indices(self) -> dict[str, MergedIndex]:
        out: dict[str, MergedIndex] = {}
        for informer in self.members:
            out.setdefault(informer.index, MergedIndex([])).informers.append(informer)
        return out

    async def wait_synced(self) -> None:
        for informer in self.members:
            await informer.synced.wait()

    def run(self) -> Iterator[asyncio.Task[None]]:
        for informer in self.members:
            yield asyncio.create_task(
                informer.run(), name=f"informer-{informer.index}-{informer.namespace}"
            )
