"""The frontend's aiohttp application: routes, the request flow, and the catch-all error layer.

Flow per generate request: read the body (bounded) -> parse JSON -> normalize cache controls and
check the schema -> check the model -> only then contact the router. A refused request gets the
provider's JSON error (also when it asked to stream); a failure after SSE began gets the provider's
SSE error event. Tracebacks are logged, never sent. Reading the body is ``body``'s, what the router
gets ``prepare``'s, the settings ``config``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TypeVar

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.http_exceptions import (
    ContentEncodingError,
    HttpProcessingError,
    TransferEncodingError,
)

from kvretention.common.trace import RequestTrace
from kvretention.dataplane.frontend import compact, discovery, errors
from kvretention.dataplane.frontend.affinity import drop_billing_header
from kvretention.dataplane.frontend.anthropic import count_tokens_response
from kvretention.dataplane.frontend.auth import (
    CLIENT_CLOSED_STATUS,
    Gate,
    tenant_headers,
    tenant_of,
)
from kvretention.dataplane.frontend.body import decode_json_body, read_body, session_of
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
from kvretention.dataplane.frontend.config import FrontendConfig, check_model, check_model_first
from kvretention.dataplane.frontend.endpoints import (
    CHAT,
    COUNT_TOKENS,
    MESSAGES,
    RESPONSES,
    Endpoint,
    GenerateEndpoint,
)
from kvretention.dataplane.frontend.errors import FrontendError, Provider, error_body
from kvretention.dataplane.frontend.metrics import FrontendMetrics
from kvretention.dataplane.frontend.prepare import build_preprocessed, hint_policy, router_headers
from kvretention.dataplane.frontend.repeats import Walks
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.frontend.tokenizer import ChatTokenizer
from kvretention.dataplane.frontend.upstream import ROUTER_SLOW, RouterClient, Upstream
from kvretention.dataplane.http import (
    PARSER_REFUSALS,
    ParserRefusals,
    Readiness,
    add_metrics,
    add_probes,
)
from kvretention.dataplane.protocol import PreprocessedRequest, SamplingParams, Usage
from kvretention.hints.errors import ClientError

log = logging.getLogger("kvretention.frontend")

REQUEST_ID_HEADER: Final = "x-request-id"
SHOULD_RETRY_HEADER: Final = "x-should-retry"


@dataclass
class FrontendState:
    config: FrontendConfig
    router: Upstream
    """The router, or the frontend's own placement (``--worker-dns``)."""
    metrics: FrontendMetrics = field(default_factory=FrontendMetrics)
    trace: RequestTrace | None = None
    tokenizer: ChatTokenizer | None = None
    cpu: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvr-parse")
    )
    """Where large bodies are parsed (and tokenized, with ``--tokenizer``): one thread, so the
    tokenizer is never called from two threads at once."""
    resumer: Resumer = field(default_factory=Resumer)
    """Recent conversations' parses, so a session's next body parses only its new messages."""
    last_ready: Readiness | None = None
    """The last readiness verdict the router gave (held while its poll only times out)."""


STATE: Final = web.AppKey("kvretention_frontend", FrontendState)

_T = TypeVar("_T")
OFF_LOOP_BYTES: Final = 64 * 1024
"""Bodies from this size on (a coding agent's history is ~200 KB and takes 10-20 ms of CPU to
parse) are parsed off the event loop, so streams in flight and the kubelet's probes keep being
answered during a burst of them; smaller ones cost less than the hand-off."""


async def off_loop(state: FrontendState, size: int, work: Callable[[], _T]) -> _T:
    """``work()`` on the parse thread when ``size`` is large, else right here."""
    if size < OFF_LOOP_BYTES:
        return work()
    return await asyncio.get_running_loop().run_in_executor(state.cpu, work)


