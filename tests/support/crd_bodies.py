"""Bodies of small test CRDs: one served, stored ``v1`` version with a status subresource."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def crd_body(
    group: str,
    names: Mapping[str, str],
    *,
    spec: Mapping[str, Any],
    status: Mapping[str, Any],
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A namespaced CRD named ``<plural>.<group>`` whose objects' spec and status follow the given
    OpenAPI schemas."""
    metadata: dict[str, Any] = {"name": f"{names['plural']}.{group}"}
    if annotations:
        metadata["annotations"] = dict(annotations)
    schema = {"type": "object", "properties": {"spec": dict(spec), "status": dict(status)}}
    version = {
        "name": "v1",
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": schema},
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": metadata,
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": dict(names),
            "versions": [version],
        },
    }
