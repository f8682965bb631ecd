"""The neutral conversation as a Hugging Face chat template takes it: messages, tools, kwargs.

Shared by the worker and the frontend's optional ``--tokenizer`` (through
:mod:`kvretention.dataplane.chat_template`, which renders it) so both produce the same tokens.
The conversion follows what SGLang's OpenAI server (``serving_chat.py``, 0.5.23) hands
``apply_chat_template``:

- assistant tool calls become ``{"id", "type": "function", "function": {"name", "arguments"}}``
  with ``arguments`` parsed to a dict (templates iterate over it); arguments that are not a JSON
  object are refused, as SGLang refuses them. A ``custom`` tool call's free text becomes
  ``{"input": text}``;
- a tool result is a ``tool`` message with ``tool_call_id`` and ``name``; text-only content is one
  string, parts joined by newlines as the frontend joins every provider's text blocks (so a part
  kept separate for a breakpoint renders exactly as the joined string would); a result the client flagged as an error is
  prefixed with ``ERROR_PREFIX`` so the model can tell (templates have no error flag);
- ``developer`` becomes ``system`` unless the template itself names the ``developer`` role;
- replayed reasoning travels as ``reasoning_content`` (Qwen3-style templates read it; encrypted
  blobs carry nothing the model can read and are dropped);
- content with images becomes parts ``[{"type": "image"}, {"type": "text", ...}]`` (SGLang's
  normalised part types) and the image URLs are returned in order for ``image_data``; text-only
  content is a plain string, which every template accepts;
- tools are ``[{"type": "function", "function": {name, description, parameters}}]``; a ``custom``
  tool (free-text input, e.g. Codex's ``apply_patch``) is shown as a function with one string
  parameter ``input``; its grammar, when it has one, is described in that parameter, and a
  ``regex`` grammar is also that parameter's JSON-schema ``pattern`` (enforced wherever SGLang
  constrains the call's arguments: strict tools, required / named choice);
- ``tool_choice: none`` offers no tools; a named tool choice offers only that tool (as SGLang);
- :class:`ReasoningControl` becomes ``chat_template_kwargs``: ``enable_thinking`` and ``thinking``
  (the two switches templates use) and ``reasoning_effort`` when an effort is given. ``None``
  leaves the template's default. The client's own ``chat_template_kwargs`` (SGLang's extension)
  are passed after them, so the client's win, as in SGLang's server.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from kvretention.dataplane.compiled_template import (
    JsonMemo,
    has_odd_number,
    odd_float,
    odd_int,
)
from kvretention.dataplane.protocol import (
    ChatMessage,
    ImagePart,
    ReasoningControl,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)

ERROR_PREFIX: Final = "Error: "
"""Put before a tool result the client flagged with ``is_error``."""
CUSTOM_INPUT: Final = "input"
"""The one string parameter a ``custom`` tool is shown with."""


class TemplateInputError(ValueError):
    """The conversation cannot be given to the template (the request is at fault)."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class TemplateInput:
    """What ``apply_chat_template`` is called with, plus the images in prompt order."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    image_urls: list[str] = field(default_factory=list)
    odd_numbers: bool = False
    """Whether a tool call's arguments or a tool's schema hold a number that minijinja would
    format unlike Python (:func:`~kvretention.dataplane.compiled_template.has_odd_number`)."""
    json_memo: JsonMemo | None = field(default=None, compare=False)
    """The conversation's ``tojson`` results, when converted with :class:`ConvertedMessages`."""


class _NumberWatch:
    """A tool call's arguments decoder that notes an odd number (only numbers reach its hooks;
    a plain ``int`` in Python is cheaper than a decoder that checks every value afterwards)."""

    __slots__ = ("decoder", "odd")

    def __init__(self) -> None:
        self.odd = False
        self.decoder = json.JSONDecoder(
            parse_float=self._float, parse_int=self._int, parse_constant=self._constant
        )

    def _float(self, text: str) -> float:
        value = float(text)
        if odd_float(value):
            self.odd = True
        return value

    def _int(self, text: str) -> int:
        value = int(text)
        if len(text) > 38 and odd_int(value):
            self.odd = True
        return value

    def _constant(self, text: str) -> float:
        self.odd = True  # NaN, Infinity, -Infinity
        return float(text)


def template_has_developer_role(chat_template: str | None) -> bool:
    """Whether the template names the ``developer`` role itself (else it becomes ``system``)."""
    return bool(chat_template) and (
        "'developer'" in str(chat_template) or '"developer"' in str(chat_template)
    )


