"""The chat format of the tiny model (and of the tests' tokenizers): Qwen 2.5's, tools included.

A system block lists the tools between ``<tools>`` and ``</tools>``, assistant tool calls are
``<tool_call>{json}</tool_call>`` (what SGLang's ``qwen25`` tool-call parser reads), tool results
are ``<tool_response>`` inside a user turn, replayed reasoning is ``<think>...</think>`` (SGLang's
``qwen3`` reasoning parser), ``enable_thinking=False`` closes an empty think block, and image parts
become vision placeholders. :func:`build_chat_tokenizer` puts the format on a ``tokenizers``
vocabulary, so every tokenizer in this format is built by the same code.
"""

from __future__ import annotations

from typing import Any, Final

SPECIAL_TOKENS: Final = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|image_pad|>",
    "<|vision_end|>",
)
ADDED_TOKENS: Final = ("<tool_call>", "</tool_call>", "<think>", "</think>")
"""Whole tokens that are not special (the model writes them and decoding keeps them)."""

CHAT_TEMPLATE: Final = """
{%- macro render_content(content) -%}
  {%- if content is string -%}{{ content }}
  {%- else -%}
    {%- for part in content -%}
      {%- if part.type == 'image' -%}<|vision_start|><|image_pad|><|vision_end|>
      {%- elif part.type == 'text' -%}{{ part.text }}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
{%- endmacro -%}
{%- set ns = namespace(system='', start=0, last_user=-1) -%}
{%- if messages and messages[0].role == 'system' -%}
  {%- set ns.system = render_content(messages[0].content) -%}
  {%- set ns.start = 1 -%}
{%- endif -%}
{%- for message in messages -%}
  {%- if message.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}
<|im_start|>system
{% if ns.system %}{{ ns.system }}

{% endif %}# Tools

Functions you can call are listed one per line inside <tools></tools>:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>

To call a function, answer with one or more blocks like this one:
<tool_call>
{"name": <function-name>, "arguments": <arguments-as-json-object>}
</tool_call><|im_end|>
{% elif ns.system -%}
<|im_start|>system
{{ ns.system }}<|im_end|>
{% endif -%}
{%- for message in messages[ns.start:] -%}
  {%- set index = loop.index0 + ns.start -%}
  {%- if message.role in ('user', 'system') -%}
<|im_start|>{{ message.role }}
{{ render_content(message.content) }}<|im_end|>
{% elif message.role == 'assistant' -%}
<|im_start|>assistant
{% if message.reasoning_content and index > ns.last_user -%}
<think>
{{ message.reasoning_content }}
</think>

{% endif -%}
{{ render_content(message.content) }}
    {%- for call in message.tool_calls or [] -%}
      {%- if message.content or not loop.first %}{{ '\n' }}{% endif -%}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
    {%- endfor -%}
<|im_end|>
{% elif message.role == 'tool' -%}
    {%- if loop.first or messages[index - 1].role != 'tool' -%}<|im_start|>user
{% endif -%}
<tool_response>
{{ render_content(message.content) }}
</tool_response>
{% if loop.last or messages[index + 1].role != 'tool' -%}<|im_end|>
{% endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false -%}
<think>

</think>

{% endif -%}
{%- endif -%}
""".strip()


def build_chat_tokenizer(core: Any) -> Any:
    """``core`` (a ``tokenizers.Tokenizer``) as a ``transformers`` fast tokenizer in this format:
    the special and added tokens, ``<|im_end|>`` ending a turn, and :data:`CHAT_TEMPLATE`."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[
            t for t in SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")
        ],
    )
    tokenizer.add_tokens(list(ADDED_TOKENS))
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
