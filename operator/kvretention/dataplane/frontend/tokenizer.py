"""Optional frontend-side tokenization (``--tokenizer PATH``).

``transformers`` is imported only when a tokenizer is asked for and is not a dependency: without
it (or without ``--tokenizer``) the frontend forwards messages and the worker's SGLang tokenizes.
Both paths attach the same envelope.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from kvretention.dataplane.protocol import ChatMessage


class ChatTokenizer(Protocol):
    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Apply the model's chat template (with the generation prompt) and tokenize."""
        ...


class TokenizerUnavailable(RuntimeError):
    """``--tokenizer`` was given but ``transformers`` is not importable or the path is unusable."""


class HfChatTokenizer:
    """A Hugging Face tokenizer with a chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        ids = self._tokenizer.apply_chat_template(
            conversation, tokenize=True, add_generation_prompt=True
        )
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # newer transformers: BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]


def load_tokenizer(path: str) -> ChatTokenizer:
    try:
        transformers = importlib.import_module("transformers")
    except ImportError as exc:
        raise TokenizerUnavailable(
            "--tokenizer needs the 'transformers' package, which is not installed; "
            "omit --tokenizer to let the worker tokenize"
        ) from exc
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    except Exception as exc:
        raise TokenizerUnavailable(f"cannot load a tokenizer from {path!r}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise TokenizerUnavailable(f"the tokenizer at {path!r} has no chat template")
    return HfChatTokenizer(tokenizer)
