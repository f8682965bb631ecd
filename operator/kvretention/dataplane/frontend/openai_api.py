"""OpenAI Chat Completions and Responses: request parsing and response/SSE formatting.

Parsing is pure: the cache controls go through ``kvretention.hints`` first (so a refused control is
reported even on an otherwise unusual body), then the fields this server honours are checked and
reduced to a ``ParsedRequest``. Formatting follows the OpenAI objects the official SDK parses:
``chat.completion`` / ``chat.completion.chunk`` + ``data: [DONE]``, and the Responses event stream.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final

from kvretention.dataplane.frontend import sse
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.frontend.errors import FrontendError, Provider, openai_error_body
from kvretention.dataplane.frontend.validate import Fields
from kvretention.dataplane.protocol import ChatMessage, GenerateChunk, SamplingParams, Usage
from kvretention.hints.openai import OPTIONS, normalize_chat_completions, normalize_responses

F: Final = Fields(anthropic=False)
_CHAT_ROLES: Final = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
_TEXT_PARTS: Final = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
}
_MAX_STOP: Final = 4


# -- parsing -----------------------------------------------------------------------------------


def parse_chat(body: dict[str, Any], *, hints: bool = True) -> ParsedRequest:
    """A ``/v1/chat/completions`` body -> ``ParsedRequest``; raises ``ClientError``.

    With ``hints=False`` the prompt-cache fields are not interpreted: accepted and ignored.
    """
    envelope = normalize_chat_completions(body) if hints else None
    model = F.required_str(body, "model")
    if "messages" not in body:
        raise F.missing("messages")
    raw = body["messages"]
    if not isinstance(raw, list):
        raise F.invalid_type("messages", raw, expected="an array")
    if not raw:
        raise F.invalid_value("messages", "[] is too short - 'messages' must not be empty.")
    messages = [_chat_message(m, index=i) for i, m in enumerate(raw)]
    _reject_unsupported(body, endpoint="chat")
    max_tokens = F.opt_int(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = F.opt_int(body, "max_tokens", minimum=1)
    stream = F.opt_bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise F.invalid_type("stream_options", options, expected="an object")
    include_usage = bool(options and options.get("include_usage") is True)
    return ParsedRequest(
        model=model,
        messages=messages,
        sampling=_sampling(body, max_tokens=max_tokens),
        stream=stream,
        envelope=envelope,
        hint_param=OPTIONS if envelope is not None else None,
        include_usage=include_usage,
    )


def parse_responses(body: dict[str, Any], *, hints: bool = True) -> ParsedRequest:
    """A ``/v1/responses`` body -> ``ParsedRequest``; raises ``ClientError``.

    With ``hints=False`` the prompt-cache fields are not interpreted: accepted and ignored.
    """
    envelope = normalize_responses(body) if hints else None
    model = F.required_str(body, "model")
    for key in ("previous_response_id", "conversation", "prompt"):
        if body.get(key) is not None:
            raise F.unsupported(key, "this server keeps no stored responses or prompts.")
    if body.get("background") is True:
        raise F.unsupported("background", "background responses are not supported.")
    messages: list[ChatMessage] = []
    instructions = F.opt_str(body, "instructions")
    if instructions:
        messages.append(ChatMessage(role="system", content=instructions))
    if "input" not in body:
        raise F.missing("input")
    items = body["input"]
    if isinstance(items, str):
        messages.append(ChatMessage(role="user", content=items))
    elif isinstance(items, list):
        messages.extend(_responses_item(item, index=i) for i, item in enumerate(items))
    else:
        raise F.invalid_type("input", items, expected="a string or an array")
    if not any(m.role != "system" for m in messages):
        raise F.invalid_value("input", "the input has no user or assistant message.")
    _reject_unsupported(body, endpoint="responses")
    max_tokens = F.opt_int(body, "max_output_tokens", minimum=1)
    sampling = _sampling(body, max_tokens=max_tokens, stop_key=None)
    cache_key = body.get("prompt_cache_key")  # type-checked by the normalizer when hints are on
    echo: dict[str, Any] = {
        "instructions": instructions,
        "max_output_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "metadata": _metadata(body),
        "prompt_cache_key": cache_key if isinstance(cache_key, str) else None,
        "user": F.opt_str(body, "user"),
    }
    return ParsedRequest(
        model=model,
        messages=messages,
        sampling=sampling,
        stream=F.opt_bool(body, "stream"),
        envelope=envelope,
        hint_param=OPTIONS if envelope is not None else None,
        include_usage=True,
        echo=echo,
    )


def _metadata(body: Mapping[str, Any]) -> dict[str, str]:
    """Echoed in the response object, where the SDK types it as string keys to string values."""
    value = body.get("metadata")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise F.invalid_type("metadata", value, expected="an object")
    for key, item in value.items():
        if not isinstance(item, str):
            raise F.invalid_type(f"metadata.{key}", item, expected="a string")
    return value


def _chat_message(raw: object, *, index: int) -> ChatMessage:
    where = F.path("messages", index)
    if not isinstance(raw, dict):
        raise F.invalid_type(where, raw, expected="an object")
    role = raw.get("role")
    if not isinstance(role, str):  # before the dict lookup: a list or object role is unhashable
        raise F.invalid_type(f"{where}.role", role, expected="a string")
    if role not in _CHAT_ROLES:
        supported = ", ".join(f"'{r}'" for r in _CHAT_ROLES)
        raise F.invalid_value(f"{where}.role", f"'{role}'. Supported values are: {supported}.")
    if raw.get("tool_calls"):
        raise F.unsupported(f"{where}.tool_calls", "tool calling is not supported.")
    content = raw.get("content")
    if content is None and role == "assistant":
        content = ""
    text = _text_content(content, where=f"{where}.content")
    return ChatMessage(role=_CHAT_ROLES[role], content=text)


def _responses_item(raw: object, *, index: int) -> ChatMessage:
    where = F.path("input", index)
    if not isinstance(raw, dict):
        raise F.invalid_type(where, raw, expected="an object")
    kind = raw.get("type", "message")
    if kind != "message":
        raise F.unsupported(
            f"{where}.type", f"input items of type '{kind}' are not supported; use 'message'."
        )
    role = raw.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise F.invalid_value(
            f"{where}.role",
            f"{role!r}. Supported values are: 'user', 'assistant', 'system', 'developer'.",
        )
    text = _text_content(raw.get("content"), where=f"{where}.content")
    return ChatMessage(role=_CHAT_ROLES[role], content=text)


def _text_content(content: object, *, where: str) -> str:
    """String content, or text parts joined by newlines; other part types are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise F.invalid_type(where, content, expected="a string or an array of content parts")
    texts: list[str] = []
    for j, part in enumerate(content):
        param = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise F.invalid_type(param, part, expected="an object")
        kind = part.get("type")
        key = _TEXT_PARTS.get(kind) if isinstance(kind, str) else None
        if key is None:
            raise F.unsupported(
                f"{param}.type", f"content parts of type {kind!r} are not supported (text only)."
            )
        value = part.get(key)
        if not isinstance(value, str):
            raise F.invalid_type(f"{param}.{key}", value, expected="a string")
        texts.append(value)
    return "\n".join(texts)


