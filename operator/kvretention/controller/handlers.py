"""Thin kopf glue: watch events in, the reconcile queue of :mod:`~kvretention.controller.executor`
fed.

kopf watches the custom resource, the children and the fleets' pods; each watch fills an
in-memory index (``@kopf.index``) that the reconcile reads instead of the API server, and each
event only *enqueues* the owning ``KvRetentionDeployment``.

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
from kvretention.api.names import (
    APP_NAME,
    FIELD_MANAGER,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
)
from kvretention.controller.cache import FLEETS_INDEX, PODS_INDEX, index_by_instance
from kvretention.controller.executor import Controller
from kvretention.controller.planner import Key, owner_key

Resource = tuple[str, str] | tuple[str, str, str]
MANAGED: Final = f"{LABEL_MANAGED_BY}={FIELD_MANAGER}"
CHILD_RESOURCES: Final[tuple[tuple[str, str, str], ...]] = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("", "v1", "configmaps"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
)
CHILD_WATCH_SELECTORS: Final[tuple[tuple[Resource, str], ...]] = (
    *(((g, v, p) if g else (v, p), MANAGED) for g, v, p in CHILD_RESOURCES),
    (("v1", "pods"), f"{LABEL_NAME}={APP_NAME},{LABEL_INSTANCE}"),
)
"""Server-side label selectors of the child watches: the API server sends only our objects, so
unrelated ConfigMaps or Pods cost the operator nothing (kopf's ``labels=`` filters client-side,
after every object in the cluster has been streamed and parsed)."""
INDEX_IDS: Final = (FLEETS_INDEX, *(p for _, _, p in CHILD_RESOURCES), PODS_INDEX)


# -- kopf registration -------------------------------------------------------------------------


def _controller(memo: Any) -> Controller:
    controller = memo.controller
    assert isinstance(controller, Controller)
    return controller


def build_registry() -> kopf.OperatorRegistry:
    """A fresh registry with this operator's handlers (no module-level side effects)."""
    registry = kopf.OperatorRegistry()
    managed = {LABEL_MANAGED_BY: FIELD_MANAGER}

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

    async def index_child(body: Mapping[str, Any], **_: Any) -> dict[Key, Any] | None:
        return index_by_instance(body)

    async def index_pod(body: Mapping[str, Any], **_: Any) -> dict[Key, Any] | None:
        return index_by_instance(body, pod=True)

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

    async def on_child(
        event: Mapping[str, Any], body: Mapping[str, Any], memo: Any, resource: Any, **kwargs: Any
    ) -> None:
        controller = bind(memo, kwargs)
        controller.saw(str(resource.plural), body, event_type=event.get("type"))
        controller.touch(owner_key(body))

    for group, version, plural in CHILD_RESOURCES:
        where = (group, version, plural) if group else (version, plural)
        kopf.index(*where, id=plural, labels=managed, registry=registry)(index_child)
        kopf.on.event(*where, id=f"child-{plural}", labels=managed, registry=registry)(on_child)
    # Pods are matched on their Deployment's selector labels (immutable, on every fleet pod).
    fleet_pod: dict[str, Any] = {LABEL_NAME: APP_NAME, LABEL_INSTANCE: kopf.PRESENT}
    kopf.index("v1", "pods", id=PODS_INDEX, labels=fleet_pod, registry=registry)(index_pod)
    kopf.on.event("v1", "pods", id="child-pods", labels=fleet_pod, registry=registry)(on_child)
    return registry
