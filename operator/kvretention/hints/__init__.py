"""The KV-hint contract: the provider-neutral envelope and the provider normalizers."""

from typing import Final

from kvretention.hints import anthropic, openai
from kvretention.hints.anthropic import normalize_messages
from kvretention.hints.envelope import (
    MAX_TTL_SECONDS,
    WIRE_KEY,
    InvalidKvHint,
    KvHintEnvelope,
    KvRetentionHint,
    envelope_or_none,
)
from kvretention.hints.errors import CacheControlError, ClientError, ClientErrorCode
from kvretention.hints.openai import normalize_chat_completions, normalize_responses

LONGEST_EMITTED_TTL_SECONDS: Final = max(
    *anthropic.TTLS.values(), *openai.CHAT_TTLS.values(), *openai.RESPONSES_TTLS.values()
)
"""The longest TTL any normalizer emits: a retention tier's maximum pin must hold at least this."""

__all__ = [
    "LONGEST_EMITTED_TTL_SECONDS",
    "MAX_TTL_SECONDS",
    "WIRE_KEY",
    "CacheControlError",
    "ClientError",
    "ClientErrorCode",
    "InvalidKvHint",
    "KvHintEnvelope",
    "KvRetentionHint",
    "envelope_or_none",
    "normalize_chat_completions",
    "normalize_messages",
    "normalize_responses",
]
