"""The provider-neutral KV-hint envelope: the one intent that crosses the frontend boundary.

v1 wire form: ``{"retain_full_prompt": {"ttl_seconds": N}}``. v2 only adds optional keys, so a v1
wire is a valid v2 wire and a v1 receiver keeps the action it knows:

- ``retain_prefixes: {"breakpoints": K}``: the conversation carries K ``retain_ttl`` markers
  ("retain the rendered prompt up to the end of this element"); the worker resolves each to a
  token offset (``kvretention.dataplane.breakpoints``). No offsets travel: only the worker holds
  the tokens.
- ``retain_full_prompt.origin: "policy"``: the retention is the fleet's ``defaultTtlSeconds``
  applied to a request that sent no cache control, not the client's intent (absent = client).
- ``priority``: the fleet's retention priority (0..100) for the ``kv.retain`` directives; absent
  means :data:`DEFAULT_PRIORITY`.

Versioning rule: keys are only ever added and a key's meaning never changes; receivers ignore
unknown keys. A malformed known key is rejected, never widened or guessed.
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from kvretention.common.kv_retain import MAX_PRIORITY

MAX_TTL_SECONDS: Final = 86_400
"""One day: the longest retention any supported provider can ask for, and Mooncake's max soft pin."""

WIRE_KEY: Final = "kv_hints"
"""The top-level key of a ``PreprocessedRequest`` that carries the envelope."""

DEFAULT_PRIORITY: Final = 50
"""The ``kv.retain`` priority when the fleet sets none (``spec.hints.priority``)."""


class InvalidKvHint(ValueError):
    """A received envelope whose known action is malformed."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class KvRetentionHint(BaseModel):
    """Keep the whole prompt's KV pages for at least ``ttl_seconds``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    ttl_seconds: StrictInt = Field(ge=1, le=MAX_TTL_SECONDS)
    origin: Literal["policy"] | None = None
    """``"policy"``: the fleet's default TTL, not the client's intent (absent: the client's)."""


class KvPrefixRetention(BaseModel):
    """The conversation carries ``breakpoints`` ``retain_ttl`` markers for the worker to resolve."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    breakpoints: StrictInt = Field(ge=1)


class KvHintEnvelope(BaseModel):
    """Full-prompt retention, prefix retention (markers on the conversation), or both."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    retain_full_prompt: KvRetentionHint | None = None
    retain_prefixes: KvPrefixRetention | None = None
    priority: StrictInt | None = Field(default=None, ge=0, le=MAX_PRIORITY)

    @classmethod
    def retain(cls, ttl_seconds: int) -> KvHintEnvelope:
        return cls(retain_full_prompt=KvRetentionHint(ttl_seconds=ttl_seconds))

    def is_empty(self) -> bool:
        return self.retain_full_prompt is None and self.retain_prefixes is None

    @property
    def retention_priority(self) -> int:
        """The priority the ``kv.retain`` directives get."""
        return DEFAULT_PRIORITY if self.priority is None else self.priority

    @property
    def prefix_count(self) -> int:
        """How many ``retain_ttl`` markers the conversation must carry (0: none)."""
        return 0 if self.retain_prefixes is None else self.retain_prefixes.breakpoints

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
