"""A small real tokenizer with a tool-aware, thinking-aware chat template, built in code.

No model hub is reachable from the tests, so this builds a byte-level BPE tokenizer with
``tokenizers`` (every byte is a token; no merges, so any text round-trips exactly) plus the
special tokens of a Qwen-style chat format, and attaches a chat template written here in the
style of Qwen2.5/Qwen3's: a system block listing the tools between ``<tools>`` and ``</tools>``,
assistant tool calls as ``<tool_call>{json}</tool_call>``, tool results as ``<tool_response>``
inside a user turn, replayed reasoning as ``<think>...</think>``, ``enable_thinking=False``
closing an empty think block, and image parts as vision placeholders. ``save`` writes it as a
Hugging Face tokenizer directory that ``AutoTokenizer.from_pretrained`` (and so the worker's
stand-in via ``--model-path``) loads offline.
"""

from __future__ import annotations

from pathlib import Path
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


def build_tokenizer() -> Any:
    """The tokenizer as a ``transformers`` fast tokenizer with :data:`CHAT_TEMPLATE`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
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


def save(directory: Path) -> Path:
    """Write the tokenizer as a Hugging Face tokenizer directory; returns the directory."""
    build_tokenizer().save_pretrained(str(directory))
    return directory
