"""What the frontend tells the router about placement, so the router never parses bodies.

- The **session key**: the first of an ordered list of sources that the request carries: headers
  (``x-session-id``; Codex's ``session_id``; ``x-claude-code-session-id``) or body fields (Anthropic
  ``metadata.user_id``, where Claude Code puts its session). ``prompt_cache_key`` is deliberately
  not a source: it is a cache-routing hint in the provider contract, not affinity.
- The **prefix chain** for cache-aware placement: one hash per conversation block (the tools and
  leading system messages as one block, then each message), each hash covering every block
  before it, so two requests share the first ``n`` hashes exactly when they share the first ``n``
  blocks. The frontend sends it in ``x-kvr-prefix``.
- The **Claude Code billing header**: Claude Code's first system block
  (``x-anthropic-billing-header: cc_version=...; cch=...;``) changes on every request, so no two
  requests would share a prefix; it is dropped before templating (``--no-normalize-clients`` keeps it).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from kvretention.dataplane.protocol import (
    DEFAULT_SESSION_KEYS,
    ChatMessage,
    TextPart,
    ToolDefinition,
)

__all__ = ["DEFAULT_SESSION_KEYS", "drop_billing_header", "prefix_chain", "session_key"]

BODY_PREFIX: Final = "metadata."
MAX_SESSION_KEY: Final = 512
FULL_CHAIN_BLOCKS: Final = 32
"""Every hash up to this many blocks; past it every ``CHAIN_STRIDE``-th and the last one, so a
long agent conversation's header stays small while each position stays stable between turns."""
CHAIN_STRIDE: Final = 8
BILLING_HEADER: Final = "x-anthropic-billing-header:"


def session_key(
    keys: Sequence[str], *, headers: Mapping[str, str], body: Mapping[str, Any]
) -> str | None:
    """The first non-empty source in ``keys``; header names are case-insensitive."""
    for key in keys:
        if key.startswith(BODY_PREFIX):
            metadata = body.get("metadata")
            value = (
                metadata.get(key.removeprefix(BODY_PREFIX)) if isinstance(metadata, dict) else None
            )
        else:
            value = headers.get(key)
        if isinstance(value, str) and value:
            return value[:MAX_SESSION_KEY]
    return None


def _digest(previous: bytes, block: bytes) -> bytes:
    return hashlib.blake2b(previous + block, digest_size=8).digest()


def prefix_chain(messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition]) -> list[str]:
    """Hex hashes of the conversation's block prefixes, shortest first (see the module docstring)."""
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    first = json.dumps(
        {
            "tools": [t.model_dump(mode="json", exclude_none=True) for t in tools],
            "system": [m.model_dump(mode="json") for m in messages[:head]],
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    blocks = [first, *(m.model_dump_json().encode() for m in messages[head:])]
    chain: list[str] = []
    digest = b""
    last = len(blocks) - 1
    for i, block in enumerate(blocks):
        digest = _digest(digest, block)
        if i < FULL_CHAIN_BLOCKS or i % CHAIN_STRIDE == 0 or i == last:
            chain.append(digest.hex())
    return chain


def is_billing_header(message: ChatMessage) -> bool:
    """A system message that is only Claude Code's per-request billing header."""
    return message.role == "system" and message.text().lstrip().startswith(BILLING_HEADER)


def drop_billing_header(messages: list[ChatMessage]) -> tuple[list[ChatMessage], bool]:
    """The conversation without Claude Code's billing-header system text, and whether one was
    dropped. A system message made of several blocks keeps its other blocks."""
    out: list[ChatMessage] = []
    dropped = False
    for message in messages:
        if message.role != "system":
            out.append(message)
            continue
        if isinstance(message.content, str):
            if is_billing_header(message):
                dropped = True
                continue
            out.append(message)
            continue
        kept = [
            p
            for p in message.content
            if not (isinstance(p, TextPart) and p.text.lstrip().startswith(BILLING_HEADER))
        ]
        if len(kept) != len(message.content):
            dropped = True
            if not kept:
                continue
            message = message.model_copy(update={"content": kept})
        out.append(message)
    return out, dropped
