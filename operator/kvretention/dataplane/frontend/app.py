"""The frontend's aiohttp application: routes, the request flow, and the catch-all error layer.

Flow per generate request: read the body (bounded) -> parse JSON -> normalize cache controls and
check the schema -> check the model -> only then contact the router. A refused request gets the
provider's JSON error (also when it asked to stream); a failure after SSE began gets the provider's
SSE error event. Tracebacks are logged, never sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Final, TypeVar

import msgspec
from aiohttp import web

from kvretention.dataplane.breakpoints import Marker
from kvretention.dataplane.chat_template import TemplateInputError
from kvretention.dataplane.frontend import errors, model_names
from kvretention.dataplane.frontend.affinity import (
    drop_billing_header,
    header_safe,
    prefix_chain,
    session_key,
)
from kvretention.dataplane.frontend.anthropic_api import count_tokens_response
from kvretention.dataplane.frontend.auth import Gate, tenant_headers, tenant_of
from kvretention.dataplane.frontend.common import Completion, ParsedRequest
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
from kvretention.dataplane.frontend.repeats import conversation_markers
from kvretention.dataplane.frontend.resume import Resumer
from kvretention.dataplane.frontend.tokenizer import ChatTokenizer
from kvretention.dataplane.frontend.upstream import RouterClient
from kvretention.dataplane.http import Readiness, add_metrics, add_probes
from kvretention.dataplane.protocol import (
    DEFAULT_SESSION_KEYS,
    HEADER_PREFIX,
    HEADER_SESSION,
    PreprocessedRequest,
    SamplingParams,
    Usage,
)
from kvretention.dataplane.trace import RequestTrace
from kvretention.hints.envelope import DEFAULT_PRIORITY, KvHintEnvelope, KvPrefixRetention
from kvretention.hints.errors import ClientError
from kvretention.hints.intent import BreakpointMode, CacheHints, build_envelope

log = logging.getLogger("kvretention.frontend")

DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
DEFAULT_UPSTREAM_TIMEOUT: Final = 300.0
DEFAULT_BODY_TIMEOUT: Final = 30.0
REQUEST_ID_HEADER: Final = "x-request-id"
SHOULD_RETRY_HEADER: Final = "x-should-retry"


@dataclass(frozen=True)
class FrontendConfig:
    router_url: str
    served_models: tuple[str, ...] = ()
    """Model names clients may ask for; empty accepts any name."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT
    hint_providers: frozenset[Provider] = frozenset(Provider)
    """Providers whose cache controls become KV hints; others' are accepted and ignored."""
    model_aliases: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    """Client-facing name -> served name (Claude Code's small-fast model, Codex's model names).
    The router gets the served name; answers echo the name the client asked for."""
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    """Seconds a request body may take to arrive (408 after)."""
    session_keys: tuple[str, ...] = DEFAULT_SESSION_KEYS
    """Where a request's session is found, in order (headers, or ``metadata.<field>``)."""
    prefix_routing: bool = True
    """Send the router the prompt's prefix-hash chain (its cache-aware placement reads it)."""
    normalize_clients: bool = True
    """Drop Claude Code's per-request billing-header system block before templating."""
    breakpoints: BreakpointMode = "prefix"
    """Block-level breakpoints: prefix retention, or the v1 400."""
    hint_priority: int = DEFAULT_PRIORITY
    default_ttl_seconds: int | None = None
    """Fleet policy for requests with no cache control (off when ``None``)."""

    def served_name(self, model: str) -> str:
        served = model_names.resolve(model, served=self.served_models, aliases=self.model_aliases)
        return served or model

    def listed_models(self) -> tuple[str, ...]:
        """Served names, then exact aliases: names a client may pick (a pattern is not one)."""
        return model_names.listed(self.served_models, self.model_aliases)


