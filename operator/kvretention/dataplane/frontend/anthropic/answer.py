"""Anthropic answers: the ``message`` object and the Messages SSE event sequence (see the package
docstring), usage as Anthropic counts it."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, Final, Literal

from kvretention.dataplane.frontend import sse
from kvretention.dataplane.frontend.anthropic.fields import OMIT_THINKING
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.frontend.errors import FrontendError, anthropic_error_body
from kvretention.dataplane.protocol import GenerateChunk, Usage

log = logging.getLogger("kvretention.frontend")
_STOP: Final = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def usage_object(usage: Usage, *, hinted: bool) -> dict[str, Any]:
    """Anthropic usage: ``input_tokens + cache_creation + cache_read`` is the whole prompt.

    ``cache_read`` is the prefix the engine found cached. With a retention hint, what the worker
    says it retained (``retained_tokens``: up to the last breakpoint, or the whole prompt for a
    top-level ``cache_control``) beyond the cached part is ``cache_creation``, and only the tokens
    after it are ``input_tokens``, as Anthropic counts them; a worker that does not say retains
    the whole prompt. Without a hint everything uncached is ``input_tokens``.
    """
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    fresh = usage.prompt_tokens - cached
    retained = usage.prompt_tokens if usage.retained_tokens is None else usage.retained_tokens
    written = max(0, min(retained, usage.prompt_tokens) - cached) if hinted else 0
    return {
        "input_tokens": fresh - written,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": written,
    }


def tool_use_id(call_id: str | None, *, request_id: str, index: int) -> str:
    """Anthropic-shaped, unique across turns: the engine's ids (``call_0``) may repeat."""
    if call_id and call_id.startswith("toolu_"):
        return call_id
    return f"toolu_{request_id}{index:02d}"


def thinking_signature(text: str) -> str:
    """An opaque signature for a thinking block; clients replay it and this server ignores it."""
    return "kvr-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's JSON arguments as the ``input`` object; text that is not an object is kept whole."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    log.warning("tool call arguments are not a JSON object; returned under 'raw_arguments'")
    return {"raw_arguments": arguments}


def _message_object(
    parsed: ParsedRequest,
    *,
    request_id: str,
    content: list[dict[str, Any]],
    stop_reason: str | None,
    usage: Usage,
) -> dict[str, Any]:
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage_object(usage, hinted=parsed.envelope is not None),
    }


def messages_response(
    parsed: ParsedRequest, result: Completion, *, request_id: str
) -> dict[str, Any]:
    """The non-streaming ``message`` object: thinking, text, then tool_use blocks."""
    content: list[dict[str, Any]] = []
    if result.reasoning:
        shown = "" if parsed.echo.get(OMIT_THINKING) else result.reasoning
        content.append(
            {
                "type": "thinking",
                "thinking": shown,
                "signature": thinking_signature(result.reasoning),
            }
        )
    if result.shown_text or not (content or result.tool_calls):
        content.append({"type": "text", "text": result.shown_text})
    for index, call in enumerate(result.tool_calls):
        content.append(
            {
                "type": "tool_use",
                "id": tool_use_id(call.id, request_id=request_id, index=index),
                "name": call.name,
                "input": tool_input(call.arguments),
            }
        )
    return _message_object(
        parsed,
        request_id=request_id,
        content=content,
        stop_reason=_STOP.get(result.finish_reason or "stop", "end_turn"),
        usage=result.usage,
    )


def count_tokens_response(usage: Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens}


BlockKind = Literal["thinking", "text", "tool_use"]


class MessagesStream:
    """Anthropic's named SSE events; each thinking, text or tool_use run is its own block.

    ``message_start`` waits for the first chunk so its usage can carry the real prompt counts
    (``GenerateChunk.prompt_usage``, or ``usage`` when the first chunk is also the last).
    """

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._hinted = parsed.envelope is not None
        self._omit_thinking = bool(parsed.echo.get(OMIT_THINKING))
        self._started = False
        self._finish: str | None = None
        self._usage = Usage()
        self._open: BlockKind | None = None
        self._index = -1
        self._thinking: list[str] = []
        """The open thinking block's text, in pieces (joined once, for its signature)."""
        self._tools: dict[int, int] = {}
        """engine tool-call index -> content block index"""

    def start(self) -> bytes:
        return b""

    def chunk(self, chunk: GenerateChunk) -> bytes:
        out: list[bytes] = []
        if not self._started:
            self._started = True
            out.append(self._message_start(chunk))
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        if chunk.reasoning:
            out.append(self._open_block("thinking"))
            self._thinking.append(chunk.reasoning)
            if not self._omit_thinking:
                out.append(self._delta({"type": "thinking_delta", "thinking": chunk.reasoning}))
        if chunk.text:
            out.append(self._open_block("text"))
            out.append(self._delta({"type": "text_delta", "text": chunk.text}))
        for call in chunk.tool_calls:
            if call.index not in self._tools:
                out.append(self._close_block())
                self._index += 1
                self._open = "tool_use"
                self._tools[call.index] = self._index
                block = {
                    "type": "tool_use",
                    "id": tool_use_id(call.id, request_id=self._rid, index=call.index),
                    "name": call.name or "",
                    "input": {},
                }
                out.append(
                    self._event("content_block_start", index=self._index, content_block=block)
                )
            if call.arguments:
                delta = {"type": "input_json_delta", "partial_json": call.arguments}
                out.append(
                    self._event("content_block_delta", index=self._tools[call.index], delta=delta)
                )
        return b"".join(out)

    def finish(self) -> bytes:
        out = [b"" if self._index >= 0 else self._open_block("text"), self._close_block()]
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": _STOP.get(self._finish or "stop", "end_turn"),
                "stop_sequence": None,
            },
            "usage": usage_object(self._usage, hinted=self._hinted),
        }
        out.append(sse.event(delta, name="message_delta"))
        out.append(sse.event({"type": "message_stop"}, name="message_stop"))
        return b"".join(out)

    def error(self, err: FrontendError) -> bytes:
        return sse.event(anthropic_error_body(err), name="error")

    # -- pieces ------------------------------------------------------------------------------

    def _message_start(self, first: GenerateChunk) -> bytes:
        usage = first.prompt_usage or first.usage or Usage()
        message = _message_object(
            self._parsed, request_id=self._rid, content=[], stop_reason=None, usage=usage
        )
        message["usage"]["output_tokens"] = 0
        return sse.event({"type": "message_start", "message": message}, name="message_start")

    def _event(self, name: str, **fields: Any) -> bytes:
        """A content block's event (strings and integers only: the fast writer)."""
        return sse.plain_event({"type": name, **fields}, name=name)

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event("content_block_delta", index=self._index, delta=delta)

    def _open_block(self, kind: Literal["thinking", "text"]) -> bytes:
        if self._open == kind:
            return b""
        closed = self._close_block()
        self._index += 1
        self._open = kind
        block: dict[str, Any] = (
            {"type": "thinking", "thinking": "", "signature": ""}
            if kind == "thinking"
            else {"type": "text", "text": ""}
        )
        return closed + self._event("content_block_start", index=self._index, content_block=block)

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            signature = thinking_signature("".join(self._thinking))
            out = self._delta({"type": "signature_delta", "signature": signature})
            self._thinking = []
        self._open = None
        return out + self._event("content_block_stop", index=self._index)
