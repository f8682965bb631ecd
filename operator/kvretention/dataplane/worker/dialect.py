"""Which ``kv_hints`` dialect an engine speaks, and the hint in that dialect.

SGLang's surface moves: older releases have no ``kv_hints`` parameter (``none``), the design this
project follows passes the flat envelope (``flat``), and 0.5.23 validates a versioned actions
envelope with ``sglang.srt.managers.kv_hints.decode_kv_hints_envelope`` (``versioned``). The
versioned dialect speaks the ecosystem's ``kv.retain`` 1.0 action: token ranges with a priority
and a duration, full-prompt retention being ``[0, prompt_tokens)``. The flat dialect can carry the
full prompt only, so a prefix hint on such an engine is refused (:class:`PrefixHintUnsupported`,
a 501), never widened. Everything here is pure so the worker and ``kvretention probe`` decide the
same way.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any, Final

from kvretention.common.kv_retain import (
    ACTION_TYPE,
    ACTION_VERSION,
    MAX_DIRECTIVES,
    MAX_DURATION_SECONDS,
    PROTOCOL_VERSION,
)
from kvretention.common.kv_retain import MAX_ACTIONS as MAX_RETAIN_ACTIONS
from kvretention.dataplane.breakpoints import ResolvedBreakpoint, plan_retain_directives
from kvretention.hints.envelope import WIRE_KEY, KvHintEnvelope

VERSIONED_MODULE: Final = "sglang.srt.managers.kv_hints"
VERSIONED_DECODER: Final = "decode_kv_hints_envelope"

__all__ = [
    "ACTION_TYPE",
    "ACTION_VERSION",
    "MAX_DIRECTIVES",
    "MAX_DURATION_SECONDS",
    "MAX_RETAIN_ACTIONS",
    "PROTOCOL_VERSION",
    "Dialect",
    "PrefixHintUnsupported",
    "build_kv_hints",
    "detect_dialect",
    "parameter_names",
    "require_support",
]


class Dialect(StrEnum):
    """How an engine takes ``kv_hints``."""

    NONE = "none"
    FLAT = "flat"
    VERSIONED = "versioned"


class PrefixHintUnsupported(ValueError):
    """A prefix-retention hint for an engine whose dialect cannot carry token ranges.

    The worker answers ``kv_hints_unsupported`` (501) with this message; widening the prefixes
    to the whole prompt is never an option.
    """

    def __init__(self, dialect: Dialect) -> None:
        super().__init__(
            f"the serving engine takes the {dialect.value} kv_hints dialect, which can retain only "
            "the full prompt; this request's prefix breakpoints (block-level 'cache_control' or "
            "'prompt_cache_breakpoint') need kv.retain token ranges (SGLang >= 0.5.23)"
        )
        self.dialect = dialect


def detect_dialect(parameters: Iterable[str], *, has_versioned_decoder: bool) -> Dialect:
    """``none`` without a ``kv_hints`` parameter; ``versioned`` when SGLang ships the decoder."""
    if WIRE_KEY not in set(parameters):
        return Dialect.NONE
    return Dialect.VERSIONED if has_versioned_decoder else Dialect.FLAT


def parameter_names(fn: Callable[..., Any]) -> list[str]:
    """Parameter names of a (bound or unbound) callable, without ``self``."""
    return [name for name in inspect.signature(fn).parameters if name != "self"]


def require_support(envelope: KvHintEnvelope, dialect: Dialect) -> None:
    """Raise :class:`PrefixHintUnsupported` for prefix retention on the flat dialect.

    Cheap: call it before rendering. (The ``none`` dialect refuses every hint; the caller checks.)
    """
    if envelope.retain_prefixes is not None and dialect is Dialect.FLAT:
        raise PrefixHintUnsupported(dialect)


def retained_tokens(kv_hints: Mapping[str, Any] | None, *, prompt_tokens: int) -> int | None:
    """The end of what ``kv_hints`` retains (from token 0): the last range's end, or the whole
    prompt for the flat dialect; ``None`` without a hint."""
    if kv_hints is None:
        return None
    if "retain_full_prompt" in kv_hints:
        return prompt_tokens
    ends = [
        int(d["end"])
        for action in kv_hints.get("actions", ())
        for d in action.get("payload", {}).get("directives", ())
    ]
    return max(ends, default=0)


def build_kv_hints(
    envelope: KvHintEnvelope,
    dialect: Dialect,
    *,
    request_id: str,
    prompt_tokens: int,
    prefixes: Sequence[ResolvedBreakpoint] = (),
    scope: str | None = None,
) -> dict[str, Any] | None:
    """The ``kv_hints`` argument for ``Engine.async_generate``; ``None`` when nothing is retained.

    ``prompt_tokens`` is the rendered prompt's token count (full-prompt retention is
    ``[0, prompt_tokens)``); ``prefixes`` are the envelope's breakpoints resolved by
    :func:`kvretention.dataplane.breakpoints.resolve_breakpoints`. ``None`` for an empty
    envelope or the ``none`` dialect: the caller must have rejected a hinted request on such an
    engine already, so ``None`` here never means a silently dropped hint. The one other ``None``
    is a prefix-only hint whose every breakpoint was dropped as unresolvable (the resolution says
    why, for the trace).
    """
    full = envelope.retain_full_prompt
    if envelope.is_empty() or dialect is Dialect.NONE:
        return None
    require_support(envelope, dialect)
    if dialect is Dialect.FLAT:
        assert full is not None  # prefix hints were refused above
        return {"retain_full_prompt": {"ttl_seconds": full.ttl_seconds}}
    ranges = [(p.token_end, p.ttl_seconds) for p in prefixes]
    for end, _ in ranges:
        if end > prompt_tokens:
            raise ValueError(f"a breakpoint at token {end} lies past the prompt ({prompt_tokens})")
    if full is not None and prompt_tokens > 0:
        ranges.append((prompt_tokens, full.ttl_seconds))
    if not ranges:
        return None
    directives = plan_retain_directives(ranges, priority=envelope.retention_priority)
    return {
        "protocol_version": PROTOCOL_VERSION,
        "message_id": request_id,
        "actions": [
            {
                "action_id": f"{request_id}/{ACTION_TYPE}",
                "action_type": ACTION_TYPE,
                "action_version": ACTION_VERSION,
                "payload": {"scope": scope, "directives": [d.to_wire() for d in directives]},
            }
        ],
    }
