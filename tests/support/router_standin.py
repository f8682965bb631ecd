"""A router stand-in for frontend tests: records every request body and streams canned NDJSON.

It runs an aiohttp server on its own event loop in a background thread, so synchronous SDK clients
in the test thread can drive a frontend process that talks to it. What it does for a request is
chosen by a marker in the last message's text (``[[kv_unsupported]]``, ``[[hang]]``, ``[[drop]]``,
...; see ``MARKERS``), so tests stay independent of each other and of ordering.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import web

from support.threaded_app import ThreadedApp

CANNED: Final = ["Hello", ", ", "world", "!"]
USAGE: Final = {"prompt_tokens": 7, "completion_tokens": 4, "cached_tokens": 3}
HANG_S: Final = 10.0
LATE_EOF_S: Final = 0.05

MARKERS: Final = {
    "[[kv_unsupported]]": "501 kv_hints_unsupported before the stream",
    "[[kv_unsupported_midstream]]": "one chunk, then a kv_hints_unsupported error line",
    "[[no_workers]]": "503 no_workers before the stream",
    "[[hang]]": "no answer for HANG_S seconds",
    "[[hang_midstream]]": "one chunk, then silence",
    "[[drop]]": "close the connection without answering",
    "[[drop_midstream]]": "one chunk, then close the connection",
    "[[garbage]]": "200 with a line that is not JSON",
    "[[late_eof]]": "end the body a moment after the finish line, as a relaying router does",
    "[[reasoning]]": "reasoning deltas (REASONING) before the canned text",
    "[[tool_call]]": "one call of the request's first tool, arguments in fragments (TOOL_ARGS)",
    "[[parallel_tool_calls]]": "two calls of the request's first tool, then finish tool_calls",
    "[[custom_tool]]": "one custom-tool call of the first tool with free-text input (CUSTOM_INPUT)",
}
REASONING: Final = ["Let me ", "think."]
TOOL_ARGS: Final = ['{"city": ', '"Paris"}']
CUSTOM_INPUT: Final = ["*** Begin Patch\n", "*** End Patch\n"]


def tag() -> str:
    """A unique word to send in a request and find its body by (``RouterStandIn.bodies_for``)."""
    return f"tag-{uuid.uuid4().hex[:12]}"


def user(text: str) -> Any:
    """One user turn, as the SDKs take ``messages``."""
    return [{"role": "user", "content": text}]


def untyped(value: object) -> Any:
    """SDK params are TypedDicts; tests send shapes the SDK does not model on purpose."""
    return value


@dataclass(frozen=True)
class Received:
    body: dict[str, Any]
    headers: dict[str, str]
    peer: tuple[str, int] | None = None
    """The client's address: the same port twice means a pooled, reused connection."""


def _error_line(code: str, message: str) -> bytes:
    return json.dumps({"error": {"code": code, "message": message}}).encode() + b"\n"


def _chunk(text: str, **extra: Any) -> bytes:
    return json.dumps({"text": text, "token_ids": [1], **extra}).encode() + b"\n"


class RouterStandIn(ThreadedApp):
    """Start with ``start()`` (or ``with``), read ``received``, stop with ``stop()``."""

    def __init__(self) -> None:
        super().__init__()
        self.received: list[Received] = []

    def build_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._healthz)
        app.router.add_post("/v1/generate", self._generate)
        return app

    def clear(self) -> None:
        self.received.clear()

    def bodies_for(self, needle: str) -> list[dict[str, Any]]:
        """Bodies whose last message contains ``needle`` (tests tag requests with a unique word)."""
        return [r.body for r in self.received if needle in _last_text(r.body)]

    # -- handlers ---------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.received.append(
            Received(body=body, headers=dict(request.headers), peer=tuple(peer) if peer else None)
        )
        text = _last_text(body)
        if "[[kv_unsupported]]" in text:
            return _error_response(501, "kv_hints_unsupported", "sglang 0.4.0 has no kv_hints")
        if "[[no_workers]]" in text:
            return _error_response(503, "no_workers", "no healthy workers")
        if "[[hang]]" in text:
            await asyncio.sleep(HANG_S)
        if "[[drop]]" in text:
            assert request.transport is not None
            request.transport.close()
            return web.Response()
        response = web.StreamResponse(headers={"content-type": "application/x-ndjson"})
        await response.prepare(request)
        if "[[garbage]]" in text:
            await response.write(b"this is not json\n")
            return response
        if "[[reasoning]]" in text:
            for piece in REASONING:
                await response.write(_chunk("", reasoning=piece))
        calls = _tool_calls(body, text)
        if calls:
            for line in calls:
                await response.write(line)
            await response.write_eof()
            return response
        await response.write(_chunk(CANNED[0]))
        if "[[kv_unsupported_midstream]]" in text:
            await response.write(
                _error_line("kv_hints_unsupported", "decode worker lacks kv_hints")
            )
            return response
        if "[[hang_midstream]]" in text:
            await asyncio.sleep(HANG_S)
        if "[[drop_midstream]]" in text:
            assert request.transport is not None
            request.transport.close()
            return response
        limit = (body.get("sampling") or {}).get("max_new_tokens") or len(CANNED)
        pieces = CANNED[1:limit]
        finish = "length" if limit < len(CANNED) else "stop"
        for piece in pieces:
            await response.write(_chunk(piece))
        await response.write(_chunk("", finish_reason=finish, usage=USAGE))
        if "[[late_eof]]" in text:
            await asyncio.sleep(LATE_EOF_S)
        await response.write_eof()
        return response


def _tool_calls(body: dict[str, Any], text: str) -> list[bytes]:
    """NDJSON lines of the tool calls a marker asks for, ending with ``finish_reason: tool_calls``."""
    tools = body.get("tools") or [{"name": "get_weather"}]
    name = tools[0]["name"]
    if "[[custom_tool]]" in text:
        kind, pieces, count = "custom", CUSTOM_INPUT, 1
    elif "[[parallel_tool_calls]]" in text:
        kind, pieces, count = "function", TOOL_ARGS, 2
    elif "[[tool_call]]" in text:
        kind, pieces, count = "function", TOOL_ARGS, 1
    else:
        return []
    lines: list[bytes] = []
    for index in range(count):
        head = {"index": index, "id": f"call_{index}", "name": name, "kind": kind}
        lines.append(_chunk("", tool_calls=[head]))
        lines.extend(
            _chunk("", tool_calls=[{"index": index, "arguments": piece}]) for piece in pieces
        )
    lines.append(_chunk("", finish_reason="tool_calls", usage=USAGE))
    return lines


def _error_response(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def _last_text(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    if not messages:
        return ""
    content = messages[-1].get("content", "")
    if isinstance(content, list):  # text and image parts
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def parse_sse(raw: bytes) -> list[tuple[str | None, str]]:
    """Split an SSE body into ``(event, data)`` frames, asserting the framing is well formed."""
    text = raw.decode()
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-80:]!r}"
    frames: list[tuple[str | None, str]] = []
    for block in text[:-2].split("\n\n"):
        event: str | None = None
        data: list[str] = []
        for line in block.split("\n"):
            field, sep, value = line.partition(": ")
            assert sep, f"malformed SSE line {line!r}"
            if field == "event":
                event = value
            elif field == "data":
                data.append(value)
            else:
                raise AssertionError(f"unexpected SSE field {field!r}")
        assert data, f"SSE frame without data: {block!r}"
        frames.append((event, "\n".join(data)))
    return frames
