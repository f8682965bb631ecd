"""The router's request path: place each request, forward its exact bytes, stream the answer back.

A worker that dies mid-stream gives the client a final ``worker_unavailable`` line; a client that
disconnects closes the upstream request, which makes the worker abort it in the engine. With
``--hop-key-file`` a request whose tenant the fleet's frontend did not sign is refused before
anything else (403 ``hop_unauthenticated``, :mod:`kvretention.common.hop_auth`); a signed one is
forwarded with its signature, which each worker checks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import msgspec
from aiohttp import web

from kvretention.common.hop_auth import HEADER_TENANT_SIG
from kvretention.common.tenancy import HEADER_TENANT
from kvretention.dataplane.hop_client import HopConnectError, HopResponse
from kvretention.dataplane.hop_key import refused_hop
from kvretention.dataplane.protocol import (
    ERROR_STATUS,
    GENERATE_PATH,
    HEADER_BOOTSTRAP_HOST,
    HEADER_BOOTSTRAP_PORT,
    HEADER_BOOTSTRAP_ROOM,
    HEADER_PREFIX,
    HEADER_ROLE,
    NDJSON,
    ErrorBody,
    ErrorCode,
    ErrorLine,
)
from kvretention.dataplane.router.placement import PairChoice, plan_pair
from kvretention.dataplane.router.placing import (
    Placement,
    Refused,
    open_aggregated,
    pin,
    read_placement,
    refused_before_work,
    refused_by_all,
)
from kvretention.dataplane.router.state import STATE, RouterState, Worker, connect_evidence

# ---------------------------------------------------------------- request path


class ClientGone(Exception):
    """The client disconnected while its answer was being written (not the worker's fault)."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("client disconnected")
        self.response = response


async def _write(out: web.StreamResponse, data: bytes) -> None:
    # aiohttp's write error on a closed client is also a ClientError; keep the two apart so a
    # client that walks away never gets a worker ejected.
    try:
        await out.write(data)
    except ConnectionResetError as exc:
        raise ClientGone(out) from exc


def error_response(code: ErrorCode, message: str) -> web.Response:
    line = ErrorLine(error=ErrorBody(code=code, message=message))
    return web.Response(
        status=ERROR_STATUS[code], body=line.model_dump_json(), content_type="application/json"
    )


def error_line(code: ErrorCode, message: str) -> bytes:
    return ErrorLine(error=ErrorBody(code=code, message=message)).model_dump_json().encode() + b"\n"


_DECODE: Final = msgspec.json.Decoder().decode


def _complete(data: bytes) -> bool:
    """Whether ``data`` is a whole answer: whole lines, the last one terminal."""
    if not data.endswith(b"\n"):
        return False
    lines = [line for line in data.split(b"\n") if line.strip()]
    return bool(lines) and is_terminal(lines[-1])


def is_terminal(line: bytes) -> bool:
    """A stream's last line must be an error line or a chunk with a finish reason (msgspec
    reads it where it accepts it, with ``json``'s values; ``json`` decides the rest)."""
    try:
        obj = _DECODE(line)
    except msgspec.DecodeError:
        try:
            obj = json.loads(line)
        except ValueError:
            return False
    return isinstance(obj, dict) and ("error" in obj or obj.get("finish_reason") is not None)


def plan_bootstrap(
    worker_url: str, info: dict[str, Any] | None, *, default_port: int | None
) -> tuple[str, int] | None:
    """The prefill worker's bootstrap server: what it reports, else its URL host and the default."""
    info = info or {}
    host = info.get("bootstrap_host") or urlsplit(worker_url).hostname
    port = info.get("bootstrap_port") or default_port
    if not host or not isinstance(port, int):
        return None
    return str(host), port


async def handle_generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    refused = refused_hop(state.hop_keys, request.headers, state.metrics.hop_refusals)
    if refused is not None:
        return error_response(ErrorCode.HOP_UNAUTHENTICATED, refused)
    body = await request.read()
    try:
        placement = read_placement(state, request.headers, body)
    except ValueError as exc:
        return error_response(ErrorCode.INVALID_REQUEST, str(exc))
    mode = "disaggregated" if state.disaggregated else "aggregated"
    outcome = "error"
    try:
        if state.disaggregated:
            response, outcome = await _disaggregated(request, state, body, placement)
        else:
            response, outcome = await _aggregated(request, state, body, placement)
        return response
    except ClientGone as gone:
        outcome = "client_gone"
        return gone.response
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        state.metrics.requests_of(mode, outcome).inc()


def _passed_on(request: web.Request) -> dict[str, str]:
    """Headers every worker request carries: the prefix chain lets the worker find the
    conversation's previous prompt to reuse its tokens."""
    headers = {"Content-Type": "application/json"}
    chain = request.headers.get(HEADER_PREFIX)
    if chain:
        headers[HEADER_PREFIX] = chain
    tenant = request.headers.get(HEADER_TENANT)
    if tenant:
        headers[HEADER_TENANT] = tenant  # the worker's cache_salt
    signature = request.headers.get(HEADER_TENANT_SIG)
    if signature:
        headers[HEADER_TENANT_SIG] = signature  # checked again by the worker, with the same key
    return headers


async def _aggregated(
    request: web.Request, state: RouterState, body: bytes, placement: Placement
) -> tuple[web.StreamResponse, str]:
    opened = await open_aggregated(state, body, _passed_on(request), placement)
    if isinstance(opened, Refused):
        return error_response(opened.code, opened.message), opened.outcome
    try:
        return await _relay(request, state, opened.worker, opened.response)
    finally:
        opened.response.release()
        state.end(opened.worker)


def _choose_pair(state: RouterState, placement: Placement, tried: set[str]) -> PairChoice | None:
    pinned_prefill = state.pins.get("prefill", placement.session)
    chain = placement.chain
    return plan_pair(
        [w.view() for w in state.pool("prefill") if w.url not in tried],
        [w.view() for w in state.pool("decode") if w.url not in tried],
        pinned_prefill=pinned_prefill,
        pinned_decode=state.pins.get("decode", placement.session),
        # The prompt is prefilled, and retained, on the prefill side.
        matched_prefill=state.prefixes.match(chain) if chain and pinned_prefill is None else None,
        resident_prefill=placement.resident,
        balance=state.config.balance,
    )


Refusals = list[tuple[Worker, ErrorCode]]
"""The halves of a pair that refused before doing anything, and why (another pair may serve)."""


async def _disaggregated(
    request: web.Request, state: RouterState, body: bytes, placement: Placement
) -> tuple[web.StreamResponse, str]:
    """Serve the request on a prefill/decode pair; a half that refuses it before doing anything
    (``draining``, ``worker_outdated``) is left out and another pair tried, as
    :func:`~kvretention.dataplane.router.placing.open_aggregated` does for one worker. The other
    half's request is closed, which aborts it in its engine."""
    tried: set[str] = set()
    outdated = False
    while True:
        pair = _choose_pair(state, placement, tried)
        if pair is None:
            refused = refused_by_all(
                tried=bool(tried), outdated=outdated, what="prefill/decode worker pair"
            )
            return error_response(refused.code, refused.message), refused.outcome
        served = await _serve_pair(request, state, body, placement, pair)
        if not isinstance(served, list):
            return served
        for worker, code in served:
            if code is ErrorCode.DRAINING:
                state.observe(worker, "not_ready")
            outdated = outdated or code is ErrorCode.WORKER_OUTDATED
            tried.add(worker.url)


async def _serve_pair(
    request: web.Request, state: RouterState, body: bytes, placement: Placement, pair: PairChoice
) -> tuple[web.StreamResponse, str] | Refusals:
    assert state.session is not None
    session, chain = placement.session, placement.chain
    prefill, decode = state.workers[pair.prefill.url], state.workers[pair.decode.url]
    bootstrap = plan_bootstrap(prefill.url, prefill.info, default_port=state.config.bootstrap_port)
    if bootstrap is None:
        return error_response(
            ErrorCode.WORKER_UNAVAILABLE,
            f"prefill worker {prefill.url} reports no bootstrap port; start the router with "
            "--bootstrap-port or the worker with --bootstrap-port",
        ), "worker_unavailable"
    pin(state, "prefill", session, pair.prefill, chain)
    pin(state, "decode", session, pair.decode, [])
    room = secrets.randbits(63)
    headers = {
        **_passed_on(request),
        HEADER_BOOTSTRAP_HOST: bootstrap[0],
        HEADER_BOOTSTRAP_PORT: str(bootstrap[1]),
        HEADER_BOOTSTRAP_ROOM: str(room),
    }
    session_http = state.session
    state.begin(prefill)
    state.begin(decode)
    opened: list[HopResponse] = []
    drain_task: asyncio.Task[None] | None = None

    async def send(worker: Worker, role: str) -> HopResponse:
        resp = await session_http.post(
            worker.url + GENERATE_PATH, data=body, headers={**headers, HEADER_ROLE: role}
        )
        opened.append(resp)
        return resp

    try:
        results = await asyncio.gather(
            send(prefill, "prefill"), send(decode, "decode"), return_exceptions=True
        )
        for worker, result in zip((prefill, decode), results, strict=True):
            if isinstance(result, HopConnectError):
                state.observe(worker, connect_evidence(result))
            if isinstance(result, BaseException):
                return error_response(
                    ErrorCode.WORKER_UNAVAILABLE,
                    f"{worker.role} worker {worker.url} unreachable: {result}",
                ), "worker_unavailable"
        resp_p, resp_d = results
        assert isinstance(resp_p, HopResponse)
        assert isinstance(resp_d, HopResponse)
        refusals = [
            (worker, code)
            for worker, resp in ((prefill, resp_p), (decode, resp_d))
            if (code := await refused_before_work(resp)) is not None
        ]
        if refusals:
            return refusals
        for resp in (resp_p, resp_d):
            if resp.status != 200:
                return await _passthrough_error(resp), "upstream_error"
        state.answered(prefill)
        # The prefill half's answer is not the client's; read it to the end so SGLang's
        # prefill request completes, then drop it.
        drain_task = asyncio.create_task(_discard(resp_p))
        return await _relay(request, state, decode, resp_d)
    finally:
        if drain_task is not None and not drain_task.done():
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, aiohttp.ClientError):
                await asyncio.wait_for(asyncio.shield(drain_task), timeout=5.0)
            drain_task.cancel()
        for resp in opened:
            resp.close()
        state.end(prefill)
        state.end(decode)


