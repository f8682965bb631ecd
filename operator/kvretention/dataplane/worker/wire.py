"""Decode the forwarded body once, reusing what the conversation's previous turn decoded.

An agent resends its whole conversation every turn, so all but the newest messages of a
``PreprocessedRequest`` arrive as the very bytes the worker decoded and validated last turn. The
body is split by msgspec into its top-level values and each message's bytes (a syntax check at C
speed, no Python objects per value); a message whose bytes the conversation's previous turn held
is that turn's validated :class:`ChatMessage` (the same bytes decode and validate to the same
model), and only new messages are parsed and validated. The tools list is reused the same way,
by its bytes.

Exactness: a memo hit needs byte-for-byte equal input, and everything new goes through the very
calls the worker always made (``json.loads`` and pydantic). Anything this path does not accept
(invalid JSON or UTF-8, ``NaN``, a lone surrogate, a value pydantic refuses) returns ``None``, and
the caller decodes the whole body as before, so a bad body gets exactly the error and status it
got before.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from pydantic import TypeAdapter, ValidationError

from kvretention.common.tenancy import scoped_chain, scoped_session, tenant_of_headers
from kvretention.dataplane.protocol import (
    HEADER_PREFIX,
    ChatMessage,
    ContextOverflow,
    ErrorCode,
    PreprocessedRequest,
    ToolDefinition,
)
from kvretention.dataplane.router.placement import parse_prefix_header
from kvretention.dataplane.template_input import ConvertedMessages
from kvretention.dataplane.worker.render_cache import RenderCache
from kvretention.hints.envelope import WIRE_KEY, InvalidKvHint, KvHintEnvelope, envelope_or_none

_SPLIT: Final = msgspec.json.Decoder(dict[str, msgspec.Raw])
_ITEMS: Final = msgspec.json.Decoder(list[msgspec.Raw] | None)
_TOOLS: Final = TypeAdapter(list[ToolDefinition])
_REUSED: Final = ("messages", "tools", "deferred_tools")
"""The top-level values decoded through the memo; the rest are small and validated each time."""
MEMO_BYTES_PER_BYTE: Final = 12
"""A memo's size per byte of the messages it holds (models, converted template dicts, tojson
results): an upper bound (~10 measured with tracemalloc on the 200 KB agent sessions)."""


@dataclass
class ConversationMemo:
    """One turn's decoded messages and tools, by their exact bytes, and their template
    conversions, for the conversation's next turn (kept with its render-cache entry)."""

    messages: dict[bytes, ChatMessage] = field(default_factory=dict)
    tools: dict[bytes, list[ToolDefinition]] = field(default_factory=dict)
    converted: ConvertedMessages = field(default_factory=ConvertedMessages)
    raw_bytes: int = 0

    @property
    def nbytes(self) -> int:
        return sys.getsizeof(self.messages) + self.raw_bytes * MEMO_BYTES_PER_BYTE


def split_body(body: bytes) -> dict[str, msgspec.Raw] | None:
    """The body's top-level values, undecoded; ``None`` when it is not a JSON object msgspec
    accepts (the caller then decodes it as before)."""
    try:
        return _SPLIT.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def session_of(top: dict[str, msgspec.Raw]) -> str | None:
    """The body's ``session_id`` when it is a string (to find the conversation's memo)."""
    raw = top.get("session_id")
    if raw is None:
        return None
    try:
        value = json.loads(bytes(raw))
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def decode_request(
    top: dict[str, msgspec.Raw],
    *,
    previous: ConversationMemo | None,
    memo: ConversationMemo,
) -> tuple[PreprocessedRequest, dict[str, Any]] | None:
    """The validated request and its other top-level values (``kv_hints`` among them), filling
    ``memo`` with this turn's messages and tools; ``None`` where the body must be decoded as
    before (see the module docstring)."""
    if previous is not None:
        memo.converted = previous.converted.after()
    try:
        rest = {k: json.loads(bytes(v)) for k, v in top.items() if k not in _REUSED}
        request = PreprocessedRequest.model_validate(rest)
        raw_messages = top.get("messages")
        if raw_messages is not None:
            request.messages = _messages(raw_messages, previous=previous, memo=memo)
        for name in ("tools", "deferred_tools"):
            raw_tools = top.get(name)
            if raw_tools is not None:
                setattr(request, name, _tools(raw_tools, previous=previous, memo=memo))
    except (ValueError, ValidationError, msgspec.DecodeError, msgspec.ValidationError):
        return None  # pydantic's ValidationError is a ValueError; listed for the reader
    return request, rest


def _messages(
    raw: msgspec.Raw, *, previous: ConversationMemo | None, memo: ConversationMemo
) -> list[ChatMessage] | None:
    items = _ITEMS.decode(raw)
    if items is None:
        return None
    known = previous.messages if previous is not None else {}
    seen = memo.messages
    out: list[ChatMessage] = []
    for item in items:
        key = bytes(item)
        message = seen.get(key) or known.get(key)
        if message is None:
            message = ChatMessage.model_validate(json.loads(key))
        seen[key] = message
        memo.raw_bytes += len(key)
        out.append(message)
    return out


def _tools(
    raw: msgspec.Raw, *, previous: ConversationMemo | None, memo: ConversationMemo
) -> list[ToolDefinition]:
    key = bytes(raw)
    tools = memo.tools.get(key) or (previous.tools.get(key) if previous is not None else None)
    if tools is None:
        tools = _TOOLS.validate_python(json.loads(key))
    memo.tools[key] = tools
    memo.raw_bytes += len(key)
    return list(tools)


class RequestRejected(Exception):
    """A request refused before the engine is called."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        param: str | None = None,
        overflow: ContextOverflow | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.overflow = overflow


def decode_whole(body: bytes) -> tuple[PreprocessedRequest, KvHintEnvelope | None]:
    """The whole body decoded and validated (the reference for every rejection's message)."""
    try:
        raw = json.loads(body)
    except ValueError:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, "request body is not JSON") from None
    if not isinstance(raw, dict):
        raise RequestRejected(ErrorCode.INVALID_REQUEST, "request body must be a JSON object")
    envelope = _envelope(raw)
    try:
        request = PreprocessedRequest.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST, f"invalid {loc}: {err['msg']}", param=loc
        ) from None
    return request, envelope


def _envelope(raw: dict[str, Any]) -> KvHintEnvelope | None:
    try:
        return envelope_or_none(raw.get(WIRE_KEY))
    except InvalidKvHint as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param=exc.field) from None


def decode_reusing(
    body: bytes,
    *,
    headers: dict[str, str],
    cache: RenderCache | None,
    memo: ConversationMemo | None,
) -> tuple[PreprocessedRequest, KvHintEnvelope | None] | None:
    """The body decoded reusing the conversation's previous turn (see the module docstring),
    filling ``memo``; ``None`` where only :func:`decode_whole` can tell (every bad body lands
    there)."""
    if memo is None or cache is None:
        return None
    top = split_body(body)
    if top is None:
        return None
    try:
        tenant = tenant_of_headers(headers)
    except ValueError:
        return None  # refused below, after the body's own checks, as before
    previous = cache.memo_for(
        session=scoped_session(tenant, session_of(top)),
        chain=scoped_chain(tenant, parse_prefix_header(headers.get(HEADER_PREFIX))),
    )
    decoded = decode_request(top, previous=previous, memo=memo)
    if decoded is None:
        return None
    request, rest = decoded
    return request, _envelope(rest)
