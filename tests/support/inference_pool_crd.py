"""A CRD for the Gateway API Inference Extension's ``InferencePool`` (``inference.networking.k8s.io``
v1), as a cluster's Gateway stack installs it, for the tiers that run a real API server.

It is a small structural CRD written here, not the extension's own manifest: the fields the
operator sets (``selector``, ``targetPorts``, ``appProtocol``, ``endpointPickerRef`` with its
``port`` and ``failureMode``), typed and required as the v1 API documents them (a pool without a
picker is refused, as a real Gateway stack's CRD refuses it), and a status subresource whose
``parents`` a Gateway writes.
"""

from __future__ import annotations

from typing import Any, Final

from support.crd_bodies import crd_body

GROUP: Final = "inference.networking.k8s.io"
VERSION: Final = "v1"
PLURAL: Final = "inferencepools"
CRD_NAME: Final = f"{PLURAL}.{GROUP}"

_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
_PICKER_REF = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "group": {"type": "string"},
        "kind": {"type": "string"},
        "name": {"type": "string", "minLength": 1},
        "port": {"type": "object", "required": ["number"], "properties": {"number": _PORT}},
        "failureMode": {"type": "string", "enum": ["FailOpen", "FailClose"]},
    },
}
_PRESERVED = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def inference_pool_crd() -> dict[str, Any]:
    """The CRD body (``kubectl apply`` or ``ApiextensionsV1Api`` it)."""
    return crd_body(
        GROUP,
        {
            "kind": "InferencePool",
            "listKind": "InferencePoolList",
            "plural": PLURAL,
            "singular": "inferencepool",
        },
        # A *.k8s.io group: the API server wants this annotation on any CRD of it.
        annotations={"api-approved.kubernetes.io": "unapproved, kvretention's own test CRD"},
        spec={
            "type": "object",
            "required": ["selector", "targetPorts", "endpointPickerRef"],  # as v1 requires
            "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": _STRING_MAP}},
                "targetPorts": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 8,
                    "items": {
                        "type": "object",
                        "required": ["number"],
                        "properties": {"number": _PORT},
                    },
                },
                "appProtocol": {"type": "string", "enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": _PICKER_REF,
            },
        },
        status={
            "type": "object",
            "properties": {"parents": {"type": "array", "items": _PRESERVED}},
        },
    )


def accepting_gateway(gateway: str, namespace: str) -> dict[str, Any]:
    """One ``status.parents`` entry as a Gateway that implements the extension writes it once it
    takes the pool up: ``Accepted`` and ``ResolvedRefs`` (the picker reference resolved) True."""
    conditions = [
        {
            "type": ctype,
            "status": "True",
            "reason": reason,
            "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        for ctype, reason in (("Accepted", "SupportedByParent"), ("ResolvedRefs", "ResolvedRefs"))
    ]
    return {
        "parentRef": {
            "group": "gateway.networking.k8s.io",
            "kind": "Gateway",
            "name": gateway,
            "namespace": namespace,
        },
        "conditions": conditions,
    }