@dataclass
class FrontendState:
    config: FrontendConfig
    router: RouterClient
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
) -> web.Application:
    """Build the app; the router session opens on startup and closes on cleanup. With a
    ``gate`` (auth on), every API route needs a key and runs within its tenant's limits."""
    state = FrontendState(
        config=config,
        router=RouterClient(config.router_url, timeout=config.upstream_timeout),
        metrics=metrics or FrontendMetrics(),
        trace=trace,
        tokenizer=tokenizer,
    )
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[error_middleware])
    app[STATE] = state
    app.cleanup_ctx.append(_router_session)
    if gate is not None:
        gate.install(
            app,
            registry=state.metrics.registry,
            respond=error_response,
            provider_for=provider_for,
            trace=trace,
        )
    app.router.add_post("/v1/chat/completions", _endpoint(CHAT))
    app.router.add_post("/v1/responses", _endpoint(RESPONSES))
    app.router.add_post("/v1/messages", _endpoint(MESSAGES))
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/v1/models", models)
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
        done.outcome, done.status, done.error_code = "client_disconnected", 499, None
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
    )
    # with --tokenizer this renders and tokenizes the whole conversation
    upstream_request = await off_loop(state, admitted.size if state.tokenizer else 0, prepare)
    upstream_request_headers = router_headers(parsed, session_id, config=state.config)
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

    def check() -> tuple[ParsedRequest, dict[str, Any]]:
        try:
            body = decode_json_body(raw, resumer=state.resumer, scope=tenant_of(request))
            check_model_first(body, config=state.config)
            parsed = api.parse(
                body,
                hints=api.provider in state.config.hint_providers,
                breakpoints=state.config.breakpoints,
                resumer=state.resumer,
            )
        except ClientError as exc:
            raise errors.from_client_error(exc) from None
        check_model(parsed.model, config=state.config)
        state.resumer.parsed(raw)
        return parsed, body

    # a conversation's next body resumes its last parse (~1 ms for 200 KB): cheaper right here
    # than the hand-off to the parse thread
    size = 0 if state.resumer.resumes(raw) else len(raw)
    parsed, body = await off_loop(state, size, check)
    return Admitted(parsed, session_of(request, body, keys=state.config.session_keys), len(raw))


def build_preprocessed(
    parsed: ParsedRequest,
    *,
    request_id: str,
    session_id: str | None,
    tokenizer: ChatTokenizer | None,
    model: str | None = None,
    count_only: bool = False,
) -> PreprocessedRequest:
    """The router request: token ids when a tokenizer can render it, messages always; same hint.

    ``model`` is the served name when the client used an alias.
    """
    wire = parsed.envelope.to_wire() if parsed.envelope is not None else None
    request = PreprocessedRequest(
        request_id=request_id,
        model=model or parsed.model,
        messages=parsed.messages,
        tools=parsed.tools,
        deferred_tools=parsed.deferred_tools,
        tool_choice=parsed.tool_choice,
        parallel_tool_calls=parsed.parallel_tool_calls,
        response_format=parsed.response_format,
        reasoning=parsed.reasoning,
        sampling=parsed.sampling,
        session_id=session_id,
        count_only=count_only,
        kv_hints=wire,
    )
    if tokenizer is not None and (parsed.envelope is None or not parsed.envelope.prefix_count):
        # Breakpoints are resolved against the worker's own rendering, so those travel as
        # messages only. The conversation still travels: the worker needs the tools to parse the answer.
        # Same rendering as the worker (tools, tool choice, thinking switches); None for images.
        # A conversation the template refuses travels as messages: the worker answers its 400.
        with contextlib.suppress(TemplateInputError):
            request.token_ids = tokenizer.encode_request(request)
    return request


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
            done.outcome, done.status, done.error_code = "client_disconnected", 499, None
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


async def read_body(
    request: web.Request, *, limit: int, stall_s: float = DEFAULT_BODY_TIMEOUT
) -> bytes:
    """The body's bytes, or a ``FrontendError`` (413 before reading when possible, 408 when the
    body stalls past ``stall_s`` seconds)."""
    if request.content_length is not None and request.content_length > limit:
        raise errors.body_too_large(limit)
    try:
        async with asyncio.timeout(stall_s):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise errors.body_too_large(limit) from None
    except TimeoutError:
        log.info("request body on %s stalled past %gs", request.path, stall_s)
        raise errors.body_timeout(stall_s) from None
    return raw


