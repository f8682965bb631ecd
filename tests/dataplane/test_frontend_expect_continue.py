"""``Expect: 100-continue`` on a real listener of the frontend: a client without a valid key gets
its provider's 401 as the first and only answer (never ``100 Continue``, so it never uploads its
body), one with a valid key gets ``100 Continue`` and then its answer; with auth off, as before."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kvretention.dataplane.frontend.errors import Provider
from support.raw_frontend import PATHS, assert_provider_error, body_for, key_mount, start_frontend
from support.router_standin import RouterStandIn

KEY = "sk-team-a-expect-0123456789"
WRONG = "sk-wrong-expect-0000000000"
KEY_HEADERS: dict[Provider, Callable[[str], str]] = {
    Provider.OPENAI: lambda key: f"authorization: Bearer {key}",
    Provider.ANTHROPIC: lambda key: f"x-api-key: {key}",
}
CONTINUE = b"HTTP/1.1 100 Continue"
Exchange = tuple[bytes, dict[str, str], bytes]


def expecting_head(path: str, *, key_line: str | None, length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "host: x", "content-type: application/json"]
    lines += [f"content-length: {length}", "expect: 100-continue"]
    lines += [key_line] if key_line is not None else []
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_response(reader: asyncio.StreamReader) -> Exchange:
    """One response: status line, headers, and its ``content-length`` bytes of body."""
    top = await reader.readuntil(b"\r\n\r\n")
    status, *fields = top[:-4].split(b"\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (f.decode().partition(":") for f in fields)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def send_expecting(port: int, head: bytes, body: bytes) -> tuple[list[Exchange], bytes]:
    """Send ``head`` alone; send ``body`` only after a ``100 Continue``. Every response read,
    and what the server sent after the last one within half a second."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    answers: list[Exchange] = []
    try:
        writer.write(head)
        await writer.drain()
        async with asyncio.timeout(10):
            answers.append(await read_response(reader))
            if answers[0][0] == CONTINUE:
                writer.write(body)
                await writer.drain()
                answers.append(await read_response(reader))
        try:
            async with asyncio.timeout(0.5):
                rest = await reader.read()
        except TimeoutError:
            rest = b"<open>"
    finally:
        writer.close()
    return answers, rest


@pytest.fixture
async def serve(
    router_standin: RouterStandIn, tmp_path: Path
) -> AsyncIterator[Callable[[bool], Any]]:
    """``await serve(auth)``: a listening frontend's port, with or without keys."""
    runners: list[web.AppRunner] = []
    keys = key_mount(tmp_path, KEY)

    async def start(auth: bool) -> int:
        runner, _ = await start_frontend(router_standin, keys if auth else None)
        runners.append(runner)
        port: int = runner.addresses[0][1]
        return port

    yield start
    for runner in runners:
        await runner.cleanup()


REFUSED = {
    "missing_key": (None, "missing_api_key"),
    "wrong_key": (WRONG, "invalid_api_key"),
}
PROVIDERS = pytest.mark.parametrize("provider", list(Provider), ids=[p.value for p in Provider])


@PROVIDERS
@pytest.mark.parametrize("case", list(REFUSED))
async def test_no_valid_key_gets_the_providers_401_and_never_a_100_continue(
    serve: Callable[[bool], Any], router_standin: RouterStandIn, provider: Provider, case: str
) -> None:
    key, code = REFUSED[case]
    port = await serve(True)
    router_standin.clear()
    word = f"expect-{case}-{provider.value}"
    body = body_for(provider, word)
    key_line = KEY_HEADERS[provider](key) if key is not None else None
    head = expecting_head(PATHS[provider], key_line=key_line, length=len(body))
    [(status, headers, payload)], rest = await send_expecting(port, head, body)
    assert status.split(b" ")[1] == b"401", status
    # no 100 Continue after it either; the client is told not to send the body on this
    # connection (aiohttp may still linger a while for a body, as it does without Expect)
    assert CONTINUE not in rest
    assert headers["connection"] == "close"
    assert_provider_error(
        provider, headers, payload, code=code, anthropic_type="authentication_error", secret=WRONG
    )
    assert router_standin.bodies_for(word) == []


@PROVIDERS
@pytest.mark.parametrize("auth", [True, False], ids=["auth_on", "auth_off"])
async def test_a_valid_key_or_auth_off_gets_100_continue_then_its_answer(
    serve: Callable[[bool], Any], router_standin: RouterStandIn, provider: Provider, auth: bool
) -> None:
    port = await serve(auth)
    word = f"expect-ok-{provider.value}-{auth}"
    body = body_for(provider, word)
    key_line = KEY_HEADERS[provider](KEY) if auth else None
    head = expecting_head(PATHS[provider], key_line=key_line, length=len(body))
    answers, _ = await send_expecting(port, head, body)
    assert [status.split(b" ")[1] for status, _, _ in answers] == [b"100", b"200"], answers
    answer = json.loads(answers[1][2])
    assert answer["type" if provider is Provider.ANTHROPIC else "object"] in {
        "message",
        "chat.completion",
    }
    assert len(router_standin.bodies_for(word)) == 1
