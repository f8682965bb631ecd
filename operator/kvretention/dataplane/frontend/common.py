"""Types shared by the provider adapters: the parsed request, the collected result, the formatter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from kvretention.dataplane.frontend.errors import FrontendError, Provider
from kvretention.dataplane.protocol import (
    ChatMessage,
    GenerateChunk,
    ReasoningControl,
    ResponseFormat,
    SamplingParams,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from kvretention.hints.envelope import KvHintEnvelope


@dataclass(frozen=True)
class ParsedRequest:
    """A validated provider request, already reduced to what the router needs plus echo fields."""

    model: str
    messages: list[ChatMessage]
    sampling: SamplingParams
    stream: bool
    envelope: KvHintEnvelope | None
    hint_param: str | None
    """The client parameter that produced the hint (named in a ``kv_hints_unsupported`` error)."""
    include_usage: bool = False
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields a provider repeats in its response object (Responses API)."""
    tools: list[ToolDefinition] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    reasoning: ReasoningControl | None = None


@dataclass
class Completion:
    """The router's stream folded into one answer (non-streaming responses)."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def add(self, chunk: GenerateChunk) -> None:
        self.text += chunk.text
        self.reasoning += chunk.reasoning
        for delta in chunk.tool_calls:
            if delta.index < len(self.tool_calls):
                call = self.tool_calls[delta.index]
                self.tool_calls[delta.index] = call.model_copy(
                    update={"arguments": call.arguments + delta.arguments}
                )
            else:
                self.tool_calls.append(
                    ToolCall(
                        id=delta.id or f"call_{delta.index}",
                        name=delta.name or "",
                        arguments=delta.arguments,
                        kind=delta.kind,
                    )
                )
        if chunk.finish_reason is not None:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage


class StreamFormatter(Protocol):
    """Turns router chunks into one provider's SSE frames, keeping whatever state it needs."""

    def start(self) -> bytes: ...

    def chunk(self, chunk: GenerateChunk) -> bytes: ...

    def finish(self) -> bytes: ...

    def error(self, err: FrontendError) -> bytes: ...


class Api(Protocol):
    """One provider endpoint: parse a body, format a full answer, make a stream formatter."""

    endpoint: str
    provider: Provider

    def parse(self, body: dict[str, Any], *, hints: bool) -> ParsedRequest: ...

    def response(
        self, parsed: ParsedRequest, result: Completion, *, request_id: str
    ) -> dict[str, Any]: ...

    def formatter(self, parsed: ParsedRequest, *, request_id: str) -> StreamFormatter: ...