def decode_json_body(
    raw: bytes, *, resumer: Resumer | None = None, scope: str | None = None
) -> dict[str, Any]:
    """The bytes as a JSON object (strict UTF-8, no lone surrogates), or a 400 ``FrontendError``.

    With ``resumer``, a large body's message items that its conversation's last body holds
    byte for byte are that body's decoded values (``Resumer.decode``; the same values), and so
    are its tools when an earlier body of the same ``scope`` (the tenant) held their bytes."""
    try:
        text = raw.decode("utf-8-sig")  # strict: invalid UTF-8 and encoded surrogates are refused
    except UnicodeDecodeError:
        raise errors.invalid_json("the body is not valid UTF-8") from None
    try:
        body = (
            resumer.decode(text, scope=scope)
            if resumer is not None and len(raw) >= ITEMWISE_BYTES
            else None
        )
        by_json = False
        if body is None:
            body, by_json = _loads(text)
    except json.JSONDecodeError as exc:
        raise errors.invalid_json(str(exc)) from None
    except RecursionError:
        raise errors.invalid_json("the body is nested too deeply") from None
    except ValueError:  # Python refuses integers of more than sys.get_int_max_str_digits() digits
        raise errors.invalid_json("a number in the body has too many digits") from None
    if by_json and _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(body):
        # json.loads turns an unpaired "\ud800" escape into a str that cannot be encoded as UTF-8
        # (msgspec refuses one: what it decoded needs no scan, ~60 µs per 200 KB)
        raise errors.invalid_json(
            "a string holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)"
        )
    if not isinstance(body, dict):
        raise FrontendError(
            status=400,
            code="invalid_type",
            message="The request body must be a JSON object.",
        )
    return body


_DECODE: Final = msgspec.json.Decoder().decode
ITEMWISE_BYTES: Final = 16 * 1024
"""Bodies from this size are decoded item by item against their conversation's last body;
smaller ones cost less decoded whole than looked up."""


def _loads(text: str) -> tuple[Any, bool]:
    """``json.loads(text)`` in half the CPU (~0.6 ms for a 200 KB agent body instead of ~1.2),
    and whether ``json`` decoded it: msgspec gives the same values wherever it accepts the text;
    what it refuses (``NaN``, ``1e400``, a lone surrogate escape, a number of 5,000 digits,
    invalid JSON) ``json`` decides, with its own values and errors."""
    try:
        return _DECODE(text), False
    except (msgspec.DecodeError, RecursionError):
        return json.loads(text), True


_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _has_lone_surrogate(value: object) -> bool:
    """Whether any key or string in a parsed body holds a lone surrogate (iterative: no recursion)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item) is not None:
                return True
        elif isinstance(item, dict):
            stack.extend(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def session_of(request: web.Request, body: Mapping[str, Any], *, keys: Sequence[str]) -> str | None:
    """The sticky-session key from the configured sources; aiohttp keeps non-UTF-8 header bytes
    as surrogates, refused here."""
    for key in keys:
        value = request.headers.get(key)
        if value is not None and _SURROGATE.search(value) is not None:
            raise errors.invalid_header(key)
    return session_key(keys, headers=request.headers, body=body)


def router_headers(
    parsed: ParsedRequest, session_id: str | None, *, config: FrontendConfig
) -> dict[str, str]:
    """Placement data for the router, in headers so it never parses the body: the session key
    and, for cache-aware placement, the prompt's prefix-hash chain."""
    headers: dict[str, str] = {}
    if session_id is not None:
        headers[HEADER_SESSION] = header_safe(session_id)
    if config.prefix_routing:
        headers[HEADER_PREFIX] = ",".join(prefix_chain(parsed.messages, parsed.tools))
    return headers


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