def create_app(
    config: FrontendConfig,
    *,
    trace: RequestTrace | None = None,
    tokenizer: ChatTokenizer | None = None,
    metrics: FrontendMetrics | None = None,
    gate: Gate | None = None,
    upstream: Upstream | None = None,
) -> web.Application:
    """Build the app; the router session opens on startup and closes on cleanup. With a
    ``gate`` (auth on), every API route needs a key and runs within its tenant's limits, and
    answers ``Expect: 100-continue`` only once the key checks out."""
    state = FrontendState(
        config=config,
        router=upstream or RouterClient(config.router_url, timeout=config.upstream_timeout),
        metrics=metrics or FrontendMetrics(),
        trace=trace,
        tokenizer=tokenizer,
        resumer=Resumer(config.remembered_conversations),
    )
    Walks.capacity = config.remembered_conversations  # the walks are per process, as is the app
    state.metrics.watch_memory(state.resumer)
    app = web.Application(
        client_max_size=config.max_body_bytes, middlewares=[error_middleware, framing_middleware]
    )
    app[STATE] = state
    app[PARSER_REFUSALS] = ParserRefusals(respond=malformed_head, registry=state.metrics.registry)
    app.cleanup_ctx.append(_router_session)
    expect = None  # aiohttp's own: 100 Continue
    if gate is not None:
        gate.install(
            app,
            registry=state.metrics.registry,
            respond=error_response,
            provider_for=provider_for,
            trace=trace,
        )
        expect = gate.expect_handler(respond=error_response, provider_for=provider_for)
    app.add_routes(
        [
            web.post("/v1/chat/completions", _endpoint(CHAT), expect_handler=expect),
            web.post("/v1/responses", _endpoint(RESPONSES), expect_handler=expect),
            web.post("/v1/messages", _endpoint(MESSAGES), expect_handler=expect),
            web.post("/v1/messages/count_tokens", count_tokens, expect_handler=expect),
            web.get("/v1/models", models, expect_handler=expect),
            web.post(compact.PATH, responses_compact, expect_handler=expect),
        ]
    )
    add_probes(app, ready=lambda: readiness(state))
    add_metrics(app, state.metrics.registry)
    return app


