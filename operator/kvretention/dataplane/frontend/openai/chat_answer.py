"""OpenAI Chat Completions answers. Output follows the objects the official SDK parses:
``chat.completion`` / ``chat.completion.chunk`` + ``data: [DONE]``, tool calls streamed by index
(id, type and name first, then argument fragments), reasoning as ``reasoning_content`` as SGLang's,
vLLM's and DeepSeek's servers send it.
"""

from __future__ import annotations

import time
from typing import Any, Final

from kvretention.dataplane.frontend import sse
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.frontend.errors import FrontendError, openai_error_body
from kvretention.dataplane.protocol import GenerateChunk, ToolCall, ToolCallDelta, Usage

_FINISH: Final = {"stop": "stop", "length": "length", "tool_calls": "tool_calls"}


def _finish(reason: str | None, *, called: bool) -> str:
    """``tool_calls`` when a call ended the answer; a call cut off by the token limit stays
    ``length`` (as OpenAI and SGLang report it), so a client knows its arguments are partial."""
    finish = _FINISH.get(reason or "stop", "stop")
    return "tool_calls" if called and finish != "length" else finish


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


def chat_response(parsed: ParsedRequest, result: Completion, *, request_id: str) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if result.tool_calls and not result.shown_text else result.text,
        "refusal": None,
    }
    if result.reasoning:
        message["reasoning_content"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [_tool_call(c) for c in result.tool_calls]
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": _finish(result.finish_reason, called=bool(result.tool_calls)),
            }
        ],
        "usage": chat_usage(result.usage),
    }


class ChatStream:
    """``chat.completion.chunk`` frames, a final chunk with the finish reason, then ``[DONE]``."""

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._id = f"chatcmpl-{request_id}"
        self._created = int(time.time())
        self._finish: str | None = None
        self._usage = Usage()
        self._calls: set[int] = set()

    def _frame(self, delta: dict[str, Any], *, finish: str | None = None) -> bytes:
        # strings, integers and None only: no float to write differently
        return sse.plain_event(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self._parsed.model,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
        )

    def start(self) -> bytes:
        return self._frame({"role": "assistant", "content": ""})

    def _call_delta(self, delta: ToolCallDelta) -> dict[str, Any]:
        """The first delta of a call names it (id, type, name); later ones carry fragments only."""
        if delta.index in self._calls:
            return {"index": delta.index, "function": {"arguments": delta.arguments}}
        self._calls.add(delta.index)
        return {
            "index": delta.index,
            "id": delta.id or f"call_{self._rid}_{delta.index}",
            "type": "function",
            "function": {"name": delta.name or "", "arguments": delta.arguments},
        }

    def chunk(self, chunk: GenerateChunk) -> bytes:
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        delta: dict[str, Any] = {}
        if chunk.reasoning:
            delta["reasoning_content"] = chunk.reasoning
        if chunk.text:
            delta["content"] = chunk.text
        if chunk.tool_calls:
            delta["tool_calls"] = [self._call_delta(d) for d in chunk.tool_calls]
        return self._frame(delta) if delta else b""

    def finish(self) -> bytes:
        out = self._frame({}, finish=_finish(self._finish, called=bool(self._calls)))
        if self._parsed.include_usage:
            out += sse.event(
                {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._parsed.model,
                    "choices": [],
                    "usage": chat_usage(self._usage),
                }
            )
        return out + sse.DONE

    def error(self, err: FrontendError) -> bytes:
        """OpenAI streams a failure as a ``data: {"error": ...}`` frame (the SDK raises on it)."""
        return sse.event(openai_error_body(err))


def chat_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }
