"""OpenAI Responses output: output items built from parsed deltas, the response object, the stream.

One item is open at a time, as OpenAI streams them: reasoning (summary text), message (output
text), function_call (arguments) or custom_tool_call (input); each closes with its ``.done`` events
and ``response.output_item.done``. The non-streaming answer is built by the same code, so both
carry the same items.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from kvretention.dataplane.frontend import sse
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.protocol import GenerateChunk, ToolCallDelta, Usage


def responses_usage(usage: Usage) -> dict[str, Any]:
    """``cache_write_tokens`` (required by the SDK): SGLang's radix cache inserts every prompt
    token it computed, so the tokens written are the prompt tokens that were not read from it."""
    written = max(usage.prompt_tokens - usage.cached_tokens, 0)
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens,
            "cache_write_tokens": written,
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


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
        "usage": responses_usage(usage) if usage is not None else None,
        **parsed.echo,
    }


class EventWriter(Protocol):
    """Frames one stream event (and numbers it)."""

    def __call__(self, kind: str, /, **fields: Any) -> bytes: ...


def _no_events(kind: str, /, **fields: Any) -> bytes:
    return b""


class _Output:
    """The output items of one answer, built from parsed deltas; each method returns its events.

    One item is open at a time (OpenAI's order): a delta of another kind closes it and opens the
    next. ``events`` is the caller's event writer, so sequence numbers stay in one place.
    """

    def __init__(self, parsed: ParsedRequest, *, request_id: str, events: EventWriter) -> None:
        self.items: list[dict[str, Any]] = []
        self._rid = request_id
        self._event = events
        self._open: int | None = None
        self._buf: dict[int, list[str]] = {}
        """Each item's text so far, in pieces (joined once it is read: a string grown by ``+=``
        per token would be copied whole each time)."""
        self._calls: dict[int, int] = {}
        self._custom = {t.name for t in parsed.tools if t.kind == "custom"}
        self._origin = parsed.tool_origin

    def _new(self, item: dict[str, Any]) -> tuple[int, list[bytes]]:
        out = self.close()
        index = len(self.items)
        self.items.append(item)
        self._buf[index] = []
        self._open = index
        out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        return index, out

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{self._rid}_{len(self.items)}"

    def _kind(self) -> str | None:
        return None if self._open is None else str(self.items[self._open]["type"])

    def reasoning(self, delta: str) -> list[bytes]:
        out: list[bytes] = []
        if self._kind() != "reasoning":
            item = {
                "id": self._id("rs"),
                "type": "reasoning",
                "summary": [],
                "status": "in_progress",
            }
            index, out = self._new(item)
            part = {"type": "summary_text", "text": ""}
            out.append(self._summary("response.reasoning_summary_part.added", index, part=part))
        current = self._open
        assert current is not None
        self._buf[current].append(delta)
        out.append(self._summary("response.reasoning_summary_text.delta", current, delta=delta))
        return out

    def text(self, delta: str) -> list[bytes]:
        out: list[bytes] = []
        if self._kind() != "message":
            item = _message(self._id("msg"), text=None, status="in_progress")
            index, out = self._new(item)
            out.append(self._part("response.content_part.added", index, part=_output_text("")))
        current = self._open
        assert current is not None
        if delta:
            self._buf[current].append(delta)
            out.append(self._part("response.output_text.delta", current, delta=delta, logprobs=[]))
        return out

    def call(self, delta: ToolCallDelta) -> list[bytes]:
        out: list[bytes] = []
        index = self._calls.get(delta.index)
        if index is None:
            name = delta.name or ""
            call_id = delta.id or f"call_{self._rid}_{delta.index}"
            custom = delta.kind == "custom" or name in self._custom
            namespace, own = self._origin.get(name, (None, name))
            item = _call_item(
                self._id("ctc" if custom else "fc"),
                call_id=call_id,
                name=own,
                custom=custom,
                payload="",
                status="in_progress",
                namespace=namespace,
            )
            index, out = self._new(item)
            self._calls[delta.index] = index
        if delta.arguments:
            self._buf[index].append(delta.arguments)
            item = self.items[index]
            custom = item["type"] == "custom_tool_call"
            if index != self._open:  # a late fragment of a closed call: keep the item whole
                item["input" if custom else "arguments"] = "".join(self._buf[index])
            item_id = item["id"]
            kind = (
                "response.custom_tool_call_input.delta"
                if custom
                else "response.function_call_arguments.delta"
            )
            out.append(
                self._event(kind, item_id=item_id, output_index=index, delta=delta.arguments)
            )
        return out

    def close(self) -> list[bytes]:
        """Close the open item: its ``.done`` events with the full text, then ``output_item.done``."""
        index = self._open
        if index is None:
            return []
        self._open = None
        item, text = self.items[index], "".join(self._buf[index])
        where = {"item_id": item["id"], "output_index": index}
        out: list[bytes] = []
        kind = item["type"]
        if kind == "reasoning":
            part = {"type": "summary_text", "text": text}
            out.append(self._summary("response.reasoning_summary_text.done", index, text=text))
            out.append(self._summary("response.reasoning_summary_part.done", index, part=part))
            final = {**item, "summary": [part], "status": "completed"}
        elif kind == "message":
            out.append(self._part("response.output_text.done", index, text=text, logprobs=[]))
            out.append(self._part("response.content_part.done", index, part=_output_text(text)))
            final = _message(item["id"], text=text, status="completed")
        elif kind == "custom_tool_call":
            out.append(self._event("response.custom_tool_call_input.done", **where, input=text))
            final = {**item, "input": text}
        else:
            out.append(
                self._event("response.function_call_arguments.done", **where, arguments=text)
            )
            final = {**item, "arguments": text, "status": "completed"}
        self.items[index] = final
        out.append(self._event("response.output_item.done", output_index=index, item=final))
        return out

    def finish(self) -> list[bytes]:
        """Close the last item; an answer with no message and no tool call gets an empty message."""
        out = self.close()
        if not any(i["type"] != "reasoning" for i in self.items):
            out += self.text("")
            out += self.close()
        return out

    def _summary(self, kind: str, index: int, **fields: Any) -> bytes:
        item_id = self.items[index]["id"]
        return self._event(kind, item_id=item_id, output_index=index, summary_index=0, **fields)

    def _part(self, kind: str, index: int, **fields: Any) -> bytes:
        item_id = self.items[index]["id"]
        return self._event(kind, item_id=item_id, output_index=index, content_index=0, **fields)


def _message(item_id: str, *, text: str | None, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [] if text is None else [_output_text(text)],
    }


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_item(
    item_id: str,
    *,
    call_id: str,
    name: str,
    custom: bool,
    payload: str,
    status: str,
    namespace: str | None = None,
) -> dict[str, Any]:
    """A call item; a namespaced tool's call names its namespace and the tool's own name."""
    item: dict[str, Any]
    if custom:
        item = {
            "id": item_id,
            "type": "custom_tool_call",
            "call_id": call_id,
            "name": name,
            "input": payload,
        }
    else:
        item = {
            "id": item_id,
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": payload,
            "status": status,
        }
    if namespace is not None:
        item["namespace"] = namespace
    return item


def responses_response(
    parsed: ParsedRequest, result: Completion, *, request_id: str
) -> dict[str, Any]:
    """The non-streaming ``response`` object: reasoning, message, then tool-call items."""
    output = _Output(parsed, request_id=request_id, events=_no_events)
    if result.reasoning:
        output.reasoning(result.reasoning)
    if result.shown_text or not result.tool_calls:
        output.text(result.shown_text)
    for index, call in enumerate(result.tool_calls):
        delta = ToolCallDelta(
            index=index, id=call.id, name=call.name, arguments=call.arguments, kind=call.kind
        )
        output.call(delta)
    output.close()
    return response_object(
        parsed,
        request_id=request_id,
        created_at=int(time.time()),
        status="completed",
        output=output.items,
        usage=result.usage,
        finish_reason=result.finish_reason,
    )


class ResponsesStream:
    """The Responses event stream: created, in_progress, one item at a time, then completed."""

    def __init__(self, parsed: ParsedRequest, *, request_id: str) -> None:
        self._parsed = parsed
        self._rid = request_id
        self._created = int(time.time())
        self._seq = 0
        self._finish: str | None = None
        self._usage = Usage()
        self._output = _Output(parsed, request_id=request_id, events=self._event)

    def _event(self, kind: str, /, **fields: Any) -> bytes:
        # a ``response`` object carries the request's sampling floats; every other event (the
        # per-token deltas among them) holds strings and integers only
        write = sse.event if "response" in fields else sse.plain_event
        frame = write({"type": kind, "sequence_number": self._seq, **fields}, name=kind)
        self._seq += 1
        return frame

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(
            self._parsed, request_id=self._rid, created_at=self._created, status=status, **extra
        )

    def start(self) -> bytes:
        pending = self._response("in_progress", output=[], usage=None)
        return self._event("response.created", response=pending) + self._event(
            "response.in_progress", response=pending
        )

    def chunk(self, chunk: GenerateChunk) -> bytes:
        if chunk.finish_reason is not None:
            self._finish = chunk.finish_reason
        if chunk.usage is not None:
            self._usage = chunk.usage
        out: list[bytes] = []
        if chunk.reasoning:
            out += self._output.reasoning(chunk.reasoning)
        if chunk.text:
            out += self._output.text(chunk.text)
        for delta in chunk.tool_calls:
            out += self._output.call(delta)
        return b"".join(out)

    def finish(self) -> bytes:
        out = self._output.finish()
        final = self._response(
            "completed", output=self._output.items, usage=self._usage, finish_reason=self._finish
        )
        done = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return b"".join([*out, self._event(done, response=final)])

    def error(self, err: FrontendError) -> bytes:
        """An ``error`` event, then ``response.failed`` carrying the same code and message."""
        items = [
            {**item, "status": "incomplete"} if item.get("status") == "in_progress" else item
            for item in self._output.items
        ]
        # the response's error.code is an enum in the SDK (``server_error``, ...): our own code
        # leads the message there, and is the ``error`` event's code as it was
        error = {"code": "server_error", "message": f"{err.code}: {err.message}"}
        failed = self._response("failed", output=items, usage=None, error=error)
        return self._event(
            "error", code=err.code, message=err.message, param=err.param
        ) + self._event("response.failed", response=failed)