def apply_hint_policy(parsed: ParsedRequest, *, config: FrontendConfig) -> ParsedRequest:
    """The envelope the router gets: the breakpoint count the conversation really carries (a
    normalisation may have dropped a marked block), the fleet's priority, and its default TTL
    for a request that sent no cache control."""
    return hint_policy(parsed, config=config)[0]


def hint_policy(
    parsed: ParsedRequest, *, config: FrontendConfig
) -> tuple[ParsedRequest, int | None]:
    """:func:`apply_hint_policy` and the result's :func:`longest_ttl`, finding the conversation's
    markers once (a walk of every block of a 200 KB agent body)."""
    envelope = parsed.envelope
    markers: list[Marker] | None = None
    if envelope is not None and envelope.prefix_count:
        markers = conversation_markers(parsed.messages, parsed.tools)
        envelope = with_prefix_count(envelope, len(markers))
    hints = CacheHints(envelope=envelope, client_controls=parsed.client_controls)
    final = build_envelope(
        hints, priority=config.hint_priority, default_ttl_seconds=config.default_ttl_seconds
    )
    if final is not parsed.envelope:
        parsed = dataclasses.replace(parsed, envelope=final)
    return parsed, longest_ttl(parsed, markers=markers)


def with_prefix_count(envelope: KvHintEnvelope | None, count: int) -> KvHintEnvelope | None:
    """``envelope`` announcing ``count`` breakpoints (``None`` when nothing is left to retain)."""
    if envelope is None or envelope.prefix_count == count:
        return envelope
    prefixes = KvPrefixRetention(breakpoints=count) if count else None
    updated = envelope.model_copy(update={"retain_prefixes": prefixes})
    return None if updated.is_empty() else updated


def longest_ttl(parsed: ParsedRequest, *, markers: Sequence[Marker] | None = None) -> int | None:
    """The longest TTL the request's envelope retains anything for (the hints metric's label);
    ``markers`` are the conversation's, when the caller found them already."""
    envelope = parsed.envelope
    if envelope is None:
        return None
    ttls = []
    if envelope.prefix_count:
        if markers is None:
            markers = conversation_markers(parsed.messages, parsed.tools)
        ttls = [m.ttl_seconds for m in markers]
    if envelope.retain_full_prompt is not None:
        ttls.append(envelope.retain_full_prompt.ttl_seconds)
    return max(ttls, default=None)


def check_model(model: str, *, config: FrontendConfig) -> None:
    """A served name, an alias or a name an alias pattern matches; with no served names
    configured, any name."""
    if not config.served_models:
        return
    aliases = config.model_aliases
    if model_names.resolve(model, served=config.served_models, aliases=aliases) is None:
        raise errors.unknown_model(model, served=(*config.served_models, *aliases))


def check_model_first(body: Any, *, config: FrontendConfig) -> None:
    """The model before the body's fields: a name nothing serves is the one 404, not the last
    answer after a 400 per field a client retries without (Claude Code drops one per retry)."""
    model = body.get("model") if isinstance(body, dict) else None
    if isinstance(model, str):
        check_model(model, config=config)


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
    """OpenAI's model list, or Anthropic's when the client sends ``anthropic-version``.

    Aliases are listed too: each is a name clients may send."""
    served = request.app[STATE].config.listed_models()
    if "anthropic-version" in request.headers:
        data = [
            {
                "type": "model",
                "id": m,
                "display_name": m,
                "created_at": "1970-01-01T00:00:00Z",
            }
            for m in served
        ]
        first = served[0] if served else None
        last = served[-1] if served else None
        return web.json_response(
            {"data": data, "has_more": False, "first_id": first, "last_id": last}
        )
    listed: list[dict[str, Any]] = [
        {"id": m, "object": "model", "created": 0, "owned_by": "kvretention"} for m in served
    ]
    return web.json_response({"object": "list", "data": listed})


async def readiness(state: FrontendState) -> Readiness:
    """Ready while the router reports a ready worker; the details (addresses) go to the log."""
    reason = await state.router.ready()
    if reason is None:
        return Readiness(ready=True, body={"status": "ready"})
    return Readiness(ready=False, body={"status": "not_ready", "reason": reason})