def _reject_unsupported(body: Mapping[str, Any], *, endpoint: str) -> None:
    """Features this text-only server cannot honour are refused, never silently dropped."""
    if body.get("tools"):
        raise F.unsupported("tools", "tool calling is not supported.")
    n = body.get("n")
    if n is not None and n != 1:
        raise F.unsupported("n", "only one choice per request (n=1) is supported.")
    if endpoint == "chat" and body.get("logprobs") is True:
        raise F.unsupported("logprobs", "log probabilities are not supported.")
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise F.unsupported("response_format", "only text responses are supported.")


def _sampling(
    body: Mapping[str, Any], *, max_tokens: int | None, stop_key: str | None = "stop"
) -> SamplingParams:
    return SamplingParams(
        max_new_tokens=max_tokens,
        temperature=F.opt_number(body, "temperature", minimum=0, maximum=2),
        top_p=_top_p(body),
        frequency_penalty=F.opt_number(body, "frequency_penalty", minimum=-2, maximum=2),
        presence_penalty=F.opt_number(body, "presence_penalty", minimum=-2, maximum=2),
        stop=F.opt_stop(body, stop_key, limit=_MAX_STOP) if stop_key else None,
        sampling_seed=F.opt_int(body, "seed", minimum=-(2**63)),
    )


def _top_p(body: Mapping[str, Any]) -> float | None:
    top_p = F.opt_number(body, "top_p", minimum=0, maximum=1)
    if top_p == 0:
        raise F.invalid_value("top_p", "0 is below the exclusive minimum of 0.")
    return top_p


# -- Chat Completions formatting -------------------------------------------------------------

_FINISH: Final = {"stop": "stop", "length": "length"}


def _chat_usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
    }


