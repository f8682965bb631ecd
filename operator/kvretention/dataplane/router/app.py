"""The router's HTTP app: place each request, forward its exact bytes, stream the answer back.

The body is forwarded as the bytes received (a parsed copy is read for ``session_id`` only), so
``kv_hints`` leaves the router byte-identical on every path. Placement data travels in
``x-kvr-*`` headers. Workers are health-checked on a connection pool of their own, and ejection
weighs the evidence (:mod:`kvretention.dataplane.router.health`): a refused connection, a stream
that breaks off or a worker that says it is not ready leaves at once; timeouts and other failures
only after several in a row
with no real request answered in between, and never the last healthy worker for slowness alone. A
passing poll re-admits a worker. A worker that dies mid-stream gives the client a final
``worker_unavailable`` line; a client that disconnects closes the upstream request, which makes
the worker abort it in the engine.

This module is the assembly and the background jobs (discovery, health polls); the request path is
:mod:`kvretention.dataplane.router.relay`, the workers and metrics :mod:`kvretention.dataplane.router.state`,
the Gateway's endpoint picker (``--ext-proc-port``) :mod:`kvretention.dataplane.router.extproc`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any, Final

import aiohttp
from aiohttp import web

from kvretention.api.names import READY_PATH
from kvretention.dataplane.hop_client import HopClient
from kvretention.dataplane.http import Readiness, add_metrics, add_probes
from kvretention.dataplane.protocol import GENERATE_PATH, RESIDENCY_PATH
from kvretention.dataplane.router.discovery import discover, held_departing, plan_membership
from kvretention.dataplane.router.extproc import (
    check_endpoints,
    ext_proc_server,
    refresh_endpoints,
)
from kvretention.dataplane.router.health import Evidence
from kvretention.dataplane.router.relay import handle_generate
from kvretention.dataplane.router.residency import parse_residency
from kvretention.dataplane.router.state import (
    STATE,
    RouterConfig,
    RouterState,
    Worker,
    failure_evidence,
    ready_evidence,
)

__all__ = [
    "RouterConfig",
    "RouterState",
    "build_app",
    "check_all",
    "refresh_membership",
    "running",
]

log = logging.getLogger(__name__)

INFO_PATH: Final = "/v1/info"
"""Polled on each worker: readiness, so a draining worker stops getting new requests."""


# ---------------------------------------------------------------- discovery and health


async def refresh_membership(state: RouterState) -> None:
    """Re-run discovery for every source and add/remove workers to match."""
    for source in state.sources:
        found = await discover(source)
        if found is None:
            continue
        current = [w.url for w in state.pool(source.role)]
        change = plan_membership(current, found)
        newcomers = [Worker(url=url, role=source.role) for url in change.added]
        for worker in newcomers:
            state.workers[worker.url] = worker
            log.info("discovered %s worker %s", source.role, worker.url)
        if newcomers and state.health_session is not None:
            await asyncio.gather(*(check_worker(state, w) for w in newcomers))
        healthy = {w.url: w.healthy for w in state.pool(source.role)}
        held = held_departing(change.removed, found, healthy)
        for url in held:
            log.info(
                "%s worker %s left discovery; serving until another is ready", source.role, url
            )
        for url in (u for u in change.removed if u not in held):
            state.workers.pop(url, None)
            state.prefixes.forget(url)
            log.info("%s worker %s left discovery", source.role, url)


async def check_worker(state: RouterState, worker: Worker) -> None:
    """One readiness poll; a ready worker's ``/v1/info`` is read once (a prefill worker's
    bootstrap address, the input its model reads)."""
    assert state.health_session is not None
    session = state.health_session
    timeout = aiohttp.ClientTimeout(total=state.config.health_timeout_s)
    evidence: Evidence
    try:
        async with session.get(worker.url + READY_PATH, timeout=timeout) as resp:
            evidence = ready_evidence(resp.status)
        if evidence == "ok" and worker.info is None:
            async with session.get(worker.url + INFO_PATH, timeout=timeout) as resp:
                if resp.status == 200:
                    worker.info = await resp.json()
    except (TimeoutError, aiohttp.ClientError) as exc:
        evidence = failure_evidence(exc)
    state.observe(worker, evidence)
    if evidence == "ok" and state.config.kv_residency and worker.role != "decode":
        await _fetch_residency(session, worker, limit=timeout)


async def _fetch_residency(
    session: aiohttp.ClientSession, worker: Worker, *, limit: aiohttp.ClientTimeout
) -> None:
    """The worker's KV residency summary; a failed fetch keeps the old one, which goes stale.
    It is no health evidence: a worker without ``--kv-events`` answers 404 and serves as well."""
    try:
        async with session.get(worker.url + RESIDENCY_PATH, timeout=limit) as resp:
            if resp.status != 200:
                return
            body = await resp.json()
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return
    snapshot = parse_residency(body, fetched_at=time.monotonic())
    if snapshot is not None:
        worker.residency = snapshot


async def check_all(state: RouterState) -> None:
    await asyncio.gather(*(check_worker(state, w) for w in list(state.workers.values())))


async def _every(interval_s: float, job: Any, state: RouterState) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job(state)
        except Exception:  # a background loop must survive one bad round
            log.exception("router background job failed")


@contextlib.asynccontextmanager
async def running(state: RouterState) -> AsyncIterator[None]:
    """The router's connection pools and background jobs (discovery, health and residency
    polls, the picker's frontends) for as long as the block runs; a frontend that places in
    its own process runs them too."""
    state.session = HopClient(
        connect_timeout=state.config.connect_timeout_s, read_timeout=state.config.read_timeout_s
    )
    state.health_session = aiohttp.ClientSession()
    await refresh_membership(state)
    await check_all(state)
    await refresh_endpoints(state)
    tasks = [
        asyncio.create_task(_every(state.config.health_interval_s, check_all, state)),
        asyncio.create_task(_every(state.config.dns_interval_s, refresh_membership, state)),
    ]
    if state.endpoints is not None:
        tasks += [
            asyncio.create_task(_every(state.config.health_interval_s, check_endpoints, state)),
            asyncio.create_task(_every(state.config.dns_interval_s, refresh_endpoints, state)),
        ]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await state.session.close()
    await state.health_session.close()


async def _background(app: web.Application) -> AsyncIterator[None]:
    async with running(app[STATE]):
        yield


# ---------------------------------------------------------------- health, metrics, assembly


async def readiness(state: RouterState) -> Readiness:
    """Ready while every pool this router needs has a healthy worker."""
    ready = state.ready()
    return Readiness(ready=ready, body={"status": "ready" if ready else "no_workers"})


async def handle_workers(request: web.Request) -> web.Response:
    """Debug view of the pool: what placement sees."""
    state = request.app[STATE]
    return web.json_response(
        [
            {
                "url": w.url,
                "role": w.role,
                "healthy": w.healthy,
                "failures": w.health.failures,
                "outstanding": w.outstanding,
                "served": w.served,
                "input_modalities": (w.info or {}).get("input_modalities"),
                "context_length": (w.info or {}).get("context_length"),
            }
            for w in sorted(state.workers.values(), key=lambda w: (w.role, w.url))
        ]
    )


def build_app(state: RouterState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app.cleanup_ctx.append(_background)
    if state.config.ext_proc_port:
        app.cleanup_ctx.append(ext_proc_server)
    app.router.add_post(GENERATE_PATH, handle_generate)
    add_probes(app, ready=lambda: readiness(state))
    app.router.add_get("/v1/workers", handle_workers)
    add_metrics(app, state.metrics.registry)
    return app
