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
    ImagePart,
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


def _strip_billing_lines(text: str) -> str | None:
    """``text`` without its billing-header lines; ``None`` when nothing was removed."""
    lines = text.split("\n")
    kept = [line for line in lines if not line.lstrip().startswith(BILLING_HEADER)]
    return None if len(kept) == len(lines) else "\n".join(kept)


def drop_billing_header(messages: list[ChatMessage]) -> tuple[list[ChatMessage], bool]:
    """The conversation without Claude Code's billing-header line in system messages, and whether
    one was dropped. Only that line goes: the rest of the system prompt stays, and a system
    message left empty is dropped."""
    out: list[ChatMessage] = []
    dropped = False
    for message in messages:
        if message.role != "system":
            out.append(message)
            continue
        if isinstance(message.content, str):
            text = _strip_billing_lines(message.content)
            if text is not None:
                dropped = True
                if not text.strip():
                    continue
                message = message.model_copy(update={"content": text})
            out.append(message)
            continue
        parts: list[TextPart | ImagePart] = []
        for part in message.content:
            text = _strip_billing_lines(part.text) if isinstance(part, TextPart) else None
            if text is None:
                parts.append(part)
                continue
            dropped = True
            if text.strip():
                parts.append(part.model_copy(update={"text": text}))
        if not parts:
            continue
        if len(parts) != len(message.content) or dropped:
            message = message.model_copy(update={"content": parts})
        out.append(message)
    return out, dropped
