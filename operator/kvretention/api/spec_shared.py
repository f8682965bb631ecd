"""The spec's shared parts: image and fleet-name limits, quantities, image references, and the pod
options (resources, tolerations, placement) every component's pods take."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    Field,
    field_validator,
)

from kvretention.api.base import WireModel, cel_rules, list_field, map_field, require
from kvretention.api.quantity import (
    QUANTITY_MAX_LENGTH,
    QUANTITY_MESSAGE,
    QUANTITY_RULE,
    quantity_problem,
)
from kvretention.hints import LONGEST_EMITTED_TTL_SECONDS

__all__ = [
    "DEFAULT_IMAGE",
    "DEFAULT_WORKER_IMAGE",
    "LARGEST_HINT_TTL_SECONDS",
    "MAX_NAME_LENGTH",
    "MAX_REPLICAS",
    "MAX_SOFT_PIN_TTL_SECONDS",
    "LocalObjectReference",
    "PodOptions",
    "Quantity",
    "Replicas",
    "ResourceRequirements",
    "SoftPinTtlSeconds",
    "Toleration",
]


DEFAULT_IMAGE: Final = "ghcr.io/kvretention/kvretention:0.1.0"
"""The operator's own image: runs ``kvretention frontend`` and ``kvretention router``."""
DEFAULT_WORKER_IMAGE: Final = "ghcr.io/kvretention/worker:0.1.0"
"""SGLang + Mooncake + this package's worker; also ships ``mooncake_master``."""

MAX_NAME_LENGTH: Final = 54
"""Longest CR name whose child Service names (``<name>-mooncake``) stay DNS-1035 labels (63)."""
LARGEST_HINT_TTL_SECONDS: Final = LONGEST_EMITTED_TTL_SECONDS
"""The longest TTL the frontend emits (OpenAI Responses ``12h``): a soft pin must hold it."""
MAX_SOFT_PIN_TTL_SECONDS: Final = 86_400
SoftPinTtlSeconds = Annotated[int, Field(ge=1, le=MAX_SOFT_PIN_TTL_SECONDS)]
"""A retention TTL in seconds the store can hold as one soft pin: 1 to
:data:`MAX_SOFT_PIN_TTL_SECONDS`."""
MAX_REPLICAS: Final = 1000

Share = Annotated[float, Field(gt=0.0, le=1.0)]
"""A part of a whole: above 0, and at most all of it."""
Fraction = Annotated[float, Field(gt=0.0, lt=1.0)]
"""A part of a whole short of all of it: above 0 and below 1."""

Replicas = Annotated[int, Field(ge=0, le=MAX_REPLICAS)]
"""A count of pods (or multinode workers) a spec asks for: replicas, a rollout's surge and
unavailability; 0 is allowed."""

Quantity = Annotated[
    int | str,
    Field(
        description="A Kubernetes resource quantity, such as 2, 500m or 16Gi.",
        json_schema_extra={"maxLength": QUANTITY_MAX_LENGTH},
    ),
]

