"""What the frontend tells the router about placement, so the router never parses bodies.

- The **session key**: the first of an ordered list of sources that the request carries: headers
  (``x-session-id``; ``x-dynamo-session-id``; Codex's ``thread-id``, ``session-id`` and older
  ``session_id``; ``x-claude-code-session-id``) or body fields (Codex's
  ``client_metadata.session_id``; Anthropic ``metadata.user_id``, where Claude Code puts its
  session). ``prompt_cache_key`` is deliberately not a source: it is a cache-routing hint in the
  provider contract, not affinity.
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
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from kvretention.dataplane.frontend.repeats import Walks
from kvretention.dataplane.protocol import (
    BODY_SESSION_OBJECTS,
    DEFAULT_SESSION_KEYS,
    MAX_PREFIX_HASHES,
    ChatMessage,
    ImagePart,
    TextPart,
    ToolDefinition,
    memo_of,
)

__all__ = [
    "DEFAULT_SESSION_KEYS",
    "drop_billing_header",
    "header_safe",
    "prefix_chain",
    "session_key",
]

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
        owner, dot, name = key.partition(".")
        if dot and owner in BODY_SESSION_OBJECTS:
            fields = body.get(owner)
            value = fields.get(name) if isinstance(fields, dict) else None
        else:
            value = headers.get(key)
        if isinstance(value, str) and value:
            return value[:MAX_SESSION_KEY]
    return None


def header_safe(value: str) -> str:
    """The key as it can travel in a header: printable ASCII as is, anything else (control
    characters, non-ASCII from a body field) replaced by a stable digest of it."""
    if value.isascii() and value.isprintable():
        return value
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def _message_bytes(message: ChatMessage) -> bytes:
    """What identifies a message, cheaply: plain attribute reads, no model serialization (this
    runs on every request over histories of hundreds of kilobytes)."""
    fields: list[str] = [message.role, message.tool_call_id or "", message.name or ""]
    if isinstance(message.content, str):
        fields.append(message.content)
    else:
        fields.extend(p.text if isinstance(p, TextPart) else p.url for p in message.content)
    if message.reasoning is not None:
        fields.append(message.reasoning.text)
    for call in message.tool_calls:
        fields.extend((call.id, call.name, call.arguments))
    return "\x1f".join(fields).encode("utf-8", "surrogatepass")


def _head_bytes(
    system: Sequence[ChatMessage], tools: Sequence[ToolDefinition], *, tenant: str | None = None
) -> bytes:
    parts = [_message_bytes(m) for m in system]
    for tool in tools:
        known = _TOOLS.get(id(tool))
        if known is not None and known[0] is tool:
            parts.append(known[1])
            continue
        schema = _schema_text(tool.parameters, tenant=tenant) if tool.parameters else ""
        text = f"{tool.kind}\x1f{tool.name}\x1f{tool.description or ''}\x1f{schema}".encode()
        parts.append(text)
        _TOOLS[id(tool)] = (tool, text)  # holds the tool: its id is not reused meanwhile
        while len(_TOOLS) > MAX_SCHEMAS:
            _TOOLS.pop(next(iter(_TOOLS)), None)
    return b"\x1e".join(parts)


def _schema_text(schema: Mapping[str, Any], *, tenant: str | None = None) -> str:
    """``json.dumps(schema, sort_keys=True)``, remembered by the schema's msgspec encoding: it
    tells apart every JSON value (``1``, ``1.0`` and ``true``; each string) except NaN and the
    infinities, which it writes as ``null`` (a schema whose encoding holds ``null`` is not
    remembered). An agent resends the same tool schemas on every turn; remembered per
    ``tenant``, so no tenant's request is faster for another's tools."""
    try:
        encoded = _ENCODE(schema)
    except (OverflowError, TypeError, UnicodeEncodeError, msgspec.EncodeError):
        return json.dumps(schema, sort_keys=True)
    key = (tenant, encoded)
    text = _SCHEMAS.get(key)
    if text is None:
        text = json.dumps(schema, sort_keys=True)
        if b"null" not in encoded:
            _SCHEMAS[key] = text
            while len(_SCHEMAS) > MAX_SCHEMAS:
                _SCHEMAS.pop(next(iter(_SCHEMAS)))
    return text


_ENCODE: Final = msgspec.json.Encoder().encode
_SCHEMAS: Final[dict[tuple[str | None, bytes], str]] = {}
MAX_SCHEMAS: Final = 1024
"""Tool schemas remembered (oldest out first); as many tools' head bytes in ``_TOOLS``."""
_TOOLS: Final[dict[int, tuple[ToolDefinition, bytes]]] = {}
"""A tool's part of the chain's head, by the tool object: the frontend shares one definition
between the turns that resend its bytes (``Resumer.derived``). A ``ToolDefinition`` is frozen,
and nothing changes its ``parameters`` in place (they are the decoded body's, read-only)."""


