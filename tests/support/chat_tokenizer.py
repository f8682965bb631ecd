"""A small real tokenizer in the package's chat format, built in code.

No model hub is reachable from the tests, so this builds a byte-level BPE vocabulary with
``tokenizers`` (every byte is a token; with no merges, one token per byte, and any text
round-trips exactly) and puts the tiny model's chat format on it with the package's own
:func:`~kvretention.dataplane.worker.cpu.chat_format.build_chat_tokenizer` (Qwen 2.5-style:
tools, tool calls, tool results, reasoning, vision placeholders). ``save`` writes it as a Hugging
Face tokenizer directory that ``AutoTokenizer.from_pretrained`` (and so the worker's stand-in via
``--model-path``) loads offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvretention.dataplane.worker.cpu.chat_format import build_chat_tokenizer


def build_tokenizer(merges: Sequence[tuple[str, str]] = ()) -> Any:
    """The byte alphabet plus ``merges`` (byte-level spellings), in the package's chat format."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    core = Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    # No regex split: merges may cross word and block boundaries, as real BPE merges do.
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    return build_chat_tokenizer(core)


def save(directory: Path) -> Path:
    """Write the tokenizer as a Hugging Face tokenizer directory; returns the directory."""
    build_tokenizer().save_pretrained(str(directory))
    return directory