_DOMAIN_PART = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN: Final = (
    # distribution/reference's grammar, [domain[:port]/]path[:tag][@digest], where a first
    # component is a domain only with a dot, a port, or as localhost (else it is a path part)
    rf"^(?:(?:{_DOMAIN_PART}(?:\.{_DOMAIN_PART})+(?::[0-9]+)?|{_DOMAIN_PART}:[0-9]+|localhost)/)?"
    rf"{_PATH_PART}(?:/{_PATH_PART})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)
"""An image reference a Pod accepts and a runtime can pull: no spaces, a lowercase path."""
_IMAGE: Final = re.compile(IMAGE_PATTERN)
IMAGE_RULE: Final = "self.matches('" + IMAGE_PATTERN.replace("\\", "\\\\") + "')"
IMAGE_MESSAGE: Final = (
    "must be an image reference such as ghcr.io/org/name:tag or name@sha256:<hex>: no spaces, "
    "a lowercase repository path, a tag of letters, digits, '_', '.' and '-'"
)


def _check_image(value: str) -> str:
    require(_IMAGE.fullmatch(value) is not None, IMAGE_MESSAGE)
    return value


Image = Annotated[
    str,
    AfterValidator(_check_image),
    Field(min_length=1, max_length=1024, json_schema_extra=cel_rules((IMAGE_RULE, IMAGE_MESSAGE))),
]
"""A container image reference, checked at admission (CEL) and by ``render`` alike."""


# --- shared ---------------------------------------------------------------------------------------


_QUANTITIES: Final[dict[str, Any]] = {
    "maxProperties": 16,
    "x-kubernetes-validations": [
        {
            "rule": QUANTITY_RULE,
            "message": QUANTITY_MESSAGE,
        }
    ],
}


DEFAULT_SERVICE_REQUESTS: Final[dict[str, str]] = {"cpu": "100m", "memory": "128Mi"}
"""What a frontend, router or Mooncake master container requests when its ``resources`` are
unset: a pod that requests nothing is BestEffort, the first evicted and the last to get CPU on a
node whose cores are busy prefilling (its probes then time out and it leaves its Service)."""
UNSET_REQUESTS: Final = (
    "Unset: requests cpu 100m and memory 128Mi, so the pod is never BestEffort (the last to "
    "get CPU on a busy node, the first evicted)."
)


class ResourceRequirements(WireModel):
    """Container CPU/memory/accelerator requests and limits (the Kubernetes shape).

    Every value is a quantity within what one node can have (:data:`NODE_BOUNDS`): CEL at
    admission, the same table's check here."""

    requests: dict[str, Quantity] | None = Field(
        default=None,
        description="Minimum resources the scheduler reserves, e.g. {cpu: 2, memory: 8Gi}.",
        json_schema_extra=_QUANTITIES,
    )
    limits: dict[str, Quantity] | None = Field(
        default=None,
        description="Maximum resources the container may use, e.g. {nvidia.com/gpu: 1}.",
        json_schema_extra=_QUANTITIES,
    )

    @field_validator("requests", "limits")
    @classmethod
    def _within_a_node(cls, value: dict[str, int | str] | None) -> dict[str, int | str] | None:
        problems = [
            problem
            for key, quantity in sorted((value or {}).items())
            if (problem := quantity_problem(key, quantity)) is not None
        ]
        require(not problems, "; ".join(problems))
        return value


class Toleration(WireModel):
    """A Kubernetes toleration (the core/v1 shape): lets pods onto nodes with a matching taint."""

    key: str | None = Field(
        default=None, max_length=316, description="Taint key; empty with Exists matches every key."
    )
    operator: Literal["Exists", "Equal"] | None = Field(
        default=None, description="Exists or Equal (Kubernetes' default: Equal)."
    )
    value: str | None = Field(
        default=None, max_length=63, description="Taint value to match (operator Equal)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches every effect."
    )
    toleration_seconds: int | None = Field(
        default=None,
        ge=0,
        description="NoExecute only: how long the pod stays bound after the taint appears.",
    )


class LocalObjectReference(WireModel):
    """A reference to an object in the fleet's namespace, by name."""

    name: str = Field(min_length=1, max_length=253, description="The object's name.")


_K8S_OBJECTS = "Kubernetes {} objects, passed through as is (the API server validates them)."
_MapValue = Annotated[str, Field(max_length=63 * 1024, description="The value for this key.")]


# Pass-through items: free-form objects the API server validates as the named kind.
_EnvVar = Annotated[dict[str, Any], Field(description="One Kubernetes EnvVar.")]
_Volume = Annotated[dict[str, Any], Field(description="One Kubernetes Volume.")]
_VolumeMount = Annotated[dict[str, Any], Field(description="One Kubernetes VolumeMount.")]
_TopologySpreadConstraint = Annotated[
    dict[str, Any], Field(description="One Kubernetes TopologySpreadConstraint.")
]


class PodOptions(WireModel):
    """Where this component's pods run and as whom: passed through to the pod template.

    The operator's own settings win: labels it selects on, its env, volumes and mounts cannot be
    overridden (``InvalidSpec``).
    """

    labels: dict[str, _MapValue] = map_field(
        64, "Extra pod labels (the operator's app.kubernetes.io/* labels are reserved)."
    )
    annotations: dict[str, _MapValue] = map_field(64, "Extra pod annotations.")
    node_selector: dict[str, _MapValue] = map_field(
        64, "Node labels the pods must run on (pod spec nodeSelector)."
    )
    tolerations: list[Toleration] = list_field(
        64, "Tolerations, e.g. for tainted GPU nodes (pod spec tolerations)."
    )
    affinity: dict[str, Any] | None = Field(
        default=None,
        description=(
            "A Kubernetes Affinity object (nodeAffinity, podAffinity, podAntiAffinity), passed "
            "through as is (the API server validates it)."
        ),
    )
    topology_spread_constraints: list[_TopologySpreadConstraint] = list_field(
        16, _K8S_OBJECTS.format("TopologySpreadConstraint")
    )
    priority_class_name: str | None = Field(
        default=None, max_length=253, description="PriorityClass of the pods."
    )
    runtime_class_name: str | None = Field(
        default=None, max_length=253, description="RuntimeClass of the pods (e.g. nvidia)."
    )
    image_pull_secrets: list[LocalObjectReference] = list_field(
        16, "Secrets with registry credentials for the images."
    )
    service_account_name: str | None = Field(
        default=None,
        max_length=253,
        description="ServiceAccount the pods run as (default: the namespace's default).",
    )
    env: list[_EnvVar] = list_field(
        128,
        _K8S_OBJECTS.format("EnvVar (name, value or valueFrom)")
        + " Added to the main container; the operator's own variables cannot be overridden.",
    )
    volumes: list[_Volume] = list_field(64, _K8S_OBJECTS.format("Volume") + " Added to the pod.")
    volume_mounts: list[_VolumeMount] = list_field(
        64, _K8S_OBJECTS.format("VolumeMount") + " Added to the main container."
    )


def _pod_field(component: str) -> Any:
    return Field(
        default=None,
        description=(
            f"Placement and identity of the {component} pods: tolerations, nodeSelector, affinity, "
            "topology spread, priority and runtime class, image pull secrets, service account, "
            "labels, annotations, extra env and volumes."
        ),
    )
