"""The provider-neutral KV-hint envelope: the one intent that crosses the frontend boundary.

Wire form: ``{"retain_full_prompt": {"ttl_seconds": N}}``. Receivers ignore unknown future fields so
a v1 component keeps the action it knows instead of rejecting a newer sender's request; a malformed
known action is rejected, never widened or guessed.
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

MAX_TTL_SECONDS: Final = 86_400
"""One day: the longest retention any supported provider can ask for, and Mooncake's max soft pin."""

WIRE_KEY: Final = "kv_hints"
"""The top-level key of a ``PreprocessedRequest`` that carries the envelope."""


class InvalidKvHint(ValueError):
    """A received envelope whose known action is malformed."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class KvRetentionHint(BaseModel):
    """Keep the whole prompt's KV pages for at least ``ttl_seconds``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ttl_seconds: StrictInt = Field(ge=1, le=MAX_TTL_SECONDS)


class KvHintEnvelope(BaseModel):
    """The v1 envelope: at most one full-prompt retention action."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    retain_full_prompt: KvRetentionHint | None = None

    @classmethod
    def retain(cls, ttl_seconds: int) -> KvHintEnvelope:
        return cls(retain_full_prompt=KvRetentionHint(ttl_seconds=ttl_seconds))

    def is_empty(self) -> bool:
        return self.retain_full_prompt is None

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent on the wire; actions that are absent are omitted, not null."""
        return self.model_dump(mode="json", exclude_none=True)

    @classmethod
    def from_wire(cls, data: object) -> KvHintEnvelope:
        """Parse a received envelope, raising :class:`InvalidKvHint` on a malformed known action."""
        if not isinstance(data, dict):
            raise InvalidKvHint(
                f"kv_hints must be a JSON object, got {_json_type(data)}", field=WIRE_KEY
            )
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"])
            raise InvalidKvHint(
                f"invalid kv_hints.{loc}: {err['msg']}", field=f"{WIRE_KEY}.{loc}"
            ) from None


def envelope_or_none(data: object) -> KvHintEnvelope | None:
    """Parse an optional wire value; ``None`` and an envelope with no known action mean no hint."""
    if data is None:
        return None
    env = KvHintEnvelope.from_wire(data)
    return None if env.is_empty() else env


def _json_type(value: object) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array"}
    return "null" if value is None else names.get(type(value), type(value).__name__)
