"""Pure: the ``KvRetentionDeployment`` CustomResourceDefinition, generated from the pydantic models.

pydantic emits JSON Schema; Kubernetes wants a *structural* schema. :func:`structural` rewrites one
into the other: ``$ref`` inlined, ``title`` dropped, ``anyOf[T, null]`` -> ``nullable``,
``anyOf[integer, string]`` -> ``x-kubernetes-int-or-string``, ``additionalProperties: false`` dropped
(the API server prunes unknown fields instead), numeric ``exclusiveMinimum``/``exclusiveMaximum`` ->
OpenAPI v3.0 booleans, free-form objects -> ``x-kubernetes-preserve-unknown-fields``, integer/number
formats added.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import yaml

from kvretention.api.models import (
    CATEGORIES,
    DNS1035_LABEL_PATTERN,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    PICKER_MAX_NAME_LENGTH,
    PICKER_NAME_MESSAGE,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    KvRetentionDeploymentSpec,
    KvRetentionDeploymentStatus,
)
from kvretention.api.names import APP_NAME, LABEL_NAME

CRD_NAME: Final = f"{PLURAL}.{GROUP}"
CRD_FILENAME: Final = f"{GROUP}_{PLURAL}.yaml"
_INT32_MAX: Final = 2**31 - 1
_DROP: Final = frozenset({"title"})

Schema = dict[str, Any]

PRINTER_COLUMNS: Final[list[dict[str, Any]]] = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
        "description": "Whether the whole fleet serves.",
    },
    {
        "name": "Mode",
        "type": "string",
        "jsonPath": ".spec.workers.mode",
        "description": "aggregated or disaggregated.",
    },
    {
        "name": "Workers",
        "type": "string",
        "jsonPath": ".status.workersReady",
        "description": "Ready/desired workers.",
    },
    {
        "name": "Hints",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="KvHintsSupported")].status',
        "description": "Whether the worker image's SGLang accepts kv_hints.",
    },
    {
        "name": "Retention",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="RetentionApplied")].reason',
        "description": "Whether SGLang applies kv.retain: Applied, or why not (TransportOnly, ...).",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]


def structural(schema: Schema) -> Schema:
    """A pydantic JSON schema (with ``$defs``) as a structural OpenAPI v3 schema."""
    defs: dict[str, Schema] = schema.get("$defs", {})
    root = {k: v for k, v in schema.items() if k != "$defs"}
    return _rewrite(root, defs)


def _rewrite(node: Schema, defs: dict[str, Schema]) -> Schema:
    node = _inline(node, defs)
    out: Schema = {}
    for key, value in node.items():
        if key in _DROP or (key == "additionalProperties" and value is False):
            continue
        if key == "additionalProperties" and value is True:
            # A free-form object: keep what is written instead of pruning it.
            out["x-kubernetes-preserve-unknown-fields"] = True
            continue
        if key == "default" and value is None:
            continue
        if key == "properties":
            out[key] = {name: _rewrite(sub, defs) for name, sub in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _rewrite(value, defs)
        else:
            out[key] = copy.deepcopy(value)
    if "const" in out:
        out["enum"] = [out.pop("const")]
    # JSON Schema 2020 bounds are numbers; OpenAPI v3.0 (Kubernetes) wants a bound plus a boolean.
    for exclusive, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if exclusive in out and not isinstance(out[exclusive], bool):
            out[bound] = out[exclusive]
            out[exclusive] = True
    if out.get("type") == "integer" and "format" not in out:
        bounded = "maximum" in out and out["maximum"] <= _INT32_MAX
        out["format"] = "int32" if bounded else "int64"
    if out.get("type") == "number" and "format" not in out:
        out["format"] = "double"
    return out


def _inline(node: Schema, defs: dict[str, Schema]) -> Schema:
    """Resolve ``$ref``/``allOf[$ref]``/``anyOf[T, null]``; sibling keys win over the target's."""
    node = dict(node)
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**node.pop("allOf")[0], **node}
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**_inline(target, defs), **node}
    if "anyOf" in node:
        options = node.pop("anyOf")
        non_null = [o for o in options if o.get("type") != "null"]
        if len(non_null) < len(options):
            node["nullable"] = True
        kinds = {o.get("type") for o in non_null}
        if kinds == {"integer", "string"}:
            node["x-kubernetes-int-or-string"] = True
        elif len(non_null) == 1:
            node = {**_inline(non_null[0], defs), **node}
        else:
            raise ValueError(f"cannot express anyOf {options!r} structurally")
    return node


def build_openapi_schema() -> Schema:
    """The ``openAPIV3Schema`` of the one served version."""
    spec = structural(KvRetentionDeploymentSpec.model_json_schema(by_alias=True))
    status = structural(KvRetentionDeploymentStatus.model_json_schema(by_alias=True))
    conditions = status["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    pools = status["properties"]["workers"]["properties"]["pools"]
    pools["x-kubernetes-list-type"] = "map"
    pools["x-kubernetes-list-map-keys"] = ["name"]
    return {
        "type": "object",
        "description": (
            "KvRetentionDeployment runs a hinted SGLang/Mooncake fleet: an OpenAI/Anthropic "
            "frontend, a router, SGLang workers with HiCache, and a Mooncake KV store."
        ),
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "APIVersion of this object."},
            "kind": {"type": "string", "description": "Kind of this object."},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
        "x-kubernetes-validations": [
            {
                "rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
                "message": (
                    f"metadata.name must be at most {MAX_NAME_LENGTH} characters "
                    "(child Service names append up to 9)"
                ),
            },
            {
                "rule": (
                    "!self.spec.gateway.inferencePool.enabled || "
                    f"size(self.metadata.name) <= {PICKER_MAX_NAME_LENGTH}"
                ),
                "message": PICKER_NAME_MESSAGE,
            },
            {
                "rule": f"self.metadata.name.matches('{DNS1035_LABEL_PATTERN}')",
                "message": (
                    "metadata.name must consist of lowercase letters, digits and '-', start with a "
                    "letter and end with a letter or digit (child Service names derive from it)"
                ),
            },
        ],
    }


def build_crd() -> dict[str, Any]:
    """The whole CustomResourceDefinition object."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {LABEL_NAME: APP_NAME},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": build_openapi_schema()},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.workers.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": PRINTER_COLUMNS,
                }
            ],
        },
    }


def render_crd_yaml() -> str:
    """The CRD as the YAML file committed under ``crds/`` (deterministic)."""
    header = "# Generated by `kvretention crds --write crds/` from kvretention.api.models. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=100)