def chat_response(parsed: ParsedRequest, result: Completion, *, request_id: str) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` object."""
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": parsed.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text, "refusal": None},
                "logprobs": None,
                "finish_reason": _FINISH.get(result.finish_reason or "stop", "stop"),
            }
        ],
        "usage": _chat_usage(result.usage),
    }


class ChatStream:
    """``chat.completion.chunk`` frames, a final chunk with the finish reason, then ``[DONE]``."""

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._id = f"chatcmpl-{request_id}"
        self._created = int(time.time())
        self._finish: str | None = None
        self._usage = Usage()

    def _frame(self, delta: dict[str, Any], *, finish: str | None = None) -> bytes:
        return sse.event(
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

    def chunk(self, chunk: GenerateChunk) -> bytes:
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        return self._frame({"content": chunk.text}) if chunk.text else b""

    def finish(self) -> bytes:
        out = self._frame({}, finish=_FINISH.get(self._finish or "stop", "stop"))
        if self._parsed.include_usage:
            out += sse.event(
                {
                    "id": self._id,
                    "object": "chat.completion.chunk",
                    "created": self._created,
                    "model": self._parsed.model,
                    "choices": [],
                    "usage": _chat_usage(self._usage),
                }
            )
        return out + sse.DONE

    def error(self, err: FrontendError) -> bytes:
        """OpenAI streams a failure as a ``data: {"error": ...}`` frame (the SDK raises on it)."""
        return sse.event(openai_error_body(err))


class ChatApi:
    endpoint = "chat.completions"
    provider = Provider.OPENAI

    def parse(self, body: dict[str, Any], *, hints: bool) -> ParsedRequest:
        return parse_chat(body, hints=hints)

    def response(
        self, parsed: ParsedRequest, result: Completion, *, request_id: str
    ) -> dict[str, Any]:
        return chat_response(parsed, result, request_id=request_id)

    def formatter(self, parsed: ParsedRequest, *, request_id: str) -> ChatStream:
        return ChatStream(parsed, request_id=request_id)


# -- Responses formatting --------------------------------------------------------------------


def _responses_usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _output_message(*, request_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_output_text(text)]
    return {
        "id": f"msg_{request_id}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def response_object(
    parsed: ParsedRequest,
    *,
    request_id: str,
    created_at: int,
    status: str,
    output: list[dict[str, Any]],
    usage: Usage | None,
    finish_reason: str | None = None,
    error: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Responses API ``response`` object in any state (in_progress, completed, incomplete...)."""
    if status == "completed" and finish_reason == "length":
        status = "incomplete"
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": parsed.model,
        "output": output,
        "error": error,
        "incomplete_details": incomplete,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "store": False,
        "usage": _responses_usage(usage) if usage is not None else None,
        **parsed.echo,
    }


def responses_response(
    parsed: ParsedRequest, result: Completion, *, request_id: str
) -> dict[str, Any]:
    """The non-streaming ``response`` object."""
    message = _output_message(request_id=request_id, text=result.text, status="completed")
    return response_object(
        parsed,
        request_id=request_id,
        created_at=int(time.time()),
        status="completed",
        output=[message],
        usage=result.usage,
        finish_reason=result.finish_reason,
    )


class ResponsesStream:
    """The Responses event stream: created, in_progress, item/part added, text deltas, done, completed."""

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._item_id = f"msg_{request_id}"
        self._created = int(time.time())
        self._seq = 0
        self._text = ""
        self._finish: str | None = None
        self._usage = Usage()

    def _event(self, kind: str, **fields: Any) -> bytes:
        frame = sse.event({"type": kind, "sequence_number": self._seq, **fields}, name=kind)
        self._seq += 1
        return frame

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(
            self._parsed, request_id=self._rid, created_at=self._created, status=status, **extra
        )

    def start(self) -> bytes:
        pending = self._response("in_progress", output=[], usage=None)
        item = _output_message(request_id=self._rid, text=None, status="in_progress")
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        return b"".join(
            [
                self._event("response.created", response=pending),
                self._event("response.in_progress", response=pending),
                self._event("response.output_item.added", output_index=0, item=item),
                self._event("response.content_part.added", **where, part=_output_text("")),
            ]
        )

    def chunk(self, chunk: GenerateChunk) -> bytes:
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        if not chunk.text:
            return b""
        self._text += chunk.text
        return self._event(
            "response.output_text.delta",
            item_id=self._item_id,
            output_index=0,
            content_index=0,
            delta=chunk.text,
            logprobs=[],
        )

    def finish(self) -> bytes:
        where = {"item_id": self._item_id, "output_index": 0, "content_index": 0}
        item = _output_message(request_id=self._rid, text=self._text, status="completed")
        final = self._response(
            "completed", output=[item], usage=self._usage, finish_reason=self._finish
        )
        done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return b"".join(
            [
                self._event("response.output_text.done", **where, text=self._text, logprobs=[]),
                self._event("response.content_part.done", **where, part=_output_text(self._text)),
                self._event("response.output_item.done", output_index=0, item=item),
                self._event(done, response=final),
            ]
        )

    def error(self, err: FrontendError) -> bytes:
        """An ``error`` event, then ``response.failed`` carrying the same code and message."""
        item = _output_message(request_id=self._rid, text=self._text, status="incomplete")
        failed = self._response(
            "failed",
            output=[item],
            usage=None,
            error={"code": err.code, "message": err.message},
        )
        return self._event(
            "error", code=err.code, message=err.message, param=err.param
        ) + self._event("response.failed", response=failed)


class ResponsesApi:
    endpoint = "responses"
    provider = Provider.OPENAI

    def parse(self, body: dict[str, Any], *, hints: bool) -> ParsedRequest:
        return parse_responses(body, hints=hints)

    def response(
        self, parsed: ParsedRequest, result: Completion, *, request_id: str
    ) -> dict[str, Any]:
        return responses_response(parsed, result, request_id=request_id)

    def formatter(self, parsed: ParsedRequest, *, request_id: str) -> ResponsesStream:
        return ResponsesStream(parsed, request_id=request_id)
