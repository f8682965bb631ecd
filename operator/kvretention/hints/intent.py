"""What a normalizer read from a request: the envelope, the validated breakpoints, and the fleet policy.

A breakpoint is a provider position (``("system", 1)``, ``("messages", 3, "content", 0)``,
``("input", 2, "output", 0)``) with its TTL. The provider parser that builds the neutral
conversation looks each position up with :meth:`CacheHints.ttl_at` and sets ``retain_ttl`` on the
neutral element it made from that block; the worker resolves the markers to token offsets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from kvretention.hints.envelope import (
    DEFAULT_PRIORITY,
    KvHintEnvelope,
    KvPrefixRetention,
    KvRetentionHint,
)

BreakpointMode = Literal["prefix", "reject"]
"""``prefix`` (v2): a block-level breakpoint retains the prompt up to the end of its block.
``reject`` (v1): every block-level breakpoint is refused, exactly as before."""
BREAKPOINT_MODES: Final[tuple[BreakpointMode, ...]] = ("prefix", "reject")

Position = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Breakpoint:
    """Retain the prompt up to the end of the block at ``path`` for ``ttl_seconds``."""

    path: Position
    ttl_seconds: int

    @property
    def where(self) -> str:
        """The path in Anthropic's dotted style (the trace's and errors' name for it)."""
        return ".".join(str(p) for p in self.path)


@dataclass(frozen=True, slots=True)
class CacheHints:
    """A normalizer's result.

    ``envelope`` is ``None`` when nothing is retained. ``breakpoints`` are in prompt order (only
    in ``prefix`` mode). ``client_controls`` says the client sent a retention control at all
    (``cache_control``, ``prompt_cache_options``, a breakpoint), even one that retains nothing
    (OpenAI explicit mode without breakpoints): the fleet's default TTL never overrides it.
    """

    envelope: KvHintEnvelope | None = None
    breakpoints: tuple[Breakpoint, ...] = ()
    client_controls: bool = False
    _by_path: Mapping[Position, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_path", {b.path: b.ttl_seconds for b in self.breakpoints})

    def ttl_at(self, *path: str | int) -> int | None:
        """The TTL of the breakpoint on the block at ``path``, or ``None``."""
        return self._by_path.get(path)


NO_HINTS: Final = CacheHints()


def build_hints(
    *, full_prompt_ttl: int | None, breakpoints: tuple[Breakpoint, ...], client_controls: bool
) -> CacheHints:
    """The envelope for a full-prompt TTL and/or breakpoints (``None`` when neither is present)."""
    if full_prompt_ttl is None and not breakpoints:
        return CacheHints(client_controls=client_controls) if client_controls else NO_HINTS
    envelope = KvHintEnvelope(
        retain_full_prompt=(
            None if full_prompt_ttl is None else KvRetentionHint(ttl_seconds=full_prompt_ttl)
        ),
        retain_prefixes=KvPrefixRetention(breakpoints=len(breakpoints)) if breakpoints else None,
    )
    return CacheHints(envelope=envelope, breakpoints=breakpoints, client_controls=True)


def build_envelope(
    hints: CacheHints,
    *,
    priority: int = DEFAULT_PRIORITY,
    default_ttl_seconds: int | None = None,
) -> KvHintEnvelope | None:
    """The envelope the frontend sends, with the fleet's policy applied.

    ``default_ttl_seconds`` (``spec.hints.defaultTtlSeconds``) retains the full prompt of a
    request that sent no cache control at all, marked ``origin: "policy"``; ``priority``
    (``spec.hints.priority``) is written only when it is not the default, so a default fleet's
    wire stays the v1 bytes.
    """
    envelope = hints.envelope
    if envelope is None and not hints.client_controls and default_ttl_seconds is not None:
        envelope = KvHintEnvelope(
            retain_full_prompt=KvRetentionHint(ttl_seconds=default_ttl_seconds, origin="policy")
        )
    if envelope is None or priority == DEFAULT_PRIORITY:
        return envelope
    return KvHintEnvelope.model_validate({**envelope.to_wire(), "priority": priority})
