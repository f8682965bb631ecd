"""A small real tokenizer with BPE merges, in the package's chat format, and an independent render.

For the breakpoint-resolution tests: unlike a byte-per-token tokenizer, this one has BPE merges,
some of which cross element boundaries (``.`` + newline, ``}`` + newline, two newlines), so a
token can straddle the end of a block and the test can prove it is left out. It is
:func:`support.chat_tokenizer.build_tokenizer` with :data:`MERGES`: the tiny model's chat format
(:mod:`kvretention.dataplane.worker.cpu.chat_format`, tools listed in the system turn after the
system text, ``<tool_call>`` blocks, consecutive tool results grouped in one user turn as
``<tool_response>`` blocks, reasoning replayed after the last user turn).

``render`` is the tests' own conversion of the neutral conversation (text parts joined by
newlines, tool calls with parsed arguments, tools as function schemas), written apart from
:mod:`kvretention.dataplane.chat_template` so a test can check the worker's resolution against it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from kvretention.dataplane.protocol import ChatMessage, ImagePart, TextPart, ToolDefinition
from support import chat_tokenizer

# Byte-level spellings: "Ċ" is a newline, "Ġ" a space.
MERGES: Final = (
    (".", "Ċ"),  # "." + newline: straddles the end of a text part joined by newlines
    ("}", "Ċ"),  # "}" + newline: a tool's JSON line and its newline
    ("Ċ", "Ċ"),  # a blank line
    ("Ġ", "t"),
    ("h", "e"),
    ("i", "n"),
    ("e", "r"),
    ("o", "n"),
    ("r", "e"),
    ("a", "t"),
    ("e", "n"),
    ("s", "t"),
    ('"', ":"),
    ('"', ","),
    ("Ġ", '"'),
    ("Ġt", "he"),
    ("Ġ", "a"),
    ("o", "r"),
)


def build_tokenizer() -> Any:
    """The tests' byte-level tokenizer with :data:`MERGES`, in the package's chat format."""
    return chat_tokenizer.build_tokenizer(MERGES)


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Neutral messages as the template takes them (the worker's conversion, reduced)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        item: dict[str, Any] = {"role": m.role, "content": _content(m)}
        if m.role == "tool" and m.is_error and isinstance(item["content"], str):
            item["content"] = "Error: " + item["content"]  # the worker's flag for templates
        if m.reasoning is not None and m.reasoning.text:
            item["reasoning_content"] = m.reasoning.text
        if m.tool_calls:
            item["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")},
                }
                for c in m.tool_calls
            ]
        out.append(item)
    return out


def _content(m: ChatMessage) -> str | list[dict[str, Any]]:
    if isinstance(m.content, str):
        return m.content
    if not any(isinstance(p, ImagePart) for p in m.content):
        return "\n".join(p.text for p in m.content if isinstance(p, TextPart))
    return [
        {"type": "image"} if isinstance(p, ImagePart) else {"type": "text", "text": p.text}
        for p in m.content
    ]


def tool_schemas(tools: Sequence[ToolDefinition]) -> list[dict[str, Any]] | None:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description or "",
                "parameters": t.parameters or {"type": "object", "properties": {}},
            },
        }
        for t in tools
    ] or None


def render(
    tokenizer: Any,
    messages: Sequence[ChatMessage],
    tools: Sequence[ToolDefinition],
    *,
    add_generation_prompt: bool,
) -> str:
    text = tokenizer.apply_chat_template(
        template_messages(messages),
        tools=tool_schemas(tools),
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
    assert isinstance(text, str)
    return text
