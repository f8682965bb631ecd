"""Requests aiohttp's HTTP parser refuses, on a real listener of the frontend with auth on: each gets
the provider's 400 as JSON, the refused line (an API key with it) is never logged or echoed, and
the log says one short line however many arrive."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.auth import Gate, KeyStore
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.frontend.errors import Provider
from kvretention.dataplane.frontend.limits import LimitPolicy
from kvretention.dataplane.http import start_site
from support.router_standin import RouterStandIn
from support.secret_mount import write_secret

KEY = "sk-team-a-secret-0123456789"
PATHS = {Provider.OPENAI: "/v1/chat/completions", Provider.ANTHROPIC: "/v1/messages"}


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


@pytest.fixture
async def frontend(
    router_standin: RouterStandIn, tmp_path: Path
) -> AsyncIterator[tuple[int, web.Application]]:
    keys = tmp_path / "keys"
    write_secret(keys, {"team-a": KEY})
    gate = Gate(keys=KeyStore([keys]), limits=LimitPolicy())
    app = create_app(FrontendConfig(router_url=router_standin.base_url), gate=gate)
    runner = await start_site(app, host="127.0.0.1", port=0, shutdown_timeout=0.5)
    try:
        yield runner.addresses[0][1], app
    finally:
        await runner.cleanup()


async def exchange(port: int, raw: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """Send ``raw``, read until the server closes: status line, headers, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(10):
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
    from kvretention.dataplane.frontend.app import STATE

    registry = app[STATE].metrics.registry
    total = sum(
        sample.value
        for metric in registry.collect()
        if metric.name == "kvretention_http_parser_refusals"
        for sample in metric.samples
        if sample.name.endswith("_total")
    )
    assert total == 20
