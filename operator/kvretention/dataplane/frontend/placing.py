"""The router's placement in the frontend's own process: one Python HTTP hop to the worker.

With ``--worker``/``--worker-dns`` the frontend keeps the router's state itself (workers found
by discovery, health polls, session pins, the per-tenant prefix index, KV residency) and posts
each request straight to the worker placement picks, the same ``/v1/generate`` bytes and headers
the router would have forwarded. Placement is the router's own code
(:mod:`kvretention.dataplane.router.placing`), so a pin, a prefix match or a residency report
decides the same way; the router hop and its ~0.3 ms of CPU per request are gone. Aggregated
pools only: a prefill/decode pair needs the router's bootstrap rooms.

Each frontend replica keeps its own pins and prefix index, as router replicas do: the same
session reaches the same worker when the same frontend serves it (the Gateway's endpoint
picker keeps a session on one frontend) or when its worker reports it resident.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Final

from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.errors import FrontendError
from kvretention.dataplane.frontend.upstream import (
    chunks_of,
    end_answer,
    error_from_status,
    hop_headers,
    router_body,
)
from kvretention.dataplane.protocol import (
    ErrorBody,
    ErrorCode,
    GenerateChunk,
    PreprocessedRequest,
)
from kvretention.dataplane.router.app import running
from kvretention.dataplane.router.discovery import build_sources
from kvretention.dataplane.router.placement import Policy
from kvretention.dataplane.router.placing import Refused, open_aggregated, read_placement
from kvretention.dataplane.router.state import RouterConfig, RouterState, Worker

log = logging.getLogger("kvretention.frontend")

NO_WORKER: Final = "no worker is ready"
DEFAULT_CONNECT_TIMEOUT_S: Final = 5.0
"""The router's own ``--connect-timeout`` default: a worker that does not accept by then is skipped."""
_BROKEN: Final = frozenset({"upstream_disconnected", "router_malformed"})
"""Stream failures that are the worker's (its health hears of them, as the router's does)."""


class PlacingClient:
    """Places each request on a worker and opens its stream: what ``RouterClient`` does through
    the router, without the hop."""

    def __init__(self, state: RouterState, *, timeout: float) -> None:
        if state.disaggregated:
            raise ValueError("placing in the frontend serves aggregated workers only")
        self.state = state
        self.timeout = timeout
        self._jobs: contextlib.AsyncExitStack | None = None

    async def start(self) -> None:
        self._jobs = contextlib.AsyncExitStack()
        await self._jobs.enter_async_context(running(self.state))

    async def close(self) -> None:
        if self._jobs is not None:
            await self._jobs.aclose()
            self._jobs = None

    async def ready(self, *, within: float = 1.0) -> str | None:
        """``None`` while a worker is healthy (the router's own readiness rule)."""
        return None if self.state.ready() else NO_WORKER

    async def worker_reports(self) -> list[Mapping[str, object]]:
        """Each healthy worker's ``/v1/info``, as the health polls read it."""
        return [w.info or {} for w in self.state.workers.values() if w.healthy]

    @asynccontextmanager
    async def generate(
        self,
        request: PreprocessedRequest,
        *,
        hint_param: str | None,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[AsyncIterator[GenerateChunk]]:
        """Open the worker's stream; raises ``FrontendError`` before yielding if no worker takes
        it (the router's error codes and statuses)."""
        state = self.state
        body = router_body(request)
        passed = hop_headers(request, headers)
        try:
            placement = read_placement(state, passed, body)
        except ValueError as exc:
            raise errors.from_upstream(
                ErrorBody(code=ErrorCode.INVALID_REQUEST, message=str(exc)), hint_param=None
            ) from None
        outcome = "error"
        try:
            opened = await open_aggregated(state, body, passed, placement)
            if isinstance(opened, Refused):
                outcome = opened.outcome
                raise errors.from_upstream(
                    ErrorBody(code=opened.code, message=opened.message), hint_param=hint_param
                )
            resp, worker = opened.response, opened.worker
            try:
                if resp.status != 200:
                    outcome = "upstream_error"
                    raise await error_from_status(resp, hint_param=hint_param, limit_s=self.timeout)
                state.answered(worker)
                yield _watched(
                    chunks_of(resp, hint_param=hint_param, limit_s=self.timeout), state, worker
                )
                outcome = "ok"
            finally:
                end_answer(resp)
                state.end(worker)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            state.metrics.requests_of("aggregated", outcome).inc()


async def _watched(
    chunks: AsyncIterator[GenerateChunk], state: RouterState, worker: Worker
) -> AsyncIterator[GenerateChunk]:
    """The worker's chunks; each one proves it alive, a stream that breaks off counts against it."""
    try:
        async for chunk in chunks:
            state.answered(worker)
            yield chunk
    except FrontendError as err:
        if err.code in _BROKEN:
            log.warning("worker %s stopped mid-stream", worker.url)
            state.observe(worker, "broken")
        raise


def build_placing(
    workers: tuple[str, ...],
    worker_dns: tuple[str, ...],
    *,
    policy: Policy = "cache-aware",
    kv_residency: bool = False,
    timeout: float,
) -> PlacingClient | None:
    """The frontend's own placement for ``--worker``/``--worker-dns`` (None without either);
    ``DiscoveryError`` for an address discovery cannot use."""
    if not workers and not worker_dns:
        return None
    sources = build_sources(
        workers=workers, worker_dns=worker_dns, prefill=(), prefill_dns=(), decode=(), decode_dns=()
    )
    config = RouterConfig(
        connect_timeout_s=min(DEFAULT_CONNECT_TIMEOUT_S, timeout),
        read_timeout_s=timeout,
        policy=policy,
        kv_residency=kv_residency,
    )
    return PlacingClient(RouterState(sources=sources, config=config), timeout=timeout)