async def _router_session(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    await state.router.start()
    yield
    await state.router.close()
    state.cpu.shutdown(wait=False, cancel_futures=True)
    if state.trace is not None:
        state.trace.close()


def provider_for(path: str) -> Provider:
    return Provider.ANTHROPIC if path.startswith("/v1/messages") else Provider.OPENAI


def malformed_head(path: str | None, exc: HttpProcessingError) -> web.StreamResponse:
    """The answer to a request aiohttp's parser refused: the provider's 400, OpenAI's shape when
    the request line did not say which API it was for."""
    provider = Provider.OPENAI if path is None else provider_for(path)
    if isinstance(exc, ContentEncodingError):  # one the server cannot decode (``br``, ``zstd``)
        return error_response(errors.invalid_content_encoding(), provider)
    return error_response(errors.malformed_head(), provider)


def error_response(
    err: FrontendError, provider: Provider, *, request_id: str | None = None
) -> web.Response:
    """The provider's error body; deterministic failures tell the SDKs not to retry."""
    headers = {REQUEST_ID_HEADER: request_id} if request_id else {}
    if not err.retryable:
        headers[SHOULD_RETRY_HEADER] = "false"
    if err.retry_after is not None:
        headers["retry-after"] = str(err.retry_after)
    response = web.json_response(error_body(err, provider), status=err.status, headers=headers)
    if err.status == 408:
        response.force_close()  # the rest of the stalled body may still be on its way
    return response


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def framing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The body framings aiohttp's parser lets through that a proxy in front may frame otherwise
    (a smuggling shape), refused as the parser's own refusals are: ``Transfer-Encoding`` other
    than ``chunked`` alone (``gzip, chunked``: a transfer coding aiohttp would not decode), or on
    HTTP/1.0 (RFC 9112 6.1: framing to be treated as faulty). The rest (``Content-Length`` with
    ``Transfer-Encoding``, two lengths, a length that is not digits, a chunk size that is not
    hex) never gets past the parser."""
    codings = request.headers.getall(hdrs.TRANSFER_ENCODING, [])
    if not codings or (
        request.version >= HttpVersion11 and ",".join(codings).strip().lower() == "chunked"
    ):
        return await handler(request)
    request.app[PARSER_REFUSALS].note(
        TransferEncodingError("transfer-encoding other than chunked"), peer=request.remote
    )
    response = error_response(errors.unreadable_body(), provider_for(request.path))
    response.force_close()  # where this body ends is what is in doubt
    return response


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Routing errors in the provider's shape; anything unexpected a generic 500, logged here."""
    provider = provider_for(request.path)
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if exc.status == 404:
            err = errors.not_found(request.path)
        elif exc.status == 405:
            err = errors.method_not_allowed(request.method, request.path)
        elif exc.status == 413:
            err = errors.body_too_large(request.app[STATE].config.max_body_bytes)
        else:
            err = FrontendError(status=exc.status, code="http_error", message=exc.reason)
        return error_response(err, provider)
    except asyncio.CancelledError:
        raise  # the client went away (handler cancellation): nothing to answer
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(errors.internal_error(), provider)


def _endpoint(api: GenerateEndpoint) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await generate(request, api)

    return handle


@dataclass
class _Outcome:
    """What the trace and the request counter record once the request is finished."""

    outcome: str = "ok"
    status: int = 200
    error_code: str | None = None
    kv_hints: dict[str, Any] | None = None
    model: str | None = None
    stream: bool = False
    normalized: list[str] = field(default_factory=list)
    """Client normalisations applied (``billing_header``), for the trace."""
    ignored: tuple[str, ...] = ()
    """Fields accepted and not acted on (``compat``), for the trace."""


async def generate(request: web.Request, api: GenerateEndpoint) -> web.StreamResponse:
    state = request.app[STATE]
    request_id = uuid.uuid4().hex
    done = _Outcome()
    try:
        return await _generate(request, api, state=state, request_id=request_id, done=done)
    except asyncio.CancelledError:
        # aiohttp cancels the handler when the client disconnects; leaving the router's
        # ``async with`` closes that connection, and the router aborts the generation.
        done.outcome, done.status, done.error_code = (
            "client_disconnected",
            CLIENT_CLOSED_STATUS,
            None,
        )
        raise
    finally:
        state.metrics.requests_of(api.endpoint, done.outcome).inc()
        if state.trace is not None:
            extra: dict[str, Any] = {"endpoint": api.endpoint, "status": done.status}
            extra.update(model=done.model, stream=done.stream)
            if done.error_code is not None:
                extra["error_code"] = done.error_code
            if done.normalized:
                extra["normalized"] = done.normalized
            if done.ignored:
                extra["ignored_fields"] = list(done.ignored)
            tenant = tenant_of(request)
            if tenant is not None:
                extra["tenant"] = tenant
            state.trace.record(
                request_id=request_id, outcome=done.outcome, kv_hints=done.kv_hints, **extra
            )


async def _generate(
    request: web.Request,
    api: GenerateEndpoint,
    *,
    state: FrontendState,
    request_id: str,
    done: _Outcome,
) -> web.StreamResponse:
    try:
        admitted = await admit(request, api, state=state)
    except FrontendError as err:
        state.metrics.rejections.labels(api.endpoint, err.reason).inc()
        done.outcome, done.status, done.error_code = "rejected", err.status, err.code
        return error_response(err, api.provider, request_id=request_id)
    parsed, session_id = admitted.parsed, admitted.session_id
    state.metrics.count_ignored(api.endpoint, parsed.ignored)
    done.ignored = parsed.ignored

    parsed = normalize_clients(parsed, state=state, endpoint=api.endpoint, done=done)
    parsed, ttl = hint_policy(parsed, config=state.config)
    done.model, done.stream = parsed.model, parsed.stream
    wire = parsed.envelope.to_wire() if parsed.envelope is not None else None
    if ttl is not None:
        state.metrics.hints.labels(api.endpoint, str(ttl)).inc()
    done.kv_hints = wire
    prepare = partial(
        build_preprocessed,
        parsed,
        request_id=request_id,
        session_id=session_id,
        tokenizer=state.tokenizer,
        model=state.config.served_name(parsed.model),
        kv_hints=wire,
    )
    # with --tokenizer this renders and tokenizes the whole conversation
    upstream_request = await off_loop(state, admitted.size if state.tokenizer else 0, prepare)
    upstream_request_headers = router_headers(
        parsed, session_id, config=state.config, tenant=tenant_of(request)
    )
    upstream_request_headers.update(tenant_headers(request))
    try:
        return await _forward(
            request,
            api,
            parsed,
            upstream_request,
            state=state,
            done=done,
            headers=upstream_request_headers,
        )
    except FrontendError as err:  # before anything was sent to the client
        done.outcome, done.status, done.error_code = "error", err.status, err.code
        return error_response(err, api.provider, request_id=request_id)


@dataclass(frozen=True)
class Admitted:
    """A request that passed every check: parsed, its session key, and its size on the wire."""

    parsed: ParsedRequest
    session_id: str | None
    size: int


async def admit(request: web.Request, api: Endpoint, *, state: FrontendState) -> Admitted:
    """Read, parse and check a request before anything is forwarded; raises ``FrontendError``."""
    raw = await read_body(
        request, limit=state.config.max_body_bytes, stall_s=state.config.body_timeout
    )
    resumer = state.resumer.scoped(tenant_of(request))  # never another tenant's parses

    def decode() -> dict[str, Any]:
        body = decode_json_body(raw, resumer=resumer)
        try:
            check_model_first(body, config=state.config)
        except ClientError as exc:
            raise errors.from_client_error(exc) from None
        return body

    def parse(body: dict[str, Any]) -> ParsedRequest:
        try:
            hints = api.provider in state.config.hint_providers
            breakpoints = state.config.breakpoints
            parsed = api.parse(body, hints=hints, breakpoints=breakpoints, resumer=resumer)
        except ClientError as exc:
            raise errors.from_client_error(exc) from None
        check_model(parsed.model, config=state.config)
        resumer.parsed(raw)
        return parsed

    # What repeats a body parsed lately is taken, not decoded (~0.3 ms for 200 KB): right here.
    known = len(raw) < OFF_LOOP_BYTES or resumer.resumes(raw)
    body = decode() if known else await off_loop(state, len(raw), decode)
    # The parse follows the new items' bytes: a conversation's next turn resumes right here; a
    # new one that opens like others (an agent's own instructions) goes to the parse thread.
    parsed = await off_loop(state, resumer.fresh_bytes(len(raw)), lambda: parse(body))
    return Admitted(parsed, session_of(request, body, keys=state.config.session_keys), len(raw))


async def _forward(
    request: web.Request,
    api: GenerateEndpoint,
    parsed: ParsedRequest,
    upstream_request: PreprocessedRequest,
    *,
    state: FrontendState,
    done: _Outcome,
    headers: Mapping[str, str] | None = None,
) -> web.StreamResponse:
    request_id = upstream_request.request_id
    latency = state.metrics.latency_of
    started = time.perf_counter()
    async with state.router.generate(
        upstream_request, hint_param=parsed.hint_param, headers=headers
    ) as chunks:
        first = await anext(chunks)
        latency(api.endpoint, "first_chunk").observe(time.perf_counter() - started)
        if not parsed.stream:
            result = Completion()
            result.add(first)
            async for chunk in chunks:
                result.add(chunk)
            latency(api.endpoint, "total").observe(time.perf_counter() - started)
            payload = api.response(parsed, result, request_id=request_id)
            return web.json_response(payload, headers={REQUEST_ID_HEADER: request_id})

        response = web.StreamResponse(
            headers={
                "content-type": "text/event-stream",
                "cache-control": "no-cache",
                REQUEST_ID_HEADER: request_id,
            }
        )
        await response.prepare(request)
        formatter = api.formatter(parsed, request_id=request_id)
        try:
            await response.write(formatter.start() + formatter.chunk(first))
            async for chunk in chunks:
                frame = formatter.chunk(chunk)
                if frame:
                    await response.write(frame)
            # the last frame and the end of the chunked body in one socket write
            await response.write_eof(formatter.finish())
            latency(api.endpoint, "total").observe(time.perf_counter() - started)
            return response
        except ConnectionResetError:
            done.outcome, done.status, done.error_code = (
                "client_disconnected",
                CLIENT_CLOSED_STATUS,
                None,
            )
            return response
        except FrontendError as err:
            done.outcome, done.error_code = "error", err.code
            tail = formatter.error(err)
        except Exception:
            log.exception("stream %s failed after it started", request_id)
            internal = errors.internal_error()
            done.outcome, done.error_code = "error", internal.code
            tail = formatter.error(internal)
        await _write_eof_quietly(response, tail)
        return response


async def _write_eof_quietly(response: web.StreamResponse, data: bytes = b"") -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof(data)


def normalize_clients(
    parsed: ParsedRequest, *, state: FrontendState, endpoint: str, done: _Outcome | None = None
) -> ParsedRequest:
    """Client quirks that would defeat prefix caching, removed before templating (counted)."""
    if not state.config.normalize_clients:
        return parsed
    messages, dropped = drop_billing_header(parsed.messages)
    if not dropped:
        return parsed
    state.metrics.normalized.labels(endpoint, "billing_header").inc()
    if done is not None:
        done.normalized.append("billing_header")
    return dataclasses.replace(parsed, messages=messages)


# -- plain endpoints ---------------------------------------------------------------------------


async def count_tokens(request: web.Request) -> web.Response:
    """``POST /v1/messages/count_tokens``: the worker renders the prompt with the model's template
    and tokenizer and answers its length; nothing is generated."""
    state = request.app[STATE]
    api = COUNT_TOKENS
    request_id = uuid.uuid4().hex
    outcome = "ok"
    try:
        admitted = await admit(request, api, state=state)
    except FrontendError as err:
        state.metrics.rejections.labels(api.endpoint, err.reason).inc()
        state.metrics.requests_of(api.endpoint, "rejected").inc()
        return error_response(err, api.provider, request_id=request_id)
    parsed, session_id = admitted.parsed, admitted.session_id
    state.metrics.count_ignored(api.endpoint, parsed.ignored)
    parsed = normalize_clients(parsed, state=state, endpoint=api.endpoint)
    upstream_request = build_preprocessed(
        parsed,
        request_id=request_id,
        session_id=session_id,
        tokenizer=None,
        model=state.config.served_name(parsed.model),
        count_only=True,
    )
    upstream_request.sampling = SamplingParams(max_new_tokens=0)
    try:
        usage = await _count(state, upstream_request, headers=tenant_headers(request))
    except FrontendError as err:
        outcome = "error"
        return error_response(err, api.provider, request_id=request_id)
    except asyncio.CancelledError:
        outcome = "client_disconnected"
        raise
    finally:
        state.metrics.requests_of(api.endpoint, outcome).inc()
    return web.json_response(count_tokens_response(usage), headers={REQUEST_ID_HEADER: request_id})


async def _count(
    state: FrontendState,
    upstream_request: PreprocessedRequest,
    *,
    headers: Mapping[str, str] | None = None,
) -> Usage:
    """The first usage the worker reports for a ``count_only`` request."""
    async with state.router.generate(upstream_request, hint_param=None, headers=headers) as chunks:
        async for chunk in chunks:
            usage = chunk.usage or chunk.prompt_usage
            if usage is not None:
                return usage
    log.warning("count %s: the worker answered without usage", upstream_request.request_id)
    raise FrontendError(
        status=502, code="bad_gateway", message="The worker did not report a token count."
    )


async def models(request: web.Request) -> web.Response:
    """The served names and exact aliases in the shape the client reads (``discovery``): Codex's
    catalog when the query has ``client_version`` (with the input the workers' model reads),
    Anthropic's page when the request has an ``anthropic-version`` header, else OpenAI's list."""
    state = request.app[STATE]
    config = state.config
    listed = discovery.build_listed(config.served_models, config.model_aliases)
    if discovery.CODEX_QUERY in request.query:
        if config.codex_instructions is None:
            return error_response(discovery.codex_catalog_not_configured(), Provider.OPENAI)
        fleet = discovery.fleet_model(await state.router.worker_reports())
        catalog = discovery.build_codex_catalog(
            listed, instructions=config.codex_instructions, fleet=fleet
        )
        return web.json_response(catalog)
    if discovery.ANTHROPIC_HEADER in request.headers:
        try:
            page = discovery.parse_anthropic_page(request.query)
        except FrontendError as err:
            return error_response(err, Provider.ANTHROPIC)
        return web.json_response(discovery.build_anthropic_page(listed, page))
    return web.json_response(discovery.build_openai_list(listed))


async def responses_compact(request: web.Request) -> web.Response:
    """``POST /v1/responses/compact`` (Codex's opt-in remote compaction): refused, see
    :func:`compact.compaction_unsupported`."""
    state = request.app[STATE]
    err = compact.compaction_unsupported()
    state.metrics.rejections.labels(compact.ENDPOINT, err.reason).inc()
    state.metrics.requests_of(compact.ENDPOINT, "rejected").inc()
    return error_response(err, Provider.OPENAI, request_id=uuid.uuid4().hex)


async def readiness(state: FrontendState) -> Readiness:
    """Ready while the router reports a ready worker; the details (addresses) go to the log.

    A router that is only slow to answer (the node is busy prefilling) keeps the last verdict:
    taking the frontend out of its Service for that turns a slow answer into clients' connection
    refused. Only the router's own "no ready worker" or a refused connection changes it."""
    reason = await state.router.ready()
    if reason == ROUTER_SLOW and state.last_ready is not None:
        return state.last_ready
    if reason is None:
        state.last_ready = Readiness(ready=True, body={"status": "ready"})
    else:
        state.last_ready = Readiness(ready=False, body={"status": "not_ready", "reason": reason})
    return state.last_ready
