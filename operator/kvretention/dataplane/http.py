"""The HTTP shell every kvretention process shares: ``/healthz``, ``/readyz``, ``/metrics``, and
serving until SIGTERM or SIGINT, optionally with ``/metrics`` alone on a second port.

Each service supplies only what differs (its readiness check, its registry, what it does between
the signal and closing the listener); paths, status codes, content types and the shutdown order are
decided here once. Liveness answers whenever the event loop does; readiness is 200 or 503 with a
JSON body saying why; metrics are Prometheus text from one registry per process. A request
aiohttp's HTTP parser refuses (a bad header line, an oversized line, a smuggling shape) is answered
by the service's own refusal and logged as one short line, never with the request's bytes.

A connection holds an open file, so none is held for nothing: an idle one (before its first
request or between two) is closed after :data:`IDLE_TIMEOUT_S`, and a request head (line and
headers) must arrive whole within :data:`HEAD_TIMEOUT_S` of its first byte, so silent or
half-sent connections cannot use up the process's open files and lock out clients with a key.
When the files run out all the same, the event loop's accept errors are logged once per
:data:`ACCEPT_ERROR_LOG_EVERY_S` with a count, not once per try.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import click
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from kvretention.api.names import HEALTH_PATH, METRICS_PATH, READY_PATH

METRICS_CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
STOP_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
REFUSAL_LOG_EVERY_S: Final = 60.0
IDLE_TIMEOUT_S: Final = 75.0
"""An idle connection's life (aiohttp's own default is 3630 s): longer than any HTTP client
keeps an idle connection pooled (httpx 5 s, aiohttp 15 s, Node 4 s, Go 90 s retries a request
a closed idle connection refused), as nginx's default."""
HEAD_TIMEOUT_S: Final = 15.0
"""From a request head's first byte to its last (a client sends it in one write)."""
ACCEPT_ERROR_LOG_EVERY_S: Final = 10.0
_ACCEPT_ERROR: Final = "socket.accept() out of system resource"

log = logging.getLogger("kvretention.http")


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


METRICS_REGISTRY: Final = web.AppKey("kvretention_metrics_registry", CollectorRegistry)
"""The registry an app's ``/metrics`` serves; the metrics port serves the same one."""


def add_metrics(app: web.Application, registry: CollectorRegistry) -> None:
    """``GET /metrics``: the process's registry."""

    async def metrics(_: web.Request) -> web.Response:
        return metrics_response(registry)

    app[METRICS_REGISTRY] = registry
    app.router.add_get(METRICS_PATH, metrics)


metrics_port_option: Final = click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Also serve /metrics alone on this port: no API route and no key there, for scrapers "
    "(the operator sets it; unset, /metrics is only on --port).",
)
"""The data-plane CLIs' ``--metrics-port`` (passed on to :func:`serve_until_signal`)."""


def build_metrics_app(registry: CollectorRegistry) -> web.Application:
    """What the metrics port serves: ``GET /metrics`` and nothing else. No API route, no probe
    and no key: a scraper let in to this port can read the numbers and do nothing more."""
    app = web.Application()
    add_metrics(app, registry)
    return app


RefusalResponse = Callable[[str | None, HttpProcessingError], web.StreamResponse]
"""The answer to a request the HTTP parser refused, given its path when its request line was
readable (``None`` when not) and the parser's exception (its message quotes the refused bytes:
never to be sent or logged)."""


def _plain_refusal(_path: str | None, _exc: HttpProcessingError) -> web.StreamResponse:
    return web.Response(status=400, text="Bad Request: the request's head could not be parsed.")


@dataclass
class _LogThrottle:
    """One log line per ``every_s`` at most: the lines held back in between are counted, and the
    next line written says how many, so a flood costs one line a period and loses no count."""

    _last: float = -math.inf
    _held: int = 0

    def more(self, now: float, every_s: float) -> str | None:
        """``None``: hold this line back; else what it adds about those held back since the last."""
        if now - self._last < every_s:
            self._held += 1
            return None
        more = f"; {self._held} more since the last such line" if self._held else ""
        self._last, self._held = now, 0
        return more


