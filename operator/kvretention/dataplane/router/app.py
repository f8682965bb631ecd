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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvretention.api.names import READY_PATH
from kvretention.dataplane.http import Readiness, add_metrics, add_probes
from kvretention.dataplane.labelled import Children
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
from kvretention.dataplane.router.discovery import (
    PoolRole,
    Source,
    discover,
    held_departing,
    plan_membership,
)
from kvretention.dataplane.router.health import (
    DEFAULT_EJECT_AFTER,
    Evidence,
    HealthRecord,
    plan_health,
)
from kvretention.dataplane.router.placement import (
    DEFAULT_MAX_PREFIXES,
    DEFAULT_MAX_SESSIONS,
    Balance,
    Choice,
    Policy,
    PrefixIndex,
    SessionPins,
    WorkerView,
    parse_prefix_header,
    plan_pair,
    plan_worker,
    session_of,
)
from kvretention.dataplane.tenancy import (
    HEADER_TENANT,
    scoped_chain,
    scoped_session,
    tenant_of_headers,
)

log = logging.getLogger(__name__)

INFO_PATH: Final = "/v1/info"
"""Polled on each worker: readiness, so a draining worker stops getting new requests."""


@dataclass
class RouterConfig:
    health_interval_s: float = 2.0
    health_timeout_s: float = 1.0
    eject_after: int = DEFAULT_EJECT_AFTER
    """Failed polls (or broken requests) in a row, with no answer in between, that eject a worker."""
    dns_interval_s: float = 5.0
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 600.0
    """Longest gap between two streamed chunks before the request fails with ``upstream_timeout``."""
    bootstrap_port: int | None = None
    """Prefill bootstrap port when a prefill worker's ``/v1/info`` does not say."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    policy: Policy = "cache-aware"
    """Placement of requests without a session pin: longest prefix match, or least outstanding."""
    max_prefixes: int = DEFAULT_MAX_PREFIXES
    balance: Balance = field(default_factory=Balance)


@dataclass
class Worker:
    url: str
    role: PoolRole
    health: HealthRecord = field(default_factory=HealthRecord)
    outstanding: int = 0
    served: int = 0
    answered: int = 0
    """Real requests the worker answered (a 2xx status): passive evidence that it is alive."""
    answered_seen: int = 0
    """``answered`` when its health was last weighed."""
    info: dict[str, Any] | None = None

    @property
    def healthy(self) -> bool:
        return self.health.healthy

    def view(self) -> WorkerView:
        return WorkerView(
            url=self.url, healthy=self.healthy, outstanding=self.outstanding, served=self.served
        )


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "kvretention_router_requests",
            "Routed requests by mode and outcome.",
            ["mode", "outcome"],
            registry=self.registry,
        )
        self.healthy = Gauge(
            "kvretention_router_healthy_workers",
            "Healthy workers by role.",
            ["role"],
            registry=self.registry,
        )
        self.outstanding = Gauge(
            "kvretention_router_outstanding_requests",
            "Requests in flight per worker.",
            ["role", "url"],
            registry=self.registry,
        )
        self.pool_outstanding = Gauge(
            "kvretention_router_pool_outstanding_requests",
            "Requests in flight per pool (role): the signal a pool's autoscaler divides by replicas.",
            ["role"],
            registry=self.registry,
        )
        for role in ("aggregated", "prefill", "decode"):
            self.pool_outstanding.labels(role)  # present at 0 before the first request
        self.ejections = Counter(
            "kvretention_router_worker_ejections",
            "Workers taken out of rotation.",
            ["role", "reason"],
            registry=self.registry,
        )
        self.health_failures = Counter(
            "kvretention_router_worker_health_failures",
            "Failed health polls and broken requests, by what they showed.",
            ["role", "evidence"],
            registry=self.registry,
        )
        self.kept = Counter(
            "kvretention_router_worker_kept",
            "Failing workers kept in rotation: answering real requests, or the pool's last one.",
            ["role", "why"],
            registry=self.registry,
        )
        self.sticky = Counter(
            "kvretention_router_sticky_placements",
            "Placements decided by a session pin.",
            registry=self.registry,
        )
        self.prefix = Counter(
            "kvretention_router_prefix_placements",
            "Placements decided by a prefix match (cache-aware policy).",
            registry=self.registry,
        )
        # Every request moves these; each label set is resolved once (kvretention.dataplane.labelled).
        self.requests_of = Children(self.requests)
        self.outstanding_of = Children(self.outstanding)
        self.pool_outstanding_of = Children(self.pool_outstanding)


@dataclass
class RouterState:
    sources: list[Source]
    config: RouterConfig = field(default_factory=RouterConfig)
    workers: dict[str, Worker] = field(default_factory=dict)
    metrics: RouterMetrics = field(default_factory=RouterMetrics)
    session: aiohttp.ClientSession | None = None
    health_session: aiohttp.ClientSession | None = None
    """Polls travel on their own connections, never queued behind long streams."""
    pins: SessionPins = field(init=False)
    prefixes: PrefixIndex = field(init=False)

    def __post_init__(self) -> None:
        self.pins = SessionPins(max_sessions=self.config.max_sessions)
        self.prefixes = PrefixIndex(max_prefixes=self.config.max_prefixes)

    @property
    def disaggregated(self) -> bool:
        return any(s.role != "aggregated" for s in self.sources)

    def pool(self, role: PoolRole) -> list[Worker]:
        return [w for w in self.workers.values() if w.role == role]

    def ready(self) -> bool:
        roles: tuple[PoolRole, ...] = (
            ("prefill", "decode") if self.disaggregated else ("aggregated",)
        )
        return all(any(w.healthy for w in self.pool(r)) for r in roles)

    def observe(self, worker: Worker, evidence: Evidence) -> None:
        """Weigh one poll's or one request's evidence about ``worker`` (see ``router.health``)."""
        served_since = worker.answered != worker.answered_seen
        worker.answered_seen = worker.answered
        others = any(w.healthy for w in self.pool(worker.role) if w is not worker)
        step = plan_health(
            worker.health,
            evidence,
            served_since=served_since,
            last_healthy=not others,
            eject_after=self.config.eject_after,
        )
        if evidence != "ok":
            self.metrics.health_failures.labels(worker.role, evidence).inc()
        if step.ejected is not None:
            log.warning("ejecting %s worker %s (%s)", worker.role, worker.url, step.ejected)
            self.metrics.ejections.labels(worker.role, step.ejected).inc()
        elif step.admitted:
            log.info("admitting %s worker %s", worker.role, worker.url)
        elif step.held is not None:
            if step.held == "last_worker" and worker.health.failures < self.config.eject_after:
                log.warning(
                    "keeping slow %s worker %s: it is the last healthy one", worker.role, worker.url
                )
            self.metrics.kept.labels(worker.role, step.held).inc()
        worker.health = step.record
        self._publish()

    def answered(self, worker: Worker) -> None:
        """A real request got a status line from ``worker``: it is alive, however slow its polls."""
        worker.answered += 1

    def _publish(self) -> None:
        for role in ("aggregated", "prefill", "decode"):
            self.metrics.healthy.labels(role).set(
                sum(1 for w in self.workers.values() if w.role == role and w.healthy)
            )

    def begin(self, worker: Worker) -> None:
        worker.outstanding += 1
        worker.served += 1
        self.metrics.outstanding_of(worker.role, worker.url).set(worker.outstanding)
        self.metrics.pool_outstanding_of(worker.role).inc()

    def end(self, worker: Worker) -> None:
        worker.outstanding -= 1
        self.metrics.outstanding_of(worker.role, worker.url).set(worker.outstanding)
        self.metrics.pool_outstanding_of(worker.role).dec()


STATE: Final = web.AppKey("router_state", RouterState)


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
    """One readiness poll; prefill workers also report their bootstrap address once."""
    assert state.health_session is not None
    session = state.health_session
    timeout = aiohttp.ClientTimeout(total=state.config.health_timeout_s)
    evidence: Evidence
    try:
        async with session.get(worker.url + READY_PATH, timeout=timeout) as resp:
            evidence = (
                "ok" if resp.status == 200 else "not_ready" if resp.status == 503 else "error"
            )
        if evidence == "ok" and worker.role == "prefill" and worker.info is None:
            async with session.get(worker.url + INFO_PATH, timeout=timeout) as resp:
                if resp.status == 200:
                    worker.info = await resp.json()
    except TimeoutError:
        evidence = "timeout"
    except aiohttp.ClientConnectorError as exc:
        evidence = connect_evidence(exc)
    except aiohttp.ClientError:
        evidence = "error"
    state.observe(worker, evidence)


def connect_evidence(exc: aiohttp.ClientConnectorError) -> Evidence:
    """A refused connection is decisive (no process listens); anything else is not."""
    return "refused" if isinstance(exc.os_error, ConnectionRefusedError) else "error"


async def check_all(state: RouterState) -> None:
    await asyncio.gather(*(check_worker(state, w) for w in list(state.workers.values())))


async def _every(interval_s: float, job: Any, state: RouterState) -> None:
    while True:
        await asyncio.sleep(interval_s)
        try:
            await job(state)
        except Exception:  # a background loop must survive one bad round
            log.exception("router background job failed")


async def _background(app: web.Application) -> Any:
    state = app[STATE]
    timeout = aiohttp.ClientTimeout(
        total=None, connect=state.config.connect_timeout_s, sock_read=state.config.read_timeout_s
    )
    state.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)
    state.health_session = aiohttp.ClientSession()
    await refresh_membership(state)
    await check_all(state)
    tasks = [
        asyncio.create_task(_every(state.config.health_interval_s, check_all, state)),
        asyncio.create_task(_every(state.config.dns_interval_s, refresh_membership, state)),
    ]
    yield
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await state.session.close()
    await state.health_session.close()


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
    body = await request.read()
    session = session_of(body, {k.lower(): v for k, v in request.headers.items()})
    chain: list[str] = []
    if state.config.policy == "cache-aware":
        chain = parse_prefix_header(request.headers.get(HEADER_PREFIX))
    try:
        tenant = tenant_of_headers(request.headers)
    except ValueError as exc:
        return error_response(ErrorCode.INVALID_REQUEST, str(exc))
    # Pins and the prefix index per tenant: one tenant's prompts never steer another's placement.
    session, chain = scoped_session(tenant, session), scoped_chain(tenant, chain)
    mode = "disaggregated" if state.disaggregated else "aggregated"
    outcome = "error"
    try:
        if state.disaggregated:
            response, outcome = await _disaggregated(request, state, body, session, chain)
        else:
            response, outcome = await _aggregated(request, state, body, session, chain)
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
    return headers


def _choose(
    state: RouterState, role: PoolRole, session: str | None, exclude: set[str], chain: list[str]
) -> Choice | None:
    views = [w.view() for w in state.pool(role) if w.url not in exclude]
    pinned = state.pins.get(role, session)
    matched = state.prefixes.match(chain) if chain and pinned is None else None
    return plan_worker(views, pinned=pinned, matched=matched, balance=state.config.balance)


def _pin(
    state: RouterState, role: PoolRole, session: str | None, choice: Choice, chain: list[str]
) -> None:
    if choice.sticky:
        state.metrics.sticky.inc()
    elif choice.matched:
        state.metrics.prefix.inc()
    state.pins.set(role, session, choice.url)
    if chain:
        state.prefixes.record(chain, choice.url)


async def _aggregated(
    request: web.Request, state: RouterState, body: bytes, session: str | None, chain: list[str]
) -> tuple[web.StreamResponse, str]:
    assert state.session is not None
    tried: set[str] = set()
    while True:
        choice = _choose(state, "aggregated", session, tried, chain)
        if choice is None:
            if tried:
                return error_response(
                    ErrorCode.WORKER_UNAVAILABLE, "every worker tried was unreachable"
                ), "worker_unavailable"
            return error_response(ErrorCode.NO_WORKERS, "no healthy workers"), "no_workers"
        worker = state.workers[choice.url]
        _pin(state, "aggregated", session, choice, chain)
        state.begin(worker)
        try:
            async with state.session.post(
                worker.url + GENERATE_PATH,
                data=body,
                headers={**_passed_on(request), HEADER_ROLE: "aggregated"},
            ) as upstream:
                if upstream.status == ERROR_STATUS[ErrorCode.DRAINING] and await _is_draining(
                    upstream
                ):
                    # The worker refused before doing anything: another one may take it.
                    state.observe(worker, "not_ready")
                    tried.add(worker.url)
                    continue
                return await _relay(request, state, worker, upstream)
        except aiohttp.ClientConnectorError as exc:
            # Nothing reached the worker, so another one may take the request.
            state.observe(worker, connect_evidence(exc))
            tried.add(worker.url)
        except (aiohttp.ClientError, TimeoutError) as exc:
            state.observe(worker, "error")
            return error_response(
                ErrorCode.WORKER_UNAVAILABLE, f"worker {worker.url} failed: {exc}"
            ), "worker_unavailable"
        finally:
            state.end(worker)


async def _disaggregated(
    request: web.Request, state: RouterState, body: bytes, session: str | None, chain: list[str]
) -> tuple[web.StreamResponse, str]:
    assert state.session is not None
    pinned_prefill = state.pins.get("prefill", session)
    pair = plan_pair(
        [w.view() for w in state.pool("prefill")],
        [w.view() for w in state.pool("decode")],
        pinned_prefill=pinned_prefill,
        pinned_decode=state.pins.get("decode", session),
        # The prompt is prefilled, and retained, on the prefill side.
        matched_prefill=state.prefixes.match(chain) if chain and pinned_prefill is None else None,
        balance=state.config.balance,
    )
    if pair is None:
        return error_response(
            ErrorCode.NO_WORKERS, "no healthy prefill/decode worker pair"
        ), "no_workers"
    prefill, decode = state.workers[pair.prefill.url], state.workers[pair.decode.url]
    bootstrap = plan_bootstrap(prefill.url, prefill.info, default_port=state.config.bootstrap_port)
    if bootstrap is None:
        return error_response(
            ErrorCode.WORKER_UNAVAILABLE,
            f"prefill worker {prefill.url} reports no bootstrap port; start the router with "
            "--bootstrap-port or the worker with --bootstrap-port",
        ), "worker_unavailable"
    _pin(state, "prefill", session, pair.prefill, chain)
    _pin(state, "decode", session, pair.decode, [])
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
    opened: list[aiohttp.ClientResponse] = []
    drain_task: asyncio.Task[None] | None = None

    async def send(worker: Worker, role: str) -> aiohttp.ClientResponse:
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
            if isinstance(result, aiohttp.ClientConnectorError):
                state.observe(worker, connect_evidence(result))
            if isinstance(result, BaseException):
                return error_response(
                    ErrorCode.WORKER_UNAVAILABLE,
                    f"{worker.role} worker {worker.url} unreachable: {result}",
                ), "worker_unavailable"
        resp_p, resp_d = results
        assert isinstance(resp_p, aiohttp.ClientResponse)
        assert isinstance(resp_d, aiohttp.ClientResponse)
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


async def _is_draining(resp: aiohttp.ClientResponse) -> bool:
    try:
        body = await resp.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        return False
    error = body.get("error") if isinstance(body, dict) else None
    return isinstance(error, dict) and error.get("code") == ErrorCode.DRAINING.value


async def _discard(resp: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        await resp.read()


async def _passthrough_error(resp: aiohttp.ClientResponse) -> web.Response:
    """A worker's non-2xx answer reaches the client as the worker wrote it (typed error codes)."""
    body = await resp.read()
    return web.Response(status=resp.status, body=body, content_type="application/json")


async def _relay(
    request: web.Request, state: RouterState, worker: Worker, upstream: aiohttp.ClientResponse
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
            }
            for w in sorted(state.workers.values(), key=lambda w: (w.role, w.url))
        ]
    )


def build_app(state: RouterState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app.cleanup_ctx.append(_background)
    app.router.add_post(GENERATE_PATH, handle_generate)
    add_probes(app, ready=lambda: readiness(state))
    app.router.add_get("/v1/workers", handle_workers)
    add_metrics(app, state.metrics.registry)
    return app