def prefix_chain(
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolDefinition],
    *,
    tenant: str | None = None,
) -> list[str]:
    """Hex hashes of the conversation's block prefixes, shortest first (see the module
    docstring). What it remembers between requests is ``tenant``'s: another tenant's identical
    head is hashed anew (a shared memory would answer it faster); the messages' memos and the
    walks are by object, and no tenant's parse holds another's objects (``resume.py``)."""
    head = 0
    while head < len(messages) and messages[head].role in ("system", "developer"):
        head += 1
    first = _head(tenant, _head_bytes(messages[:head], tools, tenant=tenant))
    rest = messages[head:]
    # the hashers after the messages this conversation's last request had too, then the rest
    same, after, ids = _CHAINS.repeated(rest, context=first)
    hasher = after[-1][0] if after else first
    for message in rest[same:]:
        # each message object remembers the hasher it was hashed after and the result (a
        # conversation seen before the walk above forgot it); identity keeps this exact
        memo = memo_of(message)
        if memo.before is not hasher:
            step = hasher.copy()
            step.update(b"\x1d" + _message_bytes(message))
            memo.before, memo.after = hasher, step
        hasher = memo.after
        after.append([hasher, None])
    _CHAINS.keep(rest, ids, after, context=first)
    chain = [first.hexdigest()]
    for i in _chain_positions(len(rest)):
        step = after[i - 1]
        if step[1] is None:
            step[1] = step[0].hexdigest()
        chain.append(step[1])
    return chain


def _chain_positions(n: int) -> list[int]:
    """The block counts the chain has a hash for: each up to :data:`FULL_CHAIN_BLOCKS`, then
    every :data:`CHAIN_STRIDE`-th, and ``n``; past :data:`MAX_PREFIX_HASHES` hashes (~3,600
    blocks) only the stable leading positions and ``n``, so the header fits what the router
    parses and a conversation's turns still share the same leading hashes."""
    full = min(n + 1, FULL_CHAIN_BLOCKS)
    first_stride = -(-FULL_CHAIN_BLOCKS // CHAIN_STRIDE) * CHAIN_STRIDE
    positions = [*range(1, full), *range(first_stride, n + 1, CHAIN_STRIDE)]
    if n and positions[-1] != n:
        positions.append(n)
    room = MAX_PREFIX_HASHES - 1  # the head block's hash comes first
    if len(positions) > room:
        positions[room - 1 :] = [n]
    return positions


_CHAINS: Final[Walks[list[Any]]] = Walks()
"""Per conversation, ``[hasher, hex digest or None]`` after each message past the head."""


_HEADS: Final[OrderedDict[tuple[str | None, bytes], Any]] = OrderedDict()
"""(tenant, head block bytes) -> its hasher, for the most recent heads (one object per head, so the
messages after it find the hasher they were hashed after)."""
MAX_HEADS: Final = 256


def _head(tenant: str | None, data: bytes) -> Any:
    key = (tenant, data)
    hasher = _HEADS.get(key)
    if hasher is not None:
        _HEADS.move_to_end(key)
    else:
        hasher = _HEADS[key] = hashlib.blake2b(data, digest_size=8)
        while len(_HEADS) > MAX_HEADS:
            _HEADS.popitem(last=False)
    return hasher


def _strip_billing_lines(text: str) -> str | None:
    """``text`` without its billing-header lines; ``None`` when nothing was removed."""
    lines = text.split("\n")
    kept = [line for line in lines if not line.lstrip().startswith(BILLING_HEADER)]
    return None if len(kept) == len(lines) else "\n".join(kept)


def drop_billing_header(messages: list[ChatMessage]) -> tuple[list[ChatMessage], bool]:
    """The conversation without Claude Code's billing-header line in system messages, and whether
    one was dropped. Only that line goes: the rest of the system prompt stays, and a system
    message left empty is dropped."""
    head = 0
    while head < len(messages) and messages[head].role == "system":
        head += 1
    rest = messages[head:]
    # after[i]: whether rest[: i + 1] holds a system message (remembered per conversation)
    same, after, ids = _SYSTEM_AFTER_HEAD.repeated(rest, context=None)
    seen = bool(after) and after[-1]
    for message in rest[same:]:
        seen = seen or message.role == "system"
        after.append(seen)
    _SYSTEM_AFTER_HEAD.keep(rest, ids, after, context=None)
    if after and after[-1]:
        return _drop_billing_header(messages)
    out, dropped = _drop_billing_header(messages[:head])
    return (out + rest if dropped else list(messages)), dropped


_SYSTEM_AFTER_HEAD: Final[Walks[bool]] = Walks()


def _drop_billing_header(messages: list[ChatMessage]) -> tuple[list[ChatMessage], bool]:
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