@dataclass
class ParserRefusals:
    """How a process answers and records requests aiohttp's parser refuses.

    aiohttp would log an ERROR traceback quoting the refused header line (an API key with it) and
    answer ``text/plain``; here each refusal is counted by reason (the exception's class) and
    logged as one line at most every ``log_every_s`` seconds, naming the peer and the reason only.
    """

    respond: RefusalResponse = _plain_refusal
    registry: CollectorRegistry | None = None
    log_every_s: float = REFUSAL_LOG_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _lines: _LogThrottle = field(default_factory=_LogThrottle, init=False)
    _counter: Counter | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.registry is not None:
            self._counter = Counter(
                "kvretention_http_parser_refusals",
                "Requests refused by the HTTP parser (malformed head), by reason.",
                ["reason"],
                registry=self.registry,
            )

    def note(self, exc: BaseException, *, peer: str | None) -> None:
        reason = type(exc).__name__
        if self._counter is not None:
            self._counter.labels(reason).inc()
        more = self._lines.more(self.clock(), self.log_every_s)
        if more is not None:
            log.warning("refused a malformed HTTP request from %s (%s)%s", peer, reason, more)


PARSER_REFUSALS: Final = web.AppKey("kvretention_parser_refusals", ParserRefusals)
"""Set on an app to choose its refusal answer and metric; a plain 400 and the log line without."""

_REQUEST_LINE: Final = re.compile(rb"[A-Z]{3,10} (/[^ ?#\r\n]{0,512})")