async def _discard(resp: HopResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await resp.read()


async def _passthrough_error(resp: HopResponse) -> web.Response:
    """A worker's non-2xx answer reaches the client as the worker wrote it (typed error codes)."""
    body = await resp.read()
    return web.Response(status=resp.status, body=body, content_type="application/json")


async def _relay(
    request: web.Request, state: RouterState, worker: Worker, upstream: HopResponse
) -> tuple[web.StreamResponse, str]:
    """Stream a worker's NDJSON answer to the client, ending with an error line if it breaks off.

    An answer that arrived whole in the first read (a short one) goes out as one response with
    its headers: one socket write instead of three (headers, data, end of the chunked body),
    and each write on loopback TCP costs about as much as the router's own Python for a small
    request (benchmarks/README.md).
    """
    if upstream.status != 200:
        return await _passthrough_error(upstream), "upstream_error"
    state.answered(worker)
    failure: BaseException | None = None
    try:
        data = await upstream.content.readany()
    except (aiohttp.ClientError, TimeoutError) as exc:
        data, failure = b"", exc
    if data and upstream.content.at_eof() and _complete(data):
        state.answered(worker)
        return web.Response(body=data, headers={"Content-Type": NDJSON}), "ok"
    out = web.StreamResponse(headers={"Content-Type": NDJSON})
    await out.prepare(request)
    pending, last = b"", b""
    while failure is None:
        if not data:
            break
        state.answered(worker)  # every chunk: a long stream keeps proving the worker alive
        await _write(out, data)
        pending += data
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line.strip():
                last = line
        try:
            data = await upstream.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            failure = exc
    outcome = "ok"
    if pending.strip() or not is_terminal(last):
        if pending.strip():
            await _write(out, b"\n")
        if isinstance(failure, TimeoutError):
            code, outcome = ErrorCode.UPSTREAM_TIMEOUT, "upstream_timeout"
            message = f"worker {worker.url} sent nothing for {state.config.read_timeout_s}s"
        else:
            code, outcome = ErrorCode.WORKER_UNAVAILABLE, "worker_unavailable"
            message = f"worker {worker.url} stopped mid-stream"
            state.observe(worker, "broken")
        await _write(out, error_line(code, message))
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return out, outcome
