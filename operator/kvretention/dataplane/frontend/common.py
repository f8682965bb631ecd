"""Types shared by the provider adapters: the parse opening, the parsed request, the collected
result, the formatter."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ParamSpec, Protocol

from kvretention.dataplane.frontend.compat import collecting
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.protocol import (
    ChatMessage,
    ContentPart,
    GenerateChunk,
    ReasoningControl,
    ResponseFormat,
    SamplingParams,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
    Usage,
)
from kvretention.hints.envelope import KvHintEnvelope
from kvretention.hints.intent import NO_HINTS, BreakpointMode, CacheHints

Marks = Mapping[str, int]
"""A request's breakpoints as the provider parser meets them: a block's path in the provider's
error style (``messages.3.content.0``, ``messages[3].content[0]``) -> its TTL in seconds. The
neutral element made from that block gets ``retain_ttl``."""


def marks_of(hints: CacheHints, path: Callable[..., str]) -> Marks:
    """The breakpoints keyed by ``path(*position)`` (the parser's ``Fields.path``)."""
    return {path(*b.path): b.ttl_seconds for b in hints.breakpoints}


class ReadHints(Protocol):
    """A provider's hint normalizer (``kvretention.hints``): the body's cache controls, walking
    only the items ``encoded`` does not rule out."""

    def __call__(
        self,
        body: Mapping[str, Any],
        /,
        *,
        breakpoints: BreakpointMode,
        encoded: Sequence[bytes] | None,
    ) -> CacheHints: ...


SkipEncodings = Callable[[Resumer, list[Any], list[bytes]], list[bytes] | None]
"""What a provider's hint walk may skip items by (``Resumer.control_items``,
``openai.fields.breakpoint_encodings``), given the resumer, the items and their encodings."""


@dataclass(frozen=True)
class Opening:
    """Where every provider parser starts: the cache hints, their breakpoints keyed by the
    provider's paths, and the conversation items' encodings (``None`` without a resumer)."""

    cache: CacheHints
    marks: Marks
    encoded: list[bytes] | None


class ParseBody(Protocol):
    """A provider parser: a request body -> ``ParsedRequest``; raises ``ClientError``."""

    def __call__(
        self,
        body: dict[str, Any],
        /,
        *,
        hints: bool = True,
        breakpoints: BreakpointMode = "prefix",
        resumer: Resumer | None = None,
    ) -> ParsedRequest: ...


OpenedParse = Callable[[dict[str, Any], "Opening", "Resumer | None"], "ParsedRequest"]
"""A provider parser's own part: the body, its :class:`Opening`, and the resumer."""


@dataclass(frozen=True)
class Opener:
    """The opening the provider parsers share, with one provider's parts: the ``items`` list
    (``messages``, ``input``), its hint normalizer, what that walk may skip items by, and the
    parser's ``Fields.path``."""

    items: str
    read_hints: ReadHints
    skips: SkipEncodings
    path: Callable[..., str]

    def open(
        self,
        body: dict[str, Any],
        *,
        hints: bool,
        breakpoints: BreakpointMode,
        resumer: Resumer | None,
    ) -> Opening:
        """The items encoded once for the resumer and the hint walk, then the cache controls read
        first (so a refused control is reported even on an otherwise unusual body; with
        ``hints=False`` none is interpreted), and their breakpoints keyed by ``path``."""
        listed = body.get(self.items)
        encoded = (
            resumer.encode_items(listed) if resumer is not None and type(listed) is list else None
        )
        cache = NO_HINTS
        if hints:
            named = None
            if resumer is not None and encoded is not None and type(listed) is list:
                named = self.skips(resumer, listed, encoded)
            cache = self.read_hints(body, breakpoints=breakpoints, encoded=named)
        return Opening(cache=cache, marks=marks_of(cache, self.path), encoded=encoded)

    def parser(self, parse: OpenedParse) -> ParseBody:
        """``parse`` behind this opening, as a provider parser that also returns the fields it
        ignored (:func:`records_ignored`). With ``hints=False`` (the provider's hints turned off
        for the fleet) the cache controls are not interpreted at all: accepted and ignored, as a
        server without prompt caching would."""

        @functools.wraps(parse)
        def opened(
            body: dict[str, Any],
            *,
            hints: bool = True,
            breakpoints: BreakpointMode = "prefix",
            resumer: Resumer | None = None,
        ) -> ParsedRequest:
            opening = self.open(body, hints=hints, breakpoints=breakpoints, resumer=resumer)
            return parse(body, opening, resumer)

        return records_ignored(opened)


def joined(parts: list[ContentPart]) -> str | list[ContentPart]:
    """Text-only content as one string joined by newlines (what the template renders anyway), but
    parts stay parts when any has an image or a breakpoint: the worker must see where one ends."""
    if all(isinstance(p, TextPart) and p.retain_ttl is None for p in parts):
        return "\n".join(p.text for p in parts if isinstance(p, TextPart))
    return parts


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
    template_kwargs: dict[str, Any] | None = None
    """The client's ``chat_template_kwargs`` (SGLang's extension), passed to the template."""
    continue_final_message: bool = False
    """The answer continues the last, assistant message (Anthropic's prefill)."""
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    """SGLang's two reasoning switches (``PreprocessedRequest``)."""
    client_controls: bool = False
    """The client sent a retention control (even one that retains nothing): the fleet's default
    TTL policy never applies over it."""
    deferred_tools: list[ToolDefinition] = field(default_factory=list)
    """Tools the client marked ``defer_loading``: not shown in the prompt's tool list, but
    callable once a tool search loaded them (see ``PreprocessedRequest.deferred_tools``)."""
    tool_origin: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """A namespaced tool's name as the model sees it -> its namespace and own name (Responses:
    the answer's calls carry both)."""
    ignored: tuple[str, ...] = ()
    """Fields accepted and not acted on (``compat``): counted per field and named in the trace."""


_P = ParamSpec("_P")


def records_ignored(parse: Callable[_P, ParsedRequest]) -> Callable[_P, ParsedRequest]:
    """A provider parser that also returns the fields it ignored (``compat.ignore``) in
    ``ParsedRequest.ignored``."""

    @functools.wraps(parse)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> ParsedRequest:
        with collecting() as fields:
            parsed = parse(*args, **kwargs)
        return dataclasses.replace(parsed, ignored=tuple(fields)) if fields else parsed

    return wrapper


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

    @property
    def shown_text(self) -> str:
        """The answer's text, less a whitespace-only run before tool calls: templates write
        ``"\n\n"`` before a call, and no client wants it as a text block or message of its own."""
        return "" if self.tool_calls and not self.text.strip() else self.text


class StreamFormatter(Protocol):
    """Turns router chunks into one provider's SSE frames, keeping whatever state it needs."""

    def start(self) -> bytes: ...

    def chunk(self, chunk: GenerateChunk) -> bytes: ...

    def finish(self) -> bytes: ...

    def error(self, err: FrontendError) -> bytes: ...
