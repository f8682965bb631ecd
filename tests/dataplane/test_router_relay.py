"""How the router relays a worker's NDJSON answer: one that arrived whole and ends with a terminal
line goes out in one piece (one socket write, with a Content-Length); anything else streams as it
comes, with an error line when the answer breaks off."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from kvretention.dataplane.protocol import GENERATE_PATH
from kvretention.dataplane.router.app import RouterConfig
from support.router_inprocess import start_router, start_servers, url_of, worker_app

DONE = b'{"text": "a", "finish_reason": "stop"}\n'
TOKEN = b'{"text": "a", "token_ids": [1]}\n'
BROKEN = "stopped mid-stream"

# name, what the worker writes (each element one write, a pause between), whole at the router,
# what the client must read (BROKEN: the answer, then the router's error line)
ROWS: list[tuple[str, list[bytes], bool, str | None]] = [
    ("whole_terminal", [TOKEN + DONE], True, None),
    ("whole_error_line", [b'{"error": {"code": "x", "message": "m"}}\n'], True, None),
    ("whole_without_terminal_line", [TOKEN], False, BROKEN),
    ("whole_without_newline", [DONE.rstrip(b"\n")], False, BROKEN),
    ("streamed", [TOKEN, TOKEN, DONE], False, None),
    ("streamed_then_broken", [TOKEN, TOKEN], False, BROKEN),
]


@pytest.fixture
async def router_for() -> AsyncIterator[Any]:
    made: list[Any] = []

    async def make(writes: list[bytes]) -> TestClient[Any, Any]:
        async def generate(request: web.Request) -> web.StreamResponse:
            await request.read()
            out = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await out.prepare(request)
            for i, data in enumerate(writes):
                if i:
                    await asyncio.sleep(0.05)
                if i == len(writes) - 1:  # the last data and the end of the body in one write
                    await out.write_eof(data)
                else:
                    await out.write(data)
            return out

        (worker,) = await start_servers([worker_app(generate)])
        config = RouterConfig(health_interval_s=0.02, policy="least-outstanding")
        router, _ = await start_router([url_of(worker)], config)
        made.extend([router, worker])
        for _ in range(200):
            workers = await (await router.get("/v1/workers")).json()
            if any(w["healthy"] for w in workers):
                return router
            await asyncio.sleep(0.02)
        raise AssertionError("the router never saw its worker healthy")

    yield make
    for thing in made:
        await thing.close()


@pytest.mark.parametrize(
    ("writes", "whole", "ends"), [pytest.param(w, o, e, id=n) for n, w, o, e in ROWS]
)
async def test_relay_rows(
    router_for: Any, writes: list[bytes], whole: bool, ends: str | None
) -> None:
    router = await router_for(writes)
    body = json.dumps({"request_id": "r", "model": "m", "token_ids": [1]}).encode()
    resp = await router.post(GENERATE_PATH, data=body)
    text = await resp.read()
    assert resp.status == 200
    sent = b"".join(writes)
    assert text.startswith(sent)
    if ends is None:
        assert text == sent
    else:
        rest = text[len(sent) :].lstrip(b"\n")
        assert ends in json.loads(rest)["error"]["message"]
    assert (resp.headers.get("Content-Length") == str(len(text))) is whole
    assert (resp.headers.get("Transfer-Encoding") == "chunked") is not whole
