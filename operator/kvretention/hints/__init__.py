"""The KV-hint contract: the provider-neutral envelope and the provider normalizers."""

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

__all__ = [
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
