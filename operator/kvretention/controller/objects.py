"""How the controller names the objects it handles: the keys it files a fleet and its children
under, and what it reads of an object's identity (uid, version, owner) from its metadata.

Pure and below every other controller module: the planner, the caches, the informers and the
executor all key their maps with these, so a fleet or a child is spelled one way everywhere.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvretention.api.models import GROUP, KIND
from kvretention.api.names import LABEL_COMPONENT, LABEL_INSTANCE

Key = tuple[str, str]
"""(namespace, name) of a KvRetentionDeployment."""
ChildKey = tuple[str, str]
"""(kind, name) of a child."""
Stamp = tuple[str, str, str, str]
"""What must stay the same for a live child to still match what was applied
(:func:`~kvretention.controller.planner.stamp_of`)."""


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """An object's metadata (empty when it has none)."""
    meta: Mapping[str, Any] = obj.get("metadata") or {}
    return meta


def resource_version(obj: Mapping[str, Any]) -> str:
    return str(meta_of(obj).get("resourceVersion"))


def uid_of(obj: Mapping[str, Any]) -> str:
    return str(meta_of(obj).get("uid"))


def fleet_key(body: Mapping[str, Any]) -> Key:
    """The key of a KvRetentionDeployment's own body."""
    meta = meta_of(body)
    return (str(meta.get("namespace")), str(meta.get("name")))


def instance_key(body: Mapping[str, Any], *, fleet: bool = False) -> Key | None:
    """The fleet an object is indexed under: a fleet under its own name, a child or pod under its
    ``app.kubernetes.io/instance`` label (what the Deployments select their pods by); None when
    it names no fleet."""
    meta = meta_of(body)
    namespace = meta.get("namespace")
    name = meta.get("name") if fleet else (meta.get("labels") or {}).get(LABEL_INSTANCE)
    if not namespace or not name:
        return None
    return (str(namespace), str(name))


def owner_key(body: Mapping[str, Any]) -> Key | None:
    """The KvRetentionDeployment that owns a child: its controller reference, else its labels."""
    meta = meta_of(body)
    namespace = meta.get("namespace")
    if not namespace:
        return None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == KIND and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return (namespace, ref["name"])
    instance = (meta.get("labels") or {}).get(LABEL_INSTANCE)
    return (namespace, instance) if instance else None


def child_key(manifest: Mapping[str, Any]) -> ChildKey:
    return (str(manifest["kind"]), str(manifest["metadata"]["name"]))


def is_controlled_by(child: Mapping[str, Any], uid: str) -> bool:
    refs = meta_of(child).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def component_of(obj: Mapping[str, Any]) -> str | None:
    return (meta_of(obj).get("labels") or {}).get(LABEL_COMPONENT)
