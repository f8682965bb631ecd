"""A small real tokenizer with a tool-aware, thinking-aware chat template, built in code.

No model hub is reachable from the tests, so this builds a byte-level BPE tokenizer with
``tokenizers`` (every byte is a token; no merges, so any text round-trips exactly) plus the
special tokens of a Qwen-style chat format, and attaches the package's chat template
(:mod:`kvretention.dataplane.worker.cpu.chat_format`, in the style of Qwen2.5/Qwen3's): a system block listing the tools between ``<tools>`` and ``</tools>``,
assistant tool calls as ``<tool_call>{json}</tool_call>``, tool results as ``<tool_response>``
inside a user turn, replayed reasoning as ``<think>...</think>``, ``enable_thinking=False``
closing an empty think block, and image parts as vision placeholders. ``save`` writes it as a
Hugging Face tokenizer directory that ``AutoTokenizer.from_pretrained`` (and so the worker's
stand-in via ``--model-path``) loads offline.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvretention.dataplane.worker.cpu.chat_format import ADDED_TOKENS, CHAT_TEMPLATE, SPECIAL_TOKENS


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
