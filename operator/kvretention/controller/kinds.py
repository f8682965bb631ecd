"""Where each kind the operator reads or writes lives in the Kubernetes REST API: one home for each
kind's ``apiVersion``, ``kind`` and plural, which the pure builders write into manifests and
:mod:`kvretention.controller.kube` reads and writes by."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class ResourceKind:
    """Where a kind lives in the REST API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool = True

    def collection_path(self, namespace: str | None) -> str:
        """``/api/v1/namespaces/ns/services`` or ``/apis/apps/v1/namespaces/ns/deployments``."""
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            return f"{root}/namespaces/{namespace}/{self.plural}"
        return f"{root}/{self.plural}"

    def object_path(self, namespace: str | None, name: str) -> str:
        return f"{self.collection_path(namespace)}/{name}"

    @property
    def crd(self) -> str:
        """The CustomResourceDefinition that serves a custom kind: ``<plural>.<group>``."""
        return f"{self.plural}.{self.api_version.partition('/')[0]}"


DEPLOYMENT: Final = ResourceKind("apps/v1", "Deployment", "deployments")
SERVICE: Final = ResourceKind("v1", "Service", "services")
CONFIGMAP: Final = ResourceKind("v1", "ConfigMap", "configmaps")
POD: Final = ResourceKind("v1", "Pod", "pods")
EVENT: Final = ResourceKind("v1", "Event", "events")
LEASE: Final = ResourceKind("coordination.k8s.io/v1", "Lease", "leases")
SECRET: Final = ResourceKind("v1", "Secret", "secrets")
"""Read for existence only (:meth:`Kube.exists`): the frontend's auth Secrets and the fleet's hop
key, which is created when absent (:meth:`Kube.create_if_absent`) and never read or written
after."""
PDB: Final = ResourceKind("policy/v1", "PodDisruptionBudget", "poddisruptionbudgets")
NETWORK_POLICY: Final = ResourceKind("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies")
HPA: Final = ResourceKind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
LEADER_WORKER_SET: Final = ResourceKind(
    "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", "leaderworkersets"
)
"""Multinode worker pools; its CRD comes with the LWS controller, which only such fleets need."""
INFERENCE_POOL: Final = ResourceKind(
    "inference.networking.k8s.io/v1", "InferencePool", "inferencepools"
)
"""A Gateway's backend (``spec.gateway.inferencePool``); its CRD comes with the cluster's Gateway
stack (Gateway API Inference Extension), which only fleets with the option need."""

CHILD_KINDS: Final[tuple[ResourceKind, ...]] = (
    DEPLOYMENT,
    SERVICE,
    CONFIGMAP,
    PDB,
    NETWORK_POLICY,
    HPA,
    LEADER_WORKER_SET,
    INFERENCE_POOL,
)
"""The kinds the operator owns. A builder emitting another kind fails loudly in :func:`kind_of`."""
OPTIONAL_KINDS: Final = frozenset({LEADER_WORKER_SET, INFERENCE_POOL})
"""Child kinds whose API may be absent (a CRD not installed) or not granted: reading them finds
nothing then, and only a fleet that wants one says so in its status."""

_KINDS: Final = {(k.api_version, k.kind): k for k in (*CHILD_KINDS, POD, EVENT, LEASE)}


def kind_of(manifest: Mapping[str, Any]) -> ResourceKind:
    """The REST location of a manifest's kind; an unknown kind is a programming error."""
    key = (str(manifest.get("apiVersion")), str(manifest.get("kind")))
    try:
        return _KINDS[key]
    except KeyError:
        raise ValueError(f"kvretention does not manage {key[1]} ({key[0]})") from None


def custom_kind(*, group: str, version: str, kind: str, plural: str) -> ResourceKind:
    """The REST location of a custom resource (the CR itself)."""
    return ResourceKind(f"{group}/{version}", kind, plural)
