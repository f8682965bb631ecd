"""Server-sent-event framing shared by both providers."""

from __future__ import annotations

import json
from typing import Any, Final

DONE: Final = b"data: [DONE]\n\n"


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def event(data: Any, *, name: str | None = None) -> bytes:
    """One SSE frame; ``name`` becomes the ``event:`` line (Anthropic and Responses use it)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {dumps(data)}\n\n".encode()
