"""The ``KvRetentionDeployment`` API: the whole object, its identity, and one import for the spec
(:mod:`kvretention.api.spec`) and status (:mod:`kvretention.api.status`) models it is built from."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvretention.api.names import CONDITION_TYPES as CONDITION_TYPES
from kvretention.api.names import FIELD_MANAGER as FIELD_MANAGER
from kvretention.api.spec import *  # noqa: F403  (re-exported: one import for the whole API)
from kvretention.api.spec import (
    MAX_NAME_LENGTH,
    PICKER_MAX_NAME_LENGTH,
    PICKER_NAME_MESSAGE,
    KvRetentionDeploymentSpec,
)
from kvretention.api.status import *  # noqa: F403
from kvretention.api.status import KvRetentionDeploymentStatus

GROUP: Final = "kvretention.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "KvRetentionDeployment"
PLURAL: Final = "kvretentiondeployments"
SINGULAR: Final = "kvretentiondeployment"
SHORT_NAMES: Final = ("kvrd",)
CATEGORIES: Final = ("kvretention",)


class SpecError(ValueError):
    """A KvRetentionDeployment body that does not validate; ``str()`` is readable, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class KvRetentionDeployment(BaseModel):
    """A whole object as the API server or a YAML file has it."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    api_version: Literal["kvretention.io/v1alpha1"] = Field(
        default="kvretention.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["KvRetentionDeployment"] = KIND
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: KvRetentionDeploymentSpec
    status: KvRetentionDeploymentStatus | None = None

    @property
    def name(self) -> str:
        return str(self.metadata.get("name", ""))

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "default")

    @classmethod
    def from_k8s(cls, body: Mapping[str, Any]) -> KvRetentionDeployment:
        """Validate a body from the API server or a YAML file; raise :class:`SpecError`."""
        problems = _metadata_problems(body.get("metadata"))
        try:
            obj = cls.model_validate(dict(body))
        except ValidationError as exc:
            raise SpecError(problems + _readable(exc)) from None
        problems += _picker_name_problems(obj)
        if problems:
            raise SpecError(problems)
        return obj


def _picker_name_problems(obj: KvRetentionDeployment) -> list[str]:
    """The CEL rule on the whole object: the picker's Service name must stay a DNS label."""
    picker = obj.spec.gateway.inference_pool.enabled
    return [PICKER_NAME_MESSAGE] if picker and len(obj.name) > PICKER_MAX_NAME_LENGTH else []


DNS1035_LABEL_PATTERN: Final = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
"""What a CR name must match so that its child Service names are valid (also a CEL rule)."""
_DNS1035_LABEL: Final = re.compile(DNS1035_LABEL_PATTERN)
_DNS1123_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def _metadata_problems(metadata: object) -> list[str]:
    """The name must make valid child names: Services named ``<name>-<suffix>`` are DNS-1035
    labels, which the API server does not demand of a custom resource's own name."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, Mapping):
        return ["metadata: must be an object"]
    problems = []
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        problems.append("metadata.name: required")
    elif len(name) > MAX_NAME_LENGTH:
        problems.append(f"metadata.name: at most {MAX_NAME_LENGTH} characters, got {len(name)}")
    elif not _DNS1035_LABEL.match(name):
        problems.append(
            f"metadata.name: {name!r} must consist of lowercase letters, digits and '-', start "
            "with a letter and end with a letter or digit (child Service names derive from it)"
        )
    namespace = metadata.get("namespace")
    if namespace is not None and (
        not isinstance(namespace, str)
        or (namespace and (len(namespace) > 63 or not _DNS1123_LABEL.match(namespace)))
    ):
        problems.append(f"metadata.namespace: {namespace!r} is not a valid namespace name")
    return problems


def _readable(exc: ValidationError) -> list[str]:
    """One ``path: message`` line per pydantic error, with wire (camelCase) paths."""
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"] if not str(p).startswith("function-after"))
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}" if loc else msg)
    return lines
