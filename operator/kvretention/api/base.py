"""The base every ``KvRetentionDeployment`` model shares: camelCase on the wire, strict, frozen; and
the small helpers the spec models use to spell out defaults and CEL rules."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class WireModel(BaseModel):
    """camelCase on the wire, snake_case in Python; unknown fields are an error.

    Strict, as the API server is: ``replicas: "2"`` or ``openai: "false"`` is refused, not coerced
    (an integer is still a valid ``number``, as in the OpenAPI schema).
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        strict=True,
    )


def nested(factory: type[WireModel], description: str) -> Any:
    """A nested object that defaults to its own defaults.

    The CRD spells the default out in full: the API server checks a default against the CEL rules
    without applying the nested defaults first, so ``default: {}`` would fail rules that read them.
    """
    default = factory().model_dump(mode="json", by_alias=True, exclude_none=True)
    return Field(
        default_factory=factory, description=description, json_schema_extra={"default": default}
    )


def port_field(default: int | None, description: str) -> Any:
    """A TCP port field (1-65535)."""
    return Field(default=default, ge=1, le=65535, description=description)


def list_field(max_length: int, description: str, **extra: Any) -> Any:
    """A list that defaults to empty and holds at most ``max_length`` items (``extra``: more
    ``Field`` arguments)."""
    return Field(default_factory=list, max_length=max_length, description=description, **extra)


def map_field(max_properties: int, description: str) -> Any:
    """A string map that defaults to empty and holds at most ``max_properties`` keys."""
    return Field(
        default_factory=dict,
        description=description,
        json_schema_extra={"maxProperties": max_properties},
    )


def cel_config(*rules: tuple[str, str]) -> ConfigDict:
    """A model's config that adds these (CEL rule, message) validations to its schema."""
    return ConfigDict(json_schema_extra=cel_rules(*rules))


def cel_rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """``x-kubernetes-validations`` for a model: (CEL rule, message) pairs."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