def offered_tools(tools: Sequence[ToolDefinition], choice: ToolChoice) -> list[ToolDefinition]:
    """The tools the template shows: none for ``none``, the one named for ``named``."""
    if choice.mode == "none":
        return []
    if choice.mode == "named":
        return [t for t in tools if t.name == choice.name]
    return list(tools)


def build_tool_schema(tool: ToolDefinition) -> dict[str, Any]:
    """One tool as templates (and SGLang's ``Tool``) take it."""
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.kind == "custom":
        function["parameters"] = custom_tool_parameters(tool)
    else:
        function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def custom_tool_parameters(tool: ToolDefinition) -> dict[str, Any]:
    """A free-text tool as a function with one string parameter ``input``."""
    field: dict[str, Any] = {"type": "string", "description": "The tool's free-form input."}
    if tool.grammar is not None:
        field["description"] = (
            f"The tool's input, which must match this {tool.grammar.syntax} grammar:\n"
            f"{tool.grammar.definition}"
        )
        if tool.grammar.syntax == "regex":
            # A JSON-schema pattern, which SGLang's structure constraints enforce when the tool is
            # constrained (strict, or a required / named choice); Lark grammars are described only.
            field["pattern"] = tool.grammar.definition
    return {
        "type": "object",
        "properties": {CUSTOM_INPUT: field},
        "required": [CUSTOM_INPUT],
    }


def build_template_kwargs(
    reasoning: ReasoningControl | None, client: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Thinking switches for the template, then the client's own ``chat_template_kwargs`` over
    them (as SGLang's server applies them); empty when the request leaves the defaults."""
    kwargs: dict[str, Any] = {}
    if reasoning is not None:
        kwargs = {"enable_thinking": reasoning.enabled, "thinking": reasoning.enabled}
        if reasoning.effort is not None:
            kwargs["reasoning_effort"] = reasoning.effort
    if client:
        kwargs.update(client)
    return kwargs


def tool_call_arguments(
    call: ToolCall, *, param: str, decoder: json.JSONDecoder | None = None
) -> dict[str, Any]:
    """A history call's arguments as the dict templates iterate over."""
    if call.kind == "custom":
        return {CUSTOM_INPUT: call.arguments}
    if not call.arguments.strip():
        return {}
    try:
        parsed = json.loads(call.arguments) if decoder is None else decoder.decode(call.arguments)
    except ValueError:
        raise TemplateInputError(
            f"tool call {call.id!r} arguments must be valid JSON", param=param
        ) from None
    except RecursionError:
        raise TemplateInputError(
            f"tool call {call.id!r} arguments nest JSON too deeply", param=param
        ) from None
    if not isinstance(parsed, dict):
        raise TemplateInputError(
            f"tool call {call.id!r} arguments must be a JSON object", param=param
        )
    return parsed


def _content(message: ChatMessage, images: list[str], *, joiner: str) -> str | list[dict[str, Any]]:
    if isinstance(message.content, str):
        return message.content
    if not any(isinstance(p, ImagePart) for p in message.content):
        return joiner.join(p.text for p in message.content if isinstance(p, TextPart))
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, ImagePart):
            images.append(part.url)
            parts.append({"type": "image"})
        else:
            parts.append({"type": "text", "text": part.text})
    return parts


def build_template_message(
    message: ChatMessage,
    images: list[str],
    *,
    index: int,
    developer_role: bool,
    decoder: json.JSONDecoder | None = None,
) -> dict[str, Any]:
    """One neutral message as a template message; image URLs are appended to ``images``."""
    role = message.role
    if role == "developer" and not developer_role:
        role = "system"
    out: dict[str, Any] = {"role": role}
    if role == "tool":
        content = _content(message, images, joiner="\n")
        if message.is_error:
            content = (
                ERROR_PREFIX + content
                if isinstance(content, str)
                else [{"type": "text", "text": ERROR_PREFIX.strip()}, *content]
            )
        out["content"] = content
        if message.tool_call_id is not None:
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            out["name"] = message.name
        return out
    out["content"] = _content(message, images, joiner="\n")
    if message.name is not None:
        out["name"] = message.name
    if message.reasoning is not None and message.reasoning.text:
        out["reasoning_content"] = message.reasoning.text
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": tool_call_arguments(
                        call, param=f"messages.{index}.tool_calls.{n}.arguments", decoder=decoder
                    ),
                },
            }
            for n, call in enumerate(message.tool_calls)
        ]
    return out


@dataclass(frozen=True, slots=True)
class Converted:
    """One message as :func:`build_template_message` converted it (never mutated: templates only
    read it), with its image URLs and whether its tool calls hold an odd number."""

    message: ChatMessage
    """Held so the ``id`` this is found by stays this message's."""
    developer_role: bool
    template: dict[str, Any]
    images: tuple[str, ...]
    odd: bool


