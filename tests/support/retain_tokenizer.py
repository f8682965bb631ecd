"""A small real tokenizer with merges and a tool-aware Qwen-style chat template, built in code.

For the breakpoint-resolution tests: unlike a byte-per-token tokenizer, this one has BPE merges,
some of which cross element boundaries (``.`` + newline, ``}`` + newline, two newlines), so a
token can straddle the end of a block and the test can prove it is left out. The template lists
tools inside the system turn after the system text (as Qwen2.5/Qwen3 do), renders assistant tool
calls as ``<tool_call>`` blocks, groups consecutive tool results in one user turn as
``<tool_response>`` blocks, and replays reasoning after the last user turn.

``render`` converts the neutral conversation the way the worker's template input does (text
parts joined by newlines, tool calls with parsed arguments, tools as function schemas); the lead
can swap it for ``kvretention.dataplane.chat_template`` once both are merged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from kvretention.dataplane.protocol import ChatMessage, ImagePart, TextPart, ToolDefinition

SPECIAL_TOKENS: Final = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>")
ADDED_TOKENS: Final = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

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

CHAT_TEMPLATE: Final = """
{%- macro content(c) -%}
  {%- if c is string -%}{{ c }}
  {%- else -%}{%- for p in c -%}
    {%- if p.type == 'image' -%}<|image_pad|>{%- elif p.type == 'text' -%}{{ p.text }}{%- endif -%}
  {%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(system='', start=0, last_user=-1) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = content(messages[0].content) -%}{%- set ns.start = 1 -%}
{%- endif -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- if tools -%}
<|im_start|>system
{% if ns.system %}{{ ns.system }}

{% endif %}# Tools

You may call one or more functions. Their signatures are inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

Answer a call as <tool_call>{"name": ..., "arguments": ...}</tool_call>.<|im_end|>
{% elif ns.system -%}
<|im_start|>system
{{ ns.system }}<|im_end|>
{% endif -%}
{%- for m in messages[ns.start:] -%}
  {%- set index = loop.index0 + ns.start -%}
  {%- if m.role in ('user', 'system') -%}
<|im_start|>{{ m.role }}
{{ content(m.content) }}<|im_end|>
{% elif m.role == 'assistant' -%}
<|im_start|>assistant
{% if m.reasoning_content and index > ns.last_user -%}
<think>
{{ m.reasoning_content }}
</think>

{% endif -%}
{{ content(m.content) }}
    {%- for call in m.tool_calls or [] -%}
      {%- if m.content or not loop.first %}{{ '\\n' }}{% endif -%}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
    {%- endfor -%}
<|im_end|>
{% elif m.role == 'tool' -%}
    {%- if loop.first or messages[index - 1].role != 'tool' -%}<|im_start|>user
{% endif -%}
<tool_response>
{{ content(m.content) }}
</tool_response>
{% if loop.last or messages[index + 1].role != 'tool' -%}<|im_end|>
{% endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% endif -%}
""".strip()


def build_tokenizer() -> Any:
    """A ``transformers`` fast tokenizer (byte-level BPE with :data:`MERGES`) and the template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for left, right in MERGES:
        vocab.setdefault(left + right, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=list(MERGES)))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|image_pad|>"],
    )
    tokenizer.add_tokens(list(ADDED_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


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
