"""The router as a Gateway's endpoint picker: Envoy ``ext_proc`` over gRPC on ``--ext-proc-port``.

``envoy.service.ext_proc.v3.ExternalProcessor/Process`` runs on ``grpc.aio`` in the router's own
loop, started and stopped with the HTTP app; messages are read and written by
:mod:`kvretention.dataplane.router.extproc_wire` (no generated code) and answered by
:class:`kvretention.dataplane.router.picker.PickStream`. ``grpc.health.v1.Health/Check`` answers
as the upstream EPP's does. The frontends come from ``--endpoint``/``--endpoint-dns``
(:mod:`kvretention.dataplane.router.discovery`) and are polled on ``/readyz`` with the workers.
No hop key: the picker never forwards a body, it only names an address.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Final

import aiohttp
import grpc
from aiohttp import web

from kvretention.api.names import READY_PATH
from kvretention.dataplane.router.discovery import discover, plan_membership
from kvretention.dataplane.router.extproc_wire import (
    WireError,
    decode_health_request,
    decode_request,
    encode_health_response,
    encode_response,
)
from kvretention.dataplane.router.health import Evidence, HealthRecord, plan_health
from kvretention.dataplane.router.picker import Pick, PickStream
from kvretention.dataplane.router.state import (
    STATE,
    RouterState,
    failure_evidence,
    ready_evidence,
)

log = logging.getLogger(__name__)

SERVICE: Final = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_SERVICE: Final = "grpc.health.v1.Health"
SERVING, NOT_SERVING = 1, 2


# ---------------------------------------------------------------- the frontends: discovery, health


async def refresh_endpoints(state: RouterState) -> None:
    """Add and drop frontends to match discovery (a failed DNS lookup keeps the current set)."""
    if state.endpoints is None:
        return
    found = await discover(state.endpoints)
    if found is None:
        return
    pool = state.picker.health
    change = plan_membership(pool, found)
    for url in change.removed:
        pool.pop(url, None)
        log.info("endpoint %s left discovery", url)
    for url in change.added:
        pool[url] = HealthRecord()
        log.info("discovered endpoint %s", url)
    if change.added and state.health_session is not None:
        await asyncio.gather(*(check_endpoint(state, url) for url in change.added))
    _publish(state)


async def check_endpoint(state: RouterState, url: str) -> None:
    """One ``/readyz`` poll of a frontend, weighed like a worker's."""
    assert state.health_session is not None
    timeout = aiohttp.ClientTimeout(total=state.config.health_timeout_s)
    evidence: Evidence
    try:
        async with state.health_session.get(url + READY_PATH, timeout=timeout) as resp:
            evidence = ready_evidence(resp.status)
    except (TimeoutError, aiohttp.ClientError) as exc:
        evidence = failure_evidence(exc)
    pool = state.picker.health
    record = pool.get(url)
    if record is None:  # it left discovery meanwhile
        return
    others = any(rec.healthy for other, rec in pool.items() if other != url)
    step = plan_health(
        record, evidence, last_healthy=not others, eject_after=state.config.eject_after
    )
    if step.ejected is not None:
        log.warning("endpoint %s out of rotation (%s)", url, step.ejected)
    elif step.admitted:
        log.info("endpoint %s ready", url)
    pool[url] = step.record


async def check_endpoints(state: RouterState) -> None:
    await asyncio.gather(*(check_endpoint(state, url) for url in list(state.picker.health)))
    _publish(state)


def _publish(state: RouterState) -> None:
    state.metrics.ready_endpoints.set(len(state.picker.ready()))


# ---------------------------------------------------------------- the gRPC services


def build_handlers(state: RouterState) -> list[grpc.GenericRpcHandler]:
    """``ExternalProcessor/Process`` and ``Health/Check`` on raw bytes (no (de)serializers)."""
    metrics = state.metrics

    def pick(session: str | None, subset: frozenset[str] | None) -> Pick | None:
        chosen = state.picker.choose(session, subset)
        metrics.picks.labels("unavailable" if chosen is None else chosen.outcome).inc()
        return chosen

    def served(picked: str | None, endpoint: str) -> None:
        metrics.served.labels("picked" if endpoint == picked else "other").inc()

    async def process(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
    ) -> AsyncIterator[bytes]:
        stream = PickStream(pick=pick, served=served, keys=state.config.session_keys)
        async for raw in requests:
            try:
                message = decode_request(raw)
            except WireError as exc:
                log.warning("ext_proc: unreadable ProcessingRequest: %s", exc)
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"ProcessingRequest: {exc}")
            for reply in stream.answer(message):
                yield encode_response(reply.answer, dynamic_metadata=reply.metadata)

    async def check(raw: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        try:
            service = decode_health_request(raw)
        except WireError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"HealthCheckRequest: {exc}")
        if service in ("", "liveness"):
            return encode_health_response(SERVING)
        if service in ("readiness", SERVICE):
            return encode_health_response(SERVING if state.picker.ready() else NOT_SERVING)
        await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {service!r}")

    return [
        grpc.method_handlers_generic_handler(
            SERVICE, {"Process": grpc.stream_stream_rpc_method_handler(process)}
        ),
        grpc.method_handlers_generic_handler(
            HEALTH_SERVICE, {"Check": grpc.unary_unary_rpc_method_handler(check)}
        ),
    ]


async def ext_proc_server(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup context: the gRPC server lives as long as the app."""
    state = app[STATE]
    config = state.config
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(build_handlers(state))
    address = f"{config.ext_proc_host}:{config.ext_proc_port}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"ext_proc: cannot listen on {address}")
    await server.start()
    log.info("endpoint picker (ext_proc) listening on %s", address)
    yield
    await server.stop(grace=1.0)