class _ShellRequestHandler(web.RequestHandler):
    """aiohttp's connection handler with parser refusals answered by ``ParserRefusals`` and a
    deadline on each request head (``head_timeout``; aiohttp's ``keepalive_timeout`` bounds
    the idle time before it)."""

    def __init__(
        self,
        manager: web.Server,
        *,
        refusals: ParserRefusals,
        head_timeout: float,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._refusals = refusals
        self._last_path: str | None = None
        self._head_timeout = head_timeout
        self._head_deadline: asyncio.TimerHandle | None = None
        self._head_started = False
        """Whether ``_head_deadline`` counts from a head's first byte (not from idleness)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # aiohttp before 3.10 has no idle timer before a connection's first request
        self._await_head(self._keepalive_timeout)

    def data_received(self, data: bytes) -> None:
        # The path is remembered only to pick the refusal's shape; a head the parser refuses
        # never gets as far as a request object that would carry it.
        line = _REQUEST_LINE.match(data)
        if line is not None:
            self._last_path = line.group(1).decode("ascii", "replace")
        waiting = self._waiter is not None and not self._waiter.done()  # between requests
        count, queued = self._request_count, len(self._messages)
        super().data_received(data)
        self._fail_body_on_parse_error(queued)
        if self._request_count != count:
            self._cancel_head_deadline()
        elif waiting and data and not self._head_started:
            # the deadline runs from the head's first byte: later bytes never extend it
            self._cancel_head_deadline()
            self._await_head(self._head_timeout)
            self._head_started = True

    def _fail_body_on_parse_error(self, queued: int) -> None:
        """A framing error in a body the handler is reading (a bad chunk size after the head):
        aiohttp queues a 400 for after the handler but leaves the body open, so the handler would
        wait out its body timeout (408). Failing the body as a payload error makes the handler
        answer its own 400 at once, in its provider's shape."""
        request = self._current_request
        if request is None or request.content.is_eof():
            return
        for message, _ in list(self._messages)[queued:]:
            exc = getattr(message, "exc", None)  # aiohttp's queued parser error (_ErrInfo)
            if isinstance(exc, HttpProcessingError):
                request._cancel(web.RequestPayloadError(f"invalid body framing: {exc.message}"))
                return

    def _await_head(self, timeout: float) -> None:
        if timeout > 0 and self._head_deadline is None:
            self._head_deadline = self._loop.call_later(
                timeout, self._head_overdue, self._request_count
            )

    def _head_overdue(self, count: int) -> None:
        self._head_deadline, self._head_started = None, False
        if self._request_count == count and self.transport is not None:
            log.debug("closed a connection whose request head did not arrive in time")
            self.force_close()

    def _cancel_head_deadline(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
        self._head_deadline, self._head_started = None, False

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if not isinstance(exc, HttpProcessingError) or status >= 500:
            return super().handle_error(request, status, exc, message)
        self._refusals.note(exc, peer=request.remote)
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already sent; cannot send the refusal")
        response = self._refusals.respond(self._last_path, exc)
        response.force_close()  # where the refused head ends is unknown
        return response


class _ShellServer(web.Server):
    def __init__(
        self, *args: Any, refusals: ParserRefusals, head_timeout: float, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._refusals = refusals
        self._head_timeout = head_timeout

    def __call__(self) -> web.RequestHandler:
        return _ShellRequestHandler(
            self,
            refusals=self._refusals,
            head_timeout=self._head_timeout,
            loop=self._loop,  # aiohttp's own factory passes the same two fields
            **self._kwargs,
        )


class ShellRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser refusals by the app's
    :data:`PARSER_REFUSALS` (aiohttp offers no hook for it but its handler's ``handle_error``)
    and whose request heads must arrive within ``head_timeout`` seconds."""

    def __init__(
        self, app: web.Application, *, head_timeout: float = HEAD_TIMEOUT_S, **kwargs: Any
    ) -> None:
        super().__init__(app, **kwargs)
        self._head_timeout = head_timeout

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _ShellServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            refusals=self.app.get(PARSER_REFUSALS) or ParserRefusals(),
            head_timeout=self._head_timeout,
            **server._kwargs,
        )


@dataclass
class AcceptErrors:
    """The event loop's handler for its errors: "socket.accept() out of system resource" (the
    process's open files used up; the loop retries every second and logs each try) becomes one
    line per ``log_every_s`` with a count; anything else goes to the handler it replaced."""

    previous: Callable[[asyncio.AbstractEventLoop, dict[str, Any]], object] | None
    log_every_s: float = ACCEPT_ERROR_LOG_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _lines: _LogThrottle = field(default_factory=_LogThrottle, init=False)

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != _ACCEPT_ERROR:
            if self.previous is not None:
                self.previous(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        more = self._lines.more(self.clock(), self.log_every_s)
        if more is not None:
            log.error("cannot accept connections: %s%s", context.get("exception"), more)


def throttle_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Install :class:`AcceptErrors` on ``loop`` (once)."""
    previous = loop.get_exception_handler()
    if not isinstance(previous, AcceptErrors):
        loop.set_exception_handler(AcceptErrors(previous))


MIN_SHUTDOWN_TIMEOUT_S: Final = 0.05
"""aiohttp reads a shutdown timeout of 0 as "wait for in-flight handlers forever": a process told to
give them no time gives them this much, then cancels them."""


async def start_site(
    app: web.Application,
    *,
    host: str,
    port: int,
    shutdown_timeout: float = 60.0,
    handler_cancellation: bool = False,
    idle_timeout: float = IDLE_TIMEOUT_S,
    head_timeout: float = HEAD_TIMEOUT_S,
) -> web.AppRunner:
    """Listen on ``host:port``; the caller owns the runner and calls ``cleanup()`` to stop, which
    gives in-flight handlers ``shutdown_timeout`` seconds (0: at once) before cancelling them.
    A connection idle for ``idle_timeout`` seconds, or whose request head takes longer than
    ``head_timeout`` from its first byte, is closed."""
    throttle_accept_errors(asyncio.get_running_loop())
    runner = ShellRunner(
        app,
        access_log=None,
        shutdown_timeout=max(shutdown_timeout, MIN_SHUTDOWN_TIMEOUT_S),
        handler_cancellation=handler_cancellation,
        keepalive_timeout=idle_timeout,
        head_timeout=head_timeout,
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
    metrics_port: int | None = None,
    on_listening: Callable[[], None] | None = None,
    before_close: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve a data-plane app until SIGTERM/SIGINT, then close it gracefully.

    With ``metrics_port``, the app's registry (:func:`add_metrics`) is also served alone on that
    port (:func:`build_metrics_app`), and stays up until the app has closed, so a drain is
    scraped to its end.

    Order on a signal: ``before_close`` (a worker drains here while still answering ``/readyz``
    503), then the listener closes and in-flight handlers get ``shutdown_timeout`` seconds before
    they are cancelled, then the app's cleanup contexts run. A client that disconnects cancels its
    handler (``handler_cancellation``), so an abandoned generation is aborted, not run to its end.
    """
    metrics_runner = None
    if metrics_port is not None:
        metrics_app = build_metrics_app(app[METRICS_REGISTRY])
        metrics_runner = await start_site(
            metrics_app, host=host, port=metrics_port, shutdown_timeout=1.0
        )
    try:
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
    finally:
        if metrics_runner is not None:
            await metrics_runner.cleanup()
