"""The smallest Anthropic Messages body the unit tests build on: one user turn saying ``hi``."""

from __future__ import annotations

from typing import Any


def messages_body(max_tokens: int, /, **fields: Any) -> dict[str, Any]:
    """A Messages body asking for ``max_tokens``; ``fields`` add to it or replace its own."""
    base: dict[str, Any] = {
        "model": "m",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hi"}],
    }
    return {**base, **fields}
