"""Anthropic Messages: request parsing and response/SSE formatting.

The top-level ``cache_control`` is normalized (and block-level ones refused) by
``kvretention.hints.anthropic`` before the rest of the body is checked. The stream follows the
Messages event sequence the official SDK parses: ``message_start``, ``content_block_start``,
``content_block_delta``..., ``content_block_stop``, ``message_delta``, ``message_stop``.
"""

from __future__ import annotations

from typing import Any, Final

from kvretention.dataplane.frontend import sse
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.frontend.errors import FrontendError, Provider, anthropic_error_body
from kvretention.dataplane.frontend.validate import Fields
from kvretention.dataplane.protocol import ChatMessage, GenerateChunk, SamplingParams, Usage
from kvretention.hints.anthropic import CACHE_CONTROL, normalize_messages

F: Final = Fields(anthropic=True)
_STOP: Final = {"stop": "end_turn", "length": "max_tokens"}
_MAX_STOP_SEQUENCES: Final = 8


def parse_messages(body: dict[str, Any], *, hints: bool = True) -> ParsedRequest:
    """A ``/v1/messages`` body -> ``ParsedRequest``; raises ``ClientError``.

    With ``hints=False`` (Anthropic hints turned off for the fleet) ``cache_control`` is not
    interpreted at all: accepted and ignored, as a server without prompt caching would.
    """
    envelope = normalize_messages(body) if hints else None
    model = F.required_str(body, "model")
    if "max_tokens" not in body:
        raise F.missing("max_tokens")
    max_tokens = F.opt_int(body, "max_tokens", minimum=1)
    if "messages" not in body:
        raise F.missing("messages")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise F.invalid_type("messages", raw, expected="a valid list")
    if not raw:
        raise F.invalid_value("messages", "List should have at least 1 item after validation")
    messages: list[ChatMessage] = []
    system = body.get("system")
    if system is not None:
        messages.append(ChatMessage(role="system", content=_text(system, where="system")))
    messages.extend(_message(m, index=i) for i, m in enumerate(raw))
    if body.get("tools"):
        raise F.unsupported("tools", "tool use is not supported by this server")
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        raise F.unsupported("thinking", "extended thinking is not supported by this server")
    top_k = F.opt_int(body, "top_k", minimum=0)
    sampling = SamplingParams(
        max_new_tokens=max_tokens,
        temperature=F.opt_number(body, "temperature", minimum=0, maximum=1),
        top_p=_top_p(body),
        top_k=top_k,
        stop=F.opt_stop(body, "stop_sequences", limit=_MAX_STOP_SEQUENCES),
    )
    return ParsedRequest(
        model=model,
        messages=messages,
        sampling=sampling,
        stream=F.opt_bool(body, "stream"),
        envelope=envelope,
        hint_param=CACHE_CONTROL if envelope is not None else None,
        include_usage=True,
    )


def _top_p(body: dict[str, Any]) -> float | None:
    top_p = F.opt_number(body, "top_p", minimum=0, maximum=1)
    if top_p == 0:
        raise F.invalid_value("top_p", "Input should be greater than 0")
    return top_p


def _message(raw: object, *, index: int) -> ChatMessage:
    where = F.path("messages", index)
    if not isinstance(raw, dict):
        raise F.invalid_type(where, raw, expected="a valid dictionary")
    role = raw.get("role")
    if role not in ("user", "assistant"):
        raise F.invalid_value(f"{where}.role", "Input should be 'user' or 'assistant'")
    if "content" not in raw:
        raise F.missing(f"{where}.content")
    return ChatMessage(role=role, content=_text(raw["content"], where=f"{where}.content"))


def _text(content: object, *, where: str) -> str:
    """String content or text blocks joined by newlines; other block types are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise F.invalid_type(where, content, expected="a valid string or list of content blocks")
    texts: list[str] = []
    for j, block in enumerate(content):
        param = f"{where}.{j}"
        if not isinstance(block, dict):
            raise F.invalid_type(param, block, expected="a valid dictionary")
        kind = block.get("type")
        if kind != "text":
            raise F.unsupported(
                f"{param}.type", f"content blocks of type {kind!r} are not supported (text only)"
            )
        text = block.get("text")
        if not isinstance(text, str):
            raise F.invalid_type(f"{param}.text", text, expected="a valid string")
        texts.append(text)
    return "\n".join(texts)


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_read_input_tokens": usage.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


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
        "usage": _usage(usage),
    }


def messages_response(
    parsed: ParsedRequest, result: Completion, *, request_id: str
) -> dict[str, Any]:
    """The non-streaming ``message`` object."""
    return _message_object(
        parsed,
        request_id=request_id,
        content=[{"type": "text", "text": result.text}],
        stop_reason=_STOP.get(result.finish_reason or "stop", "end_turn"),
        usage=result.usage,
    )


class MessagesStream:
    """Anthropic's named SSE events around one text content block."""

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._finish: str | None = None
        self._usage = Usage()

    def start(self) -> bytes:
        message = _message_object(
            self._parsed, request_id=self._rid, content=[], stop_reason=None, usage=Usage()
        )
        block = {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        }
        return sse.event(
            {"type": "message_start", "message": message}, name="message_start"
        ) + sse.event(block, name="content_block_start")

    def chunk(self, chunk: GenerateChunk) -> bytes:
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        if not chunk.text:
            return b""
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": chunk.text},
        }
        return sse.event(delta, name="content_block_delta")

    def finish(self) -> bytes:
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": _STOP.get(self._finish or "stop", "end_turn"),
                "stop_sequence": None,
            },
            "usage": _usage(self._usage),
        }
        return b"".join(
            [
                sse.event({"type": "content_block_stop", "index": 0}, name="content_block_stop"),
                sse.event(delta, name="message_delta"),
                sse.event({"type": "message_stop"}, name="message_stop"),
            ]
        )

    def error(self, err: FrontendError) -> bytes:
        return sse.event(anthropic_error_body(err), name="error")


class MessagesApi:
    endpoint = "messages"
    provider = Provider.ANTHROPIC

    def parse(self, body: dict[str, Any], *, hints: bool) -> ParsedRequest:
        return parse_messages(body, hints=hints)

    def response(
        self, parsed: ParsedRequest, result: Completion, *, request_id: str
    ) -> dict[str, Any]:
        return messages_response(parsed, result, request_id=request_id)

    def formatter(self, parsed: ParsedRequest, *, request_id: str) -> MessagesStream:
        return MessagesStream(parsed, request_id=request_id)
