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
)
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
