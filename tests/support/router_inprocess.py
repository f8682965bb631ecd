"""The router app in-process in front of in-process workers (aiohttp ``TestServer``s): a worker's
routes, and a router started over the workers' URLs as ``--worker`` flags would give them."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from kvretention.dataplane.protocol import GENERATE_PATH
from kvretention.dataplane.router.app import RouterConfig, RouterState, build_app
from kvretention.dataplane.router.discovery import build_sources

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def always_ready(_: web.Request) -> web.Response:
    return web.json_response({})


async def aggregated_info(_: web.Request) -> web.Response:
    return web.json_response({"role": "aggregated"})


def answer_line(text: str) -> web.Response:
    """A whole worker answer: one terminal NDJSON line saying ``text``."""
    line = {"text": text, "finish_reason": "stop"}
    return web.Response(body=json.dumps(line) + "\n", content_type="application/x-ndjson")


def worker_app(
    generate: Handler,
    *,
    readyz: Handler = always_ready,
    gets: Mapping[str, Handler] | None = None,
) -> web.Application:
    """``/readyz``, the generate path, and ``gets`` (default: ``/v1/info`` of an aggregated worker)."""
    app = web.Application()
    app.router.add_get("/readyz", readyz)
    for path, handler in ({"/v1/info": aggregated_info} if gets is None else gets).items():
        app.router.add_get(path, handler)
    app.router.add_post(GENERATE_PATH, generate)
    return app


async def start_servers(apps: Iterable[web.Application]) -> list[TestServer]:
    servers = [TestServer(app) for app in apps]
    for server in servers:
        await server.start_server()
    return servers


def url_of(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


async def start_router(
    urls: Sequence[str], config: RouterConfig
) -> tuple[TestClient[Any, Any], RouterState]:
    """A serving router over ``urls`` as its static aggregated workers (no DNS, no pools)."""
    sources = build_sources(
        workers=urls, worker_dns=(), prefill=(), prefill_dns=(), decode=(), decode_dns=()
    )
    state = RouterState(sources, config)
    router: TestClient[Any, Any] = TestClient(TestServer(build_app(state)))
    await router.start_server()
    return router, state
