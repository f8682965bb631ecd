"""The frontend -> router hop refusing a request: a long conversation's placement header still
fits what the router's HTTP parser takes, and a refusal the router's parser makes reaches the
client as a 502 the SDKs do not retry."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.frontend.app import create_app
from kvretention.dataplane.frontend.config import FrontendConfig
from kvretention.dataplane.http import start_site
from kvretention.dataplane.protocol import HEADER_PREFIX
from support.router_standin import RouterStandIn


async def _client(app: web.Application) -> TestClient[Any, Any]:
    client: TestClient[Any, Any] = TestClient(TestServer(app))
    await client.start_server()
    return client


def conversation(messages: int, word: str) -> dict[str, Any]:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"}
        for i in range(messages - 1)
    ]
    return {"model": "m", "messages": [*turns, {"role": "user", "content": word}]}


@pytest.mark.parametrize("messages", [3_000, 4_000, 8_000])
async def test_a_long_conversation_is_placed_not_refused(
    router_standin: RouterStandIn, messages: int
) -> None:
    """From ~3,600 messages the whole prefix chain passed 8,190 bytes: the router's parser refused
    it and the client got a 502 its SDK retried."""
    word = uuid.uuid4().hex
    client = await _client(create_app(FrontendConfig(router_url=router_standin.base_url)))
    try:
        resp = await client.post("/v1/chat/completions", json=conversation(messages, word))
        assert resp.status == 200, await resp.text()
    finally:
        await client.close()
    [received] = [r for r in router_standin.received if word in str(r.body["messages"][-1])]
    assert len(received.headers[HEADER_PREFIX]) <= 8190


@pytest.fixture
async def refusing_router() -> AsyncIterator[dict[str, Any]]:
    """A router that answers ``/v1/generate`` with the status it is told, in plain text (as
    aiohttp's own parser refusals and proxies answer)."""
    told: dict[str, Any] = {"status": 400}

    async def generate(_: web.Request) -> web.Response:
        return web.Response(status=told["status"], text="Bad Request")

    app = web.Application()
    app.router.add_post("/v1/generate", generate)
    runner = await start_site(app, host="127.0.0.1", port=0, shutdown_timeout=0.5)
    told["url"] = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield told
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("router_status", "should_retry"),
    [
        pytest.param(400, "false", id="400_malformed"),
        pytest.param(413, "false", id="413_too_large"),
        pytest.param(431, "false", id="431_headers_too_large"),
        pytest.param(429, None, id="429_retryable"),
        pytest.param(503, None, id="503_retryable"),
    ],
)
async def test_a_router_refusal_without_an_error_body_says_whether_to_retry(
    refusing_router: dict[str, Any], router_status: int, should_retry: str | None
) -> None:
    refusing_router["status"] = router_status
    client = await _client(create_app(FrontendConfig(router_url=refusing_router["url"])))
    try:
        resp = await client.post("/v1/chat/completions", json=conversation(2, "hi"))
        body = await resp.json()
    finally:
        await client.close()
    assert resp.status == 502
    assert body["error"]["code"] == "bad_gateway"
    assert resp.headers.get("x-should-retry") == should_retry
