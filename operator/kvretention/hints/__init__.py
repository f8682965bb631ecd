"""The KV-hint contract: the provider-neutral envelope and the provider normalizers."""

from kvretention.hints.envelope import (
    MAX_TTL_SECONDS,
    WIRE_KEY,
    InvalidKvHint,
    KvHintEnvelope,
    KvRetentionHint,
    envelope_or_none,
)

__all__ = [
    "MAX_TTL_SECONDS",
    "WIRE_KEY",
    "InvalidKvHint",
    "KvHintEnvelope",
    "KvRetentionHint",
    "envelope_or_none",
]
