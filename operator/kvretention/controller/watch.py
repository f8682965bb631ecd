"""The operator's watches, in one place: kopf watches the custom resources, the informers of
:mod:`~kvretention.controller.informer` watch their children and pods, and both feed one
:class:`~kvretention.controller.executor.Controller` the same way.

The contract. A watch event only tells the controller; the reconcile reads what it needs from the
indexes, never from the event:

- a fleet's event (kopf): :meth:`Controller.saw` (it notices kopf re-listing) and
  :meth:`Controller.observe` (the fleet known and queued, or, deleted, forgotten);
- a child's or a pod's event (an informer): :meth:`Controller.informed` (its owning fleet queued;
  a deleted object's own last write forgotten);
- the indexes, each by (namespace, fleet) (:func:`~kvretention.controller.cache.index_by_instance`):
  kopf's of the fleets, bound on its first handler call (:meth:`Controller.bind`: kopf passes its
  indexes to handlers only), and the informers' of each child kind and the pods
  (``Controller.children``); :class:`~kvretention.controller.cache.IndexedView` reads them;
- never a half-filled index: kopf calls no handler before its index has its first list, and the
  reconcile workers wait on ``Controller.synced`` until every informer has listed once.

Why two mechanisms: kopf keeps every raw body it processes alive, so the children and pods (most
of the objects) are watched by the informers, which slim each object as it is parsed
(docs/operator.md). Only an index and an ``@kopf.on.event`` handler are registered with kopf, on
purpose: its change-detection handlers (``on.create``/``on.update``/``on.resume``) keep their
bookkeeping in the user's object (annotations or status), and its timers and daemons add a
finalizer. This operator keeps nothing in the user's object and adds no finalizer: a re-list after
a restart is enough to converge.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import kopf

from kvretention.api.models import GROUP, PLURAL, VERSION
from kvretention.controller import kube as k
from kvretention.controller.cache import FLEETS_INDEX, index_by_instance
from kvretention.controller.executor import Controller
from kvretention.controller.informer import Informers
from kvretention.controller.objects import Key, fleet_key, uid_of

INDEX_IDS: Final = (FLEETS_INDEX,)


@dataclass
class Watches:
    """Both watches of one operator process, wired to one controller."""

    controller: Controller
    informers: Informers
    namespaces: tuple[str, ...]
    """The watched namespaces; none: every namespace."""

    @classmethod
    def build(cls, kube: k.Kube, controller: Controller, *, namespaces: tuple[str, ...]) -> Watches:
        """The informers of every child kind and the pods, their indexes and their sync handed
        to ``controller``."""
        informers = Informers.build(kube, namespaces=namespaces, notify=controller.informed)
        controller.children = informers.indices()
        controller.synced = informers.wait_synced
        return cls(controller=controller, informers=informers, namespaces=namespaces)

    def run_informers(self) -> Iterator[asyncio.Task[None]]:
        """One task per informer: list, then watch, until cancelled."""
        return self.informers.run()

    def run_kopf(self, *, ready: asyncio.Event, stop: asyncio.Event) -> Coroutine[Any, Any, None]:
        """kopf, standalone (no peering objects), with :func:`build_registry`'s handlers; sets
        ``ready`` once it watches, returns once ``stop`` is set."""
        return kopf.operator(
            registry=build_registry(),
            standalone=True,
            clusterwide=not self.namespaces,
            namespaces=list(self.namespaces),
            memo=kopf.Memo(controller=self.controller),
            ready_flag=ready,
            stop_flag=stop,
        )


# -- kopf registration -------------------------------------------------------------------------


def _controller(memo: Any) -> Controller:
    controller = memo.controller
    assert isinstance(controller, Controller)
    return controller


def build_registry() -> kopf.OperatorRegistry:
    """A fresh registry with this operator's handlers (no module-level side effects)."""
    registry = kopf.OperatorRegistry()

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

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        # A fresh registry has none of kopf's default login handlers: in-cluster, then KUBECONFIG.
        info: kopf.ConnectionInfo | None = kopf.login_with_service_account(
            **kwargs
        ) or kopf.login_with_kubeconfig(**kwargs)
        return info

    # Every handler is a coroutine: kopf runs sync handlers in the default thread pool, where
    # thousands of watch events after a (re)start would queue ahead of the reconciles' own
    # threads, and the work queue is not thread-safe.
    def bind(memo: Any, kwargs: Mapping[str, Any]) -> Controller:
        controller = _controller(memo)
        if all(i in kwargs for i in INDEX_IDS):  # kopf passes every index to every handler
            controller.bind({i: kwargs[i] for i in INDEX_IDS})
        return controller

    async def index_fleet(body: Mapping[str, Any], **_: Any) -> dict[Key, Any] | None:
        return index_by_instance(body, fleet=True)

    kopf.index(GROUP, VERSION, PLURAL, id=FLEETS_INDEX, registry=registry)(index_fleet)

    @kopf.on.event(GROUP, VERSION, PLURAL, id="kvretentiondeployment", registry=registry)
    async def on_cr(
        event: Mapping[str, Any], body: Mapping[str, Any], memo: Any, **kwargs: Any
    ) -> None:
        controller = bind(memo, kwargs)
        controller.saw(PLURAL, body, event_type=event.get("type"))
        deleted = event.get("type") == "DELETED"
        controller.observe(fleet_key(body), deleted=deleted, uid=uid_of(body) if deleted else None)

    return registry
