"""Requests aiohttp's HTTP parser refuses, on a real listener of the frontend with auth on: each gets
the provider's 400 as JSON, the refused line (an API key with it) is never logged or echoed, and
the log says one short line however many arrive. Request-smuggling shapes (ambiguous body framing)
get the same 400 and a closed connection, and never reach the router, whether aiohttp's parser or
the frontend's framing check refuses them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kvretention.dataplane.frontend.app import STATE
from kvretention.dataplane.frontend.errors import Provider
from support.raw_frontend import PATHS, assert_provider_error, body_for, key_mount, start_frontend
from support.router_standin import RouterStandIn

KEY = "sk-team-a-secret-0123456789"


def head(path: str, *lines: bytes, end: bytes = b"\r\n") -> bytes:
    start = [f"POST {path} HTTP/1.1".encode(), b"host: x", b"content-length: 2", *lines]
    return end.join(start) + end + end + b"{}"


MALFORMED: dict[str, Any] = {
    "nul_in_value": lambda p: head(p, f"authorization: Bearer {KEY}\x00x".encode()),
    "cr_in_value": lambda p: head(p, f"x-api-key: {KEY}\rx".encode()),
    "del_in_value": lambda p: head(p, f"authorization: Bearer {KEY}\x7f".encode()),
    "obs_fold": lambda p: head(p, b"authorization: Bearer", f" {KEY}".encode()),
    "space_before_colon": lambda p: head(p, f"x-api-key : {KEY}".encode()),
    "line_over_8190": lambda p: head(p, f"x-api-key: {KEY}{'a' * 9000}".encode()),
    "bare_lf": lambda p: head(p, f"x-api-key: {KEY}".encode(), end=b"\n"),
}


def chunked(body: bytes) -> bytes:
    return f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"


def framed(path: str, *lines: str, body: bytes, version: str = "1.1") -> bytes:
    """A request with a valid key and a valid body for ``path``, framed by ``lines``."""
    start = [f"POST {path} HTTP/{version}", "host: x", f"x-api-key: {KEY}", *lines]
    return "\r\n".join(start).encode() + b"\r\n\r\n" + body


def length(body: bytes) -> str:
    return f"content-length: {len(body)}"


CHUNKED = "transfer-encoding: chunked"
Build = Callable[[str, bytes], bytes]

SMUGGLING: dict[str, tuple[Build, str]] = {
    "cl_and_te": (lambda p, b: framed(p, length(b), CHUNKED, body=chunked(b)), "malformed_request"),
    "te_and_cl": (lambda p, b: framed(p, CHUNKED, length(b), body=chunked(b)), "malformed_request"),
    "two_lengths": (
        lambda p, b: framed(p, length(b), "content-length: 5", body=b),
        "malformed_request",
    ),
    "length_twice_same": (
        lambda p, b: framed(p, length(b), length(b), body=b),
        "malformed_request",
    ),
    "length_plus": (
        lambda p, b: framed(p, f"content-length: +{len(b)}", body=b),
        "malformed_request",
    ),
    "length_negative": (lambda p, b: framed(p, "content-length: -1", body=b), "malformed_request"),
    "length_not_digits": (
        lambda p, b: framed(p, "content-length: 1a", body=b),
        "malformed_request",
    ),
    "te_gzip_chunked": (
        lambda p, b: framed(p, "transfer-encoding: gzip, chunked", body=chunked(b)),
        "invalid_body",
    ),
    "te_chunked_identity": (
        lambda p, b: framed(p, "transfer-encoding: chunked, identity", body=chunked(b)),
        "malformed_request",
    ),
    "te_identity": (
        lambda p, b: framed(p, "transfer-encoding: identity", body=b),
        "malformed_request",
    ),
    "te_twice": (lambda p, b: framed(p, CHUNKED, CHUNKED, body=chunked(b)), "malformed_request"),
    "te_on_http_1_0": (
        lambda p, b: framed(p, CHUNKED, body=chunked(b), version="1.0"),
        "invalid_body",
    ),
    "chunk_size_not_hex": (
        lambda p, b: framed(p, CHUNKED, body=b"zz\r\n" + b + b"\r\n0\r\n\r\n"),
        "malformed_request",
    ),
    "chunk_size_0x": (
        lambda p, b: framed(p, CHUNKED, body=b"0x" + chunked(b)),
        "malformed_request",
    ),
}
"""Ambiguous framings: case -> (request for (path, body), the code in OpenAI's shape). aiohttp's
parser (llhttp) refuses most before any handler (``malformed_request``); the two it lets through
(``gzip, chunked``, chunked on HTTP/1.0) the frontend's framing check refuses (``invalid_body``)."""

FRAMED_WELL: dict[str, Build] = {
    "content_length": lambda p, b: framed(p, length(b), body=b),
    "chunked": lambda p, b: framed(p, CHUNKED, body=chunked(b)),
    "chunked_any_case_and_spaces": lambda p, b: framed(
        p, "transfer-encoding:  ChUnKeD ", body=chunked(b)
    ),
}
"""The same requests framed as HTTP/1.1 allows: forwarded, so a refusal above is the framing's."""


@pytest.fixture
async def frontend(
    router_standin: RouterStandIn, tmp_path: Path
) -> AsyncIterator[tuple[int, web.Application]]:
    runner, app = await start_frontend(router_standin, key_mount(tmp_path, KEY))
    try:
        yield runner.addresses[0][1], app
    finally:
        await runner.cleanup()


async def exchange(
    port: int, raw: bytes, *later: bytes, close: bool = True
) -> tuple[bytes, dict[str, str], bytes]:
    """Send ``raw`` (then each of ``later`` a moment apart), read until the server closes
    (``close``; else one response): status line, headers, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        for part in later:
            await asyncio.sleep(0.2)
            writer.write(part)
            await writer.drain()
        async with asyncio.timeout(10):
            if not close:
                top = await reader.readuntil(b"\r\n\r\n")
                size = int(top.lower().partition(b"content-length:")[2].split(b"\r\n")[0])
                answer = top + await reader.readexactly(size)
            else:
                answer = await reader.read()
    finally:
        writer.close()
    top, _, body = answer.partition(b"\r\n\r\n")
    status, *fields = top.split(b"\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (f.decode().partition(":") for f in fields)
    }
    return status, headers, body


@pytest.mark.parametrize("provider", list(Provider), ids=[p.value for p in Provider])
@pytest.mark.parametrize("case", list(MALFORMED))
async def test_a_refused_head_gets_the_providers_400_and_its_line_is_never_logged(
    frontend: tuple[int, web.Application],
    provider: Provider,
    case: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    port, _ = frontend
    caplog.set_level(logging.DEBUG)
    status, headers, body = await exchange(port, MALFORMED[case](PATHS[provider]))
    assert status.split(b" ")[1] == b"400", status
    assert headers["content-type"].startswith("application/json")
    assert headers["x-should-retry"] == "false"
    error = json.loads(body)
    if provider is Provider.ANTHROPIC:
        assert error["type"] == "error"
        assert error["error"]["type"] == "invalid_request_error"
    else:
        assert set(error["error"]) == {"message", "type", "param", "code"}
        assert error["error"]["type"] == "invalid_request_error"
    assert KEY.encode() not in body
    assert KEY not in caplog.text
    assert all(record.exc_info is None for record in caplog.records), caplog.text
    [line] = [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]
    assert line.levelno == logging.WARNING


async def test_an_unreadable_request_line_gets_openais_shape(
    frontend: tuple[int, web.Application],
) -> None:
    port, _ = frontend
    status, headers, body = await exchange(port, b"POST /v1/messages\x00 HTTP/1.1\r\n\r\n")
    assert status.split(b" ")[1] == b"400"
    assert headers["content-type"].startswith("application/json")
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


async def test_a_flood_of_refusals_is_one_log_line_and_a_count(
    frontend: tuple[int, web.Application], caplog: pytest.LogCaptureFixture
) -> None:
    port, app = frontend
    caplog.set_level(logging.DEBUG)
    for _ in range(20):
        await exchange(port, MALFORMED["nul_in_value"](PATHS[Provider.OPENAI]))
    lines = [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]
    assert len(lines) == 1
    aiohttp_lines = [r for r in caplog.records if r.name.startswith("aiohttp")]
    assert aiohttp_lines == []
    assert refusals(app) == 20


def refusals(app: web.Application) -> float:
    return sum(
        sample.value
        for metric in app[STATE].metrics.registry.collect()
        if metric.name == "kvretention_http_parser_refusals"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )


@pytest.mark.parametrize("provider", list(Provider), ids=[p.value for p in Provider])
@pytest.mark.parametrize("case", list(SMUGGLING))
async def test_a_smuggling_shape_gets_a_400_closes_the_connection_and_is_never_forwarded(
    frontend: tuple[int, web.Application],
    router_standin: RouterStandIn,
    provider: Provider,
    case: str,
) -> None:
    port, app = frontend
    build, code = SMUGGLING[case]
    word = f"smuggle-{case}-{provider.value}"
    # exchange reads until the server closes: a connection left open fails it
    status, headers, body = await exchange(port, build(PATHS[provider], body_for(provider, word)))
    assert status.split(b" ")[1] == b"400", status
    assert headers["content-type"].startswith("application/json")
    assert_provider_error(provider, headers, body, code=code, secret=KEY)
    assert router_standin.bodies_for(word) == []
    assert refusals(app) == 1


@pytest.mark.parametrize("provider", list(Provider), ids=[p.value for p in Provider])
@pytest.mark.parametrize("case", list(FRAMED_WELL))
async def test_the_same_request_framed_well_is_forwarded(
    frontend: tuple[int, web.Application],
    router_standin: RouterStandIn,
    provider: Provider,
    case: str,
) -> None:
    port, _ = frontend
    word = f"framed-{case}-{provider.value}"
    raw = FRAMED_WELL[case](PATHS[provider], body_for(provider, word))
    status, _, _ = await exchange(port, raw, close=False)
    assert status.split(b" ")[1] == b"200", status
    assert len(router_standin.bodies_for(word)) == 1


@pytest.mark.parametrize("provider", list(Provider), ids=[p.value for p in Provider])
async def test_a_bad_chunk_size_after_the_head_is_never_forwarded(
    router_standin: RouterStandIn, tmp_path: Path, provider: Provider
) -> None:
    """A bad chunk size that arrives after the head, while the handler reads the body. aiohttp's
    parser raises without failing the body the handler waits on; the shell's connection handler
    fails it, so the answer is the provider's 400 at once, not the body timeout's 408, and the
    request is never forwarded."""
    runner, _ = await start_frontend(router_standin, key_mount(tmp_path, KEY), body_timeout=30.0)
    word = f"smuggle-late-chunk-{provider.value}"
    body = body_for(provider, word)
    head = framed(PATHS[provider], CHUNKED, body=b"")
    late = b"zz\r\n" + body + b"\r\n0\r\n\r\n"
    try:
        status, headers, payload = await exchange(runner.addresses[0][1], head, late, close=False)
    finally:
        await runner.cleanup()
    assert status.split(b" ")[1] == b"400", status
    assert headers["content-type"].startswith("application/json")
    assert_provider_error(provider, headers, payload, code="invalid_body", secret=KEY)
    assert "chunked" in json.loads(payload)["error"]["message"]
    assert router_standin.bodies_for(word) == []
