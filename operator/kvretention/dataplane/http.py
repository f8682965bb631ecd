"""The HTTP shell every kvretention process shares: ``/healthz``, ``/readyz``, ``/metrics``, and
serving until SIGTERM or SIGINT.

Each service supplies only what differs (its readiness check, its registry, what it does between
the signal and closing the listener); paths, status codes, content types and the shutdown order are
decided here once. Liveness answers whenever the event loop does; readiness is 200 or 503 with a
JSON body saying why; metrics are Prometheus text from one registry per process.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from kvretention.api.names import HEALTH_PATH, METRICS_PATH, READY_PATH

METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Readiness:
    """One readiness answer: 200 when ``ready``, else 503; ``body`` is the JSON either way."""

    ready: bool
    body: Mapping[str, Any] = field(default_factory=dict)


ReadyCheck = Callable[[], Awaitable[Readiness]]
HealthBody = Callable[[], Mapping[str, Any]]


def _status_ok() -> Mapping[str, Any]:
    return {"status": "ok"}


def readiness_response(readiness: Readiness) -> web.Response:
    return web.json_response(dict(readiness.body), status=200 if readiness.ready else 503)


def metrics_response(registry: CollectorRegistry) -> web.Response:
    """The registry in Prometheus' text format."""
    return web.Response(
        body=generate_latest(registry), headers={"Content-Type": METRICS_CONTENT_TYPE}
    )


def add_probes(app: web.Application, *, ready: ReadyCheck, health: HealthBody = _status_ok) -> None:
    """``GET /healthz`` (always 200, ``health()`` as JSON) and ``GET /readyz`` (``ready()``)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response(dict(health()))

    async def readyz(_: web.Request) -> web.Response:
        return readiness_response(await ready())

    app.router.add_get(HEALTH_PATH, healthz)
    app.router.add_get(READY_PATH, readyz)


def add_metrics(app: web.Application, registry: CollectorRegistry) -> None:
    """``GET /metrics``: the process's registry."""

    async def metrics(_: web.Request) -> web.Response:
        return metrics_response(registry)

    app.router.add_get(METRICS_PATH, metrics)


async def start_site(
    app: web.Application,
    *,
    host: str,
    port: int,
    shutdown_timeout: float = 60.0,
    handler_cancellation: bool = False,
) -> web.AppRunner:
    """Listen on ``host:port``; the caller owns the runner and calls ``cleanup()`` to stop."""
    runner = web.AppRunner(
        app,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        handler_cancellation=handler_cancellation,
    )
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner


async def wait_for_stop_signal() -> None:
    """Return at the first SIGTERM or SIGINT.

    The handlers stay on the running loop until it closes, so a second signal while the process
    drains and shuts down is ignored rather than killing it halfway.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


async def serve_until_signal(
    app: web.Application,
    *,
    host: str,
    port: int,
    shutdown_timeout: float,
    on_listening: Callable[[], None] | None = None,
    before_close: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve a data-plane app until SIGTERM/SIGINT, then close it gracefully.

    Order on a signal: ``before_close`` (a worker drains here while still answering ``/readyz``
    503), then the listener closes and in-flight handlers get ``shutdown_timeout`` seconds before
    they are cancelled, then the app's cleanup contexts run. A client that disconnects cancels its
    handler (``handler_cancellation``), so an abandoned generation is aborted, not run to its end.
    """
    runner = await start_site(
        app, host=host, port=port, shutdown_timeout=shutdown_timeout, handler_cancellation=True
    )
    try:
        if on_listening is not None:
            on_listening()
        await wait_for_stop_signal()
        if before_close is not None:
            await before_close()
    finally:
        await runner.cleanup()
