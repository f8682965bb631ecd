"""Thin kopf glue: watch events in, the reconcile queue of :mod:`~kvretention.controller.executor`
fed.

kopf watches the custom resources: the watch fills an in-memory index (``@kopf.index``) that the
reconcile reads instead of the API server, and each event only *enqueues* the fleet. The children
and the fleets' pods are watched by :mod:`~kvretention.controller.informer`, which keeps each
object slimmed from the moment it arrives (kopf keeps every raw body it is processing).

Only index and ``@kopf.on.event`` handlers are registered, on purpose: kopf's change-detection
handlers (``on.create``/``on.update``/``on.resume``) keep their bookkeeping in the user's object
(annotations or status), and its timers and daemons add a finalizer. This operator keeps nothing in
the user's object and adds no finalizer: a re-list after a restart is enough to converge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import kopf

from kvretention.api.models import GROUP, PLURAL, VERSION
from kvretention.controller.cache import FLEETS_INDEX, index_by_instance
from kvretention.controller.executor import Controller
from kvretention.controller.planner import Key

INDEX_IDS: Final = (FLEETS_INDEX,)


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
        meta = body.get("metadata") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        controller.saw(PLURAL, body, event_type=event.get("type"))
        deleted = event.get("type") == "DELETED"
        controller.observe(key, deleted=deleted, uid=str(meta.get("uid")) if deleted else None)

    return registry
