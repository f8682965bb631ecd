"""Server-sent-event framing shared by both providers."""

from __future__ import annotations

import json
from typing import Any, Final

import msgspec

DONE: Final = b"data: [DONE]\n\n"


def dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False)


def event(data: Any, *, name: str | None = None) -> bytes:
    """One SSE frame; ``name`` becomes the ``event:`` line (Anthropic and Responses use it)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {dumps(data)}\n\n".encode()


def plain_event(data: Any, *, name: str | None = None) -> bytes:
    """``event(data, name=name)`` for data that holds no float (strings, integers, booleans,
    ``None``, lists and string-keyed dicts), in a fraction of the time: msgspec writes such a value
    byte for byte as :func:`dumps` does (each code point escaped alike; ``tests/unit/dataplane/
    test_frontend_sse.py`` checks every one). A float could be written otherwise (``1e22``
    for ``1e+22``): frames that may hold one go through :func:`event`."""
    head = b"event: " + name.encode() + b"\n" if name else b""
    return head + b"data: " + _ENCODE(data) + b"\n\n"


_ENCODE: Final = msgspec.json.Encoder().encode
