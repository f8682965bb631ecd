"""Place a request and open its worker's answer: the router's request path and a frontend that
places in its own process (``kvretention frontend --worker-dns``, one HTTP hop) share it.

The caller owns what :func:`open_aggregated` returns: it reads the answer, then releases the
response and calls ``state.end(worker)``. Placement reads headers only (``x-session-id``,
``x-kvr-prefix``, ``x-kvr-tenant``); the body goes to the worker as the bytes given.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp

from kvretention.common.tenancy import scoped_chain, scoped_session, tenant_of_headers
from kvretention.dataplane.hop_client import HopConnectError, HopResponse
from kvretention.dataplane.protocol import (
    ERROR_STATUS,
    GENERATE_PATH,
    HEADER_PREFIX,
    HEADER_ROLE,
    ErrorCode,
)
from kvretention.dataplane.router.discovery import PoolRole
from kvretention.dataplane.router.placement import (
    Choice,
    parse_prefix_header,
    plan_worker,
    session_of,
)
from kvretention.dataplane.router.state import RouterState, Worker, connect_evidence


@dataclass(frozen=True)
class Placement:
    """What placement reads of one request, scoped to its tenant: pins and the prefix index per
    tenant, so one tenant's prompts never steer another's placement."""

    tenant: str | None
    session: str | None
    chain: list[str]
    resident: dict[str, int]
    """URL -> the session's tokens each worker's engine reports (``--kv-residency``)."""


def read_placement(state: RouterState, headers: Mapping[str, str], body: bytes) -> Placement:
    """The request's placement inputs; ``ValueError`` when its tenant header is malformed."""
    session = session_of(body, {k.lower(): v for k, v in headers.items()})
    chain: list[str] = []
    if state.config.policy == "cache-aware":
        chain = parse_prefix_header(headers.get(HEADER_PREFIX))
    tenant = tenant_of_headers(headers)
    session, chain = scoped_session(tenant, session), scoped_chain(tenant, chain)
    # What the engines hold for this session: the worker files it under the tenant's salt and the
    # same scoped session.
    resident = state.resident(
        "prefill" if state.disaggregated else "aggregated",
        tenant=tenant,
        session=session,
        now=time.monotonic(),
    )
    return Placement(tenant=tenant, session=session, chain=chain, resident=resident)


def choose(
    state: RouterState, role: PoolRole, placement: Placement, exclude: set[str]
) -> Choice | None:
    views = [w.view() for w in state.pool(role) if w.url not in exclude]
    pinned = state.pins.get(role, placement.session)
    chain = placement.chain
    matched = state.prefixes.match(chain) if chain and pinned is None else None
    return plan_worker(
        views,
        pinned=pinned,
        matched=matched,
        resident=placement.resident,
        balance=state.config.balance,
    )


def pin(
    state: RouterState, role: PoolRole, session: str | None, choice: Choice, chain: list[str]
) -> None:
    """Remember the choice for the session's next request, and count what decided it."""
    if choice.sticky:
        state.metrics.sticky.inc()
    elif choice.resident:
        state.metrics.resident.inc()
    elif choice.matched:
        state.metrics.prefix.inc()
    state.pins.set(role, session, choice.url)
    if chain:
        state.prefixes.record(chain, choice.url)


@dataclass(frozen=True)
class Opened:
    """A worker's answer, its status line read; the caller releases it and ends the worker."""

    worker: Worker
    response: HopResponse


@dataclass(frozen=True)
class Refused:
    """No worker took the request: the error line's code and message, and the metric outcome."""

    code: ErrorCode
    message: str
    outcome: str


async def open_aggregated(
    state: RouterState, body: bytes, headers: Mapping[str, str], placement: Placement
) -> Opened | Refused:
    """Send the request to the worker placement picks; a worker that nothing reached (refused
    connection), that says it is draining, or that is older than the request
    (``worker_outdated``: it stays in rotation for other requests) is skipped for the next one."""
    assert state.session is not None
    tried: set[str] = set()
    outdated = False
    while True:
        choice = choose(state, "aggregated", placement, tried)
        if choice is None:
            return refused_by_all(tried=bool(tried), outdated=outdated, what="workers")
        worker = state.workers[choice.url]
        pin(state, "aggregated", placement.session, choice, placement.chain)
        state.begin(worker)
        try:
            response = await state.session.post(
                worker.url + GENERATE_PATH,
                data=body,
                headers={**headers, HEADER_ROLE: "aggregated"},
            )
            refused = await refused_before_work(response)
            if refused is not None:
                # The worker refused before doing anything: another one may take it.
                response.release()
                if refused is ErrorCode.DRAINING:
                    state.observe(worker, "not_ready")
                tried.add(worker.url)
                outdated = outdated or refused is ErrorCode.WORKER_OUTDATED
                state.end(worker)
                continue
        except HopConnectError as exc:
            # Nothing reached the worker, so another one may take the request.
            state.observe(worker, connect_evidence(exc))
            tried.add(worker.url)
            state.end(worker)
            continue
        except (aiohttp.ClientError, TimeoutError) as exc:
            state.observe(worker, "error")
            state.end(worker)
            return Refused(
                ErrorCode.WORKER_UNAVAILABLE,
                f"worker {worker.url} failed: {exc}",
                "worker_unavailable",
            )
        except BaseException:
            state.end(worker)
            raise
        return Opened(worker=worker, response=response)


def refused_by_all(*, tried: bool, outdated: bool, what: str) -> Refused:
    """Why no worker (or pair: ``what``) is left to try: one older than the request was tried,
    or every one tried was unreachable or draining, or none was healthy."""
    if outdated:
        return Refused(
            ErrorCode.WORKER_OUTDATED,
            "no worker tried implements what this request needs (the fleet's workers are"
            " older than its frontend: retry once their rollout is done)",
            "worker_outdated",
        )
    if tried:
        return Refused(
            ErrorCode.WORKER_UNAVAILABLE,
            "every worker tried was unreachable",
            "worker_unavailable",
        )
    return Refused(ErrorCode.NO_WORKERS, f"no healthy {what}", "no_workers")


_BEFORE_WORK: Final = frozenset({ErrorCode.DRAINING, ErrorCode.WORKER_OUTDATED})
"""What a worker refuses before doing anything (both 503): another worker may take the request."""


async def refused_before_work(resp: HopResponse) -> ErrorCode | None:
    """The code of a 503 a worker sent before doing anything (``draining``,
    ``worker_outdated``); None for any other answer, whose body is left to be read."""
    if resp.status != ERROR_STATUS[ErrorCode.DRAINING]:
        return None
    try:
        data = await resp.read()
    except (aiohttp.ClientError, TimeoutError):
        return None
    try:
        body = json.loads(data)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    code = error.get("code") if isinstance(error, dict) else None
    refused = next((c for c in _BEFORE_WORK if c.value == code), None)
    if refused is None:
        resp.unread(data)
    return refused