@dataclass(frozen=True, slots=True)
class ConvertedTool:
    """One tool as :func:`build_tool_schema` converted it (never mutated), and whether its schema
    holds an odd number."""

    tool: ToolDefinition
    schema: dict[str, Any]
    odd: bool


@dataclass
class ConvertedMessages:
    """Template messages already converted, by the ``id`` of the message object they came from:
    the worker decodes a message its conversation's previous turn held to that turn's very
    object (:mod:`kvretention.dataplane.worker.wire`), so a turn converts only its new messages.
    ``earlier`` is the previous turn's (read); ``current`` collects this turn's."""

    earlier: Mapping[int, Converted] = field(default_factory=dict)
    current: dict[int, Converted] = field(default_factory=dict)
    earlier_tools: Mapping[int, ConvertedTool] = field(default_factory=dict)
    tools: dict[int, ConvertedTool] = field(default_factory=dict)
    """The same for tool schemas, by the ``id`` of the tool definition."""
    json: JsonMemo = field(default_factory=JsonMemo)
    """The template's ``tojson`` results over these objects."""

    def after(self) -> ConvertedMessages:
        """The next turn's: this turn's conversions become its earlier ones."""
        return ConvertedMessages(
            earlier=self.current, earlier_tools=self.tools, json=self.json.after()
        )

    def tool_schema(self, tool: ToolDefinition) -> ConvertedTool:
        key = id(tool)
        found = self.tools.get(key) or self.earlier_tools.get(key)
        if found is None or found.tool is not tool:
            schema = build_tool_schema(tool)
            found = ConvertedTool(tool, schema, has_odd_number(schema))
        self.tools[key] = found
        return found


def build_template_input(
    messages: Sequence[ChatMessage],
    *,
    tools: Sequence[ToolDefinition] = (),
    tool_choice: ToolChoice | None = None,
    reasoning: ReasoningControl | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    developer_role: bool = False,
    converted: ConvertedMessages | None = None,
    keep: bool = True,
) -> TemplateInput:
    """The whole conversation as ``apply_chat_template`` arguments (pure). With ``converted``,
    a message converted before is taken from it, and (``keep``) every message of this one is
    recorded in its ``current``; the result equals a conversion without it."""
    if converted is None:
        images: list[str] = []
        numbers = _NumberWatch()
        out = [
            build_template_message(
                m, images, index=i, developer_role=developer_role, decoder=numbers.decoder
            )
            for i, m in enumerate(messages)
        ]
        odd = numbers.odd
    else:
        out, images, odd = _convert_reusing(
            messages, converted, developer_role=developer_role, keep=keep
        )
    shown = offered_tools(tools, tool_choice or ToolChoice())
    if converted is None:
        schemas = [build_tool_schema(t) for t in shown]
        odd = odd or has_odd_number(schemas)
    else:
        found = [converted.tool_schema(t) for t in shown]
        schemas = [f.schema for f in found]
        odd = odd or any(f.odd for f in found)
    odd = odd or (bool(template_kwargs) and has_odd_number(dict(template_kwargs or {})))
    return TemplateInput(
        messages=out,
        tools=schemas or None,
        template_kwargs=build_template_kwargs(reasoning, template_kwargs),
        image_urls=images,
        odd_numbers=odd,
        json_memo=converted.json if converted is not None else None,
    )


def _convert_reusing(
    messages: Sequence[ChatMessage],
    converted: ConvertedMessages,
    *,
    developer_role: bool,
    keep: bool,
) -> tuple[list[dict[str, Any]], list[str], bool]:
    out: list[dict[str, Any]] = []
    images: list[str] = []
    odd = False
    current, earlier = converted.current, converted.earlier
    numbers = _NumberWatch()  # one decoder for the turn; ``odd`` is reset per message
    for i, message in enumerate(messages):  # ~600 messages a turn: lookups inlined
        key = id(message)
        found = current.get(key) or earlier.get(key)
        if found is not None and (
            found.message is not message or found.developer_role != developer_role
        ):
            found = None
        if found is None:
            own: list[str] = []
            numbers.odd = False
            template = build_template_message(
                message, own, index=i, developer_role=developer_role, decoder=numbers.decoder
            )
            found = Converted(message, developer_role, template, tuple(own), numbers.odd)
        if keep:
            current[key] = found
        out.append(found.template)
        if found.images:
            images.extend(found.images)
        if found.odd:
            odd = True
    return out, images, odd
