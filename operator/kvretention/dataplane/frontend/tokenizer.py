"""Optional frontend-side tokenization (``--tokenizer PATH``).

``transformers`` is imported only when a tokenizer is asked for and is not a dependency: without
it (or without ``--tokenizer``) the frontend forwards messages and the worker tokenizes. Both
render with :mod:`kvretention.dataplane.chat_template` (tools and thinking switches included), so
both give the engine the same tokens, and both attach the same envelope. A request with images is
left to the worker (``encode_request`` returns ``None``): the engine's multimodal processor
tokenizes those from the rendered text.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, Protocol

from kvretention.dataplane.chat_template import render_and_encode, template_options
from kvretention.dataplane.protocol import ChatMessage, PreprocessedRequest


class ChatTokenizer(Protocol):
    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Apply the model's chat template (with the generation prompt) and tokenize."""
        ...

    def encode_request(self, request: PreprocessedRequest) -> list[int] | None:
        """The request's prompt tokens (tools, tool choice, thinking switches and template
        arguments included), or ``None`` when the worker must tokenize (images, an answer that
        continues the last message)."""
        ...


class TokenizerUnavailable(RuntimeError):
    """``--tokenizer`` was given but ``transformers`` is not importable or the path is unusable."""


class HfChatTokenizer:
    """A Hugging Face tokenizer with a chat template."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        return render_and_encode(self._tokenizer, messages).token_ids

    def encode_request(self, request: PreprocessedRequest) -> list[int] | None:
        messages = request.messages or []
        if request.continue_final_message or any(m.images() for m in messages):
            return None
        rendered = render_and_encode(self._tokenizer, messages, **template_options(request))
        return rendered.token_ids


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
