"""The KV-hint contract: the provider-neutral envelope and the provider normalizers.

``hints_from_*`` (v2) return :class:`CacheHints` (envelope + validated breakpoints) and take the
fleet's ``breakpoints`` mode; ``normalize_*`` are the v1 entry points (``reject`` mode's envelope).
"""

from typing import Final

from kvretention.hints import anthropic, openai
from kvretention.hints.anthropic import hints_from_messages, normalize_messages
from kvretention.hints.envelope import (
    DEFAULT_PRIORITY,
    MAX_TTL_SECONDS,
    WIRE_KEY,
    InvalidKvHint,
    KvHintEnvelope,
    KvPrefixRetention,
    KvRetentionHint,
    envelope_or_none,
)
from kvretention.hints.errors import CacheControlError, ClientError, ClientErrorCode
from kvretention.hints.intent import (
    BREAKPOINT_MODES,
    Breakpoint,
    BreakpointMode,
    CacheHints,
    build_envelope,
)
from kvretention.hints.openai import (
    hints_from_chat_completions,
    hints_from_responses,
    normalize_chat_completions,
    normalize_responses,
)

LONGEST_EMITTED_TTL_SECONDS: Final = max(
    *anthropic.TTLS.values(), *openai.CHAT_TTLS.values(), *openai.RESPONSES_TTLS.values()
)
"""The longest TTL any normalizer emits: a retention tier's maximum pin must hold at least this."""

__all__ = [
    "BREAKPOINT_MODES",
    "DEFAULT_PRIORITY",
    "LONGEST_EMITTED_TTL_SECONDS",
    "MAX_TTL_SECONDS",
    "WIRE_KEY",
    "Breakpoint",
    "BreakpointMode",
    "CacheControlError",
    "CacheHints",
    "ClientError",
    "ClientErrorCode",
    "InvalidKvHint",
    "KvHintEnvelope",
    "KvPrefixRetention",
    "KvRetentionHint",
    "build_envelope",
    "envelope_or_none",
    "hints_from_chat_completions",
    "hints_from_messages",
    "hints_from_responses",
    "normalize_chat_completions",
    "normalize_messages",
    "normalize_responses",
]
