"""The shared HTTP shell: probe and metrics routes, and serving until a stop signal."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter

from kvretention.dataplane.http import (
    Readiness,
    add_metrics,
    add_probes,
    serve_until_signal,
    start_site,
)
from kvretention.dataplane.protocol import GENERATE_PATH
from support.processes import free_port


def _probe_app(readiness: Readiness, health: Mapping[str, Any] | None = None) -> web.Application:
    async def ready() -> Readiness:
        return readiness

    app = web.Application()
    if health is None:
        add_probes(app, ready=ready)
    else:
        add_probes(app, ready=ready, health=lambda: health)
    return app


@pytest.mark.parametrize(
    ("readiness", "status"),
    [
        (Readiness(ready=True, body={"status": "ready"}), 200),
        (Readiness(ready=False, body={"status": "draining"}), 503),
        (Readiness(ready=False, body={"status": "not_ready", "reason": "no worker"}), 503),
        (Readiness(ready=True), 200),
    ],
)
async def test_readyz_answers_the_check(readiness: Readiness, status: int) -> None:
    async with TestClient(TestServer(_probe_app(readiness))) as http:
        response = await http.get("/readyz")
        assert response.status == status
        assert response.content_type == "application/json"
        assert await response.json() == dict(readiness.body)


@pytest.mark.parametrize(
    ("health", "body"),
    [
        (None, {"status": "ok"}),
        ({"ok": True, "role": "leader"}, {"ok": True, "role": "leader"}),
    ],
)
async def test_healthz_is_200_while_not_ready(
    health: Mapping[str, Any] | None, body: dict[str, Any]
) -> None:
    async with TestClient(TestServer(_probe_app(Readiness(ready=False), health))) as http:
        response = await http.get("/healthz")
        assert response.status == 200
        assert await response.json() == body


async def test_metrics_serves_the_registry_as_prometheus_text() -> None:
    registry = CollectorRegistry()
    Counter("kvretention_test_things", "Things.", registry=registry).inc(2)
    app = web.Application()
    add_metrics(app, registry)
    async with TestClient(TestServer(app)) as http:
        response = await http.get("/metrics")
        assert response.status == 200
        assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
        assert "kvretention_test_things_total 2.0" in await response.text()


async def test_serve_until_signal_runs_the_drain_hook_before_closing() -> None:
    """SIGTERM: the hook runs while ``/readyz`` still answers, then the listener and the app's
    cleanup contexts close."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    draining = False
    seen: list[str] = []
    listening = asyncio.Event()

    async def ready() -> Readiness:
        return Readiness(ready=not draining, body={"draining": draining})

    async def lifetime(_: web.Application) -> AsyncIterator[None]:
        seen.append("started")
        yield
        seen.append("cleaned up")

    async def drain() -> None:
        nonlocal draining
        draining = True
        async with aiohttp.ClientSession() as http, http.get(base + "/readyz") as response:
            seen.append(f"readyz {response.status} while draining")

    app = web.Application()
    app.cleanup_ctx.append(lifetime)
    add_probes(app, ready=ready)
    server = asyncio.create_task(
        serve_until_signal(
            app,
            host="127.0.0.1",
            port=port,
            shutdown_timeout=1.0,
            on_listening=listening.set,
            before_close=drain,
        )
    )
    await asyncio.wait_for(listening.wait(), timeout=5)
    async with aiohttp.ClientSession() as http, http.get(base + "/readyz") as response:
        assert response.status == 200
    signal.raise_signal(signal.SIGTERM)
    await asyncio.wait_for(server, timeout=5)
    assert seen == ["started", "readyz 503 while draining", "cleaned up"]
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(base + "/healthz")


async def test_no_shutdown_time_cancels_in_flight_handlers_at_once() -> None:
    """``shutdown_timeout=0`` (a worker with ``--drain-seconds 0``) means no time, not aiohttp's
    "wait for them forever"."""
    port = free_port()
    entered = asyncio.Event()
    cancelled: list[bool] = []

    async def forever(_: web.Request) -> web.Response:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        raise AssertionError("unreachable")

    app = web.Application()
    app.router.add_get("/slow", forever)
    runner = await start_site(
        app, host="127.0.0.1", port=port, shutdown_timeout=0, handler_cancellation=True
    )

    async def call() -> None:
        async with aiohttp.ClientSession() as http:
            await http.get(f"http://127.0.0.1:{port}/slow")

    client = asyncio.create_task(call())
    await asyncio.wait_for(entered.wait(), timeout=5)
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(runner.cleanup(), timeout=5)
    assert asyncio.get_running_loop().time() - started < 1.0
    assert cancelled == [True]
    with pytest.raises(aiohttp.ClientError):
        await client


async def test_the_metrics_port_serves_the_registry_and_nothing_else() -> None:
    """``metrics_port``: the app's own registry on a second listener, which answers no other
    route (not the API, not the probes) and closes after the app, so a drain is still scraped."""
    port, metrics_port = free_port(), free_port()
    registry = CollectorRegistry()
    things = Counter("kvretention_test_things", "Things.", registry=registry)
    listening = asyncio.Event()
    seen: list[str] = []

    async def generate(_: web.Request) -> web.Response:
        return web.json_response({"generated": True})

    async def drain() -> None:
        things.inc()
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        async with aiohttp.ClientSession() as http, http.get(url) as response:
            seen.append(f"{response.status} {'things_total 1.0' in await response.text()}")

    app = web.Application()
    add_probes(app, ready=_ready)
    add_metrics(app, registry)
    app.router.add_post(GENERATE_PATH, generate)
    server = asyncio.create_task(
        serve_until_signal(
            app,
            host="127.0.0.1",
            port=port,
            metrics_port=metrics_port,
            shutdown_timeout=1.0,
            on_listening=listening.set,
            before_close=drain,
        )
    )
    await asyncio.wait_for(listening.wait(), timeout=5)
    base = f"http://127.0.0.1:{metrics_port}"
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/metrics") as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == CONTENT_TYPE_LATEST
            assert "kvretention_test_things_total 0.0" in await response.text()
        async with http.post(base + GENERATE_PATH, json={}) as response:
            assert response.status == 404
        for path in ("/healthz", "/readyz"):
            async with http.get(base + path) as response:
                assert response.status == 404, path
        async with http.post(f"http://127.0.0.1:{port}{GENERATE_PATH}", json={}) as response:
            assert response.status == 200  # the API stays on the client port
    signal.raise_signal(signal.SIGTERM)
    await asyncio.wait_for(server, timeout=5)
    assert seen == ["200 True"]
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.ClientConnectionError):
            await http.get(base + "/metrics")


async def _ready() -> Readiness:
    return Readiness(ready=True)


def test_accept_errors_are_logged_once_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Finding 3 of issue 31: with the open files used up, asyncio logged every accept retry
    (267 MB in a minute); now one line per interval says how many it stood for."""
    from kvretention.dataplane.http import AcceptErrors

    now = [0.0]
    passed: list[dict[str, Any]] = []
    handler = AcceptErrors(lambda _loop, context: passed.append(context), clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    context = {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")}
    try:
        for step in range(100):
            now[0] = step * 0.5  # 50 s of tries, two a second
            handler(loop, context)
        handler(loop, {"message": "something else"})
    finally:
        loop.close()
    lines = [r.getMessage() for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(lines) == 5  # at 0, 10, 20, 30, 40 s
    assert "19 more since the last such line" in lines[1]
    assert passed == [{"message": "something else"}]
