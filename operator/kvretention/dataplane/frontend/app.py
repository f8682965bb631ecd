"""The frontend's aiohttp application: routes, the request flow, and the catch-all error layer.

Flow per generate request: read the body (bounded) -> parse JSON -> normalize cache controls and
check the schema -> check the model -> only then contact the router. A refused request gets the
provider's JSON error (also when it asked to stream); a failure after SSE began gets the provider's
SSE error event. Tracebacks are logged, never sent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final

from aiohttp import web

from kvretention.dataplane.frontend import errors
from kvretention.dataplane.frontend.anthropic_api import MessagesApi
from kvretention.dataplane.frontend.common import Api, Completion, ParsedRequest
from kvretention.dataplane.frontend.errors import FrontendError, Provider, error_body
from kvretention.dataplane.frontend.metrics import CONTENT_TYPE, FrontendMetrics
from kvretention.dataplane.frontend.openai_api import ChatApi, ResponsesApi
from kvretention.dataplane.frontend.tokenizer import ChatTokenizer
from kvretention.dataplane.frontend.upstream import RouterClient
from kvretention.dataplane.protocol import HEADER_SESSION, PreprocessedRequest
from kvretention.dataplane.trace import RequestTrace
from kvretention.hints.errors import ClientError

log = logging.getLogger("kvretention.frontend")

DEFAULT_MAX_BODY_BYTES: Final = 8 * 1024 * 1024
DEFAULT_UPSTREAM_TIMEOUT: Final = 300.0
REQUEST_ID_HEADER: Final = "x-request-id"


@dataclass(frozen=True)
class FrontendConfig:
    router_url: str
    served_models: tuple[str, ...] = ()
    """Model names clients may ask for; empty accepts any name."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    upstream_timeout: float = DEFAULT_UPSTREAM_TIMEOUT
    hint_providers: frozenset[Provider] = frozenset(Provider)
    """Providers whose cache controls become KV hints; others' are accepted and ignored."""


@dataclass
class FrontendState:
    config: FrontendConfig
    router: RouterClient
    metrics: FrontendMetrics = field(default_factory=FrontendMetrics)
    trace: RequestTrace | None = None
    tokenizer: ChatTokenizer | None = None


STATE: Final = web.AppKey("kvretention_frontend", FrontendState)


def create_app(
    config: FrontendConfig,
    *,
    trace: RequestTrace | None = None,
    tokenizer: ChatTokenizer | None = None,
    metrics: FrontendMetrics | None = None,
) -> web.Application:
    """Build the app; the router session opens on startup and closes on cleanup."""
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
    app.router.add_post("/v1/chat/completions", _endpoint(ChatApi()))
    app.router.add_post("/v1/responses", _endpoint(ResponsesApi()))
    app.router.add_post("/v1/messages", _endpoint(MessagesApi()))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
    return app


async def _router_session(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    await state.router.start()
    yield
    await state.router.close()
    if state.trace is not None:
        state.trace.close()


def provider_for(path: str) -> Provider:
    return Provider.ANTHROPIC if path.startswith("/v1/messages") else Provider.OPENAI


def error_response(
    err: FrontendError, provider: Provider, *, request_id: str | None = None
) -> web.Response:
    headers = {REQUEST_ID_HEADER: request_id} if request_id else None
    return web.json_response(error_body(err, provider), status=err.status, headers=headers)


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
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(errors.internal_error(), provider)


def _endpoint(api: Api) -> Handler:
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


async def generate(request: web.Request, api: Api) -> web.StreamResponse:
    state = request.app[STATE]
    request_id = uuid.uuid4().hex
    done = _Outcome()
    try:
        return await _generate(request, api, state=state, request_id=request_id, done=done)
    finally:
        state.metrics.requests.labels(api.endpoint, done.outcome).inc()
        if state.trace is not None:
            extra: dict[str, Any] = {"endpoint": api.endpoint, "status": done.status}
            extra.update(model=done.model, stream=done.stream)
            if done.error_code is not None:
                extra["error_code"] = done.error_code
            state.trace.record(
                request_id=request_id, outcome=done.outcome, kv_hints=done.kv_hints, **extra
            )


async def _generate(
    request: web.Request, api: Api, *, state: FrontendState, request_id: str, done: _Outcome
) -> web.StreamResponse:
    try:
        body = await read_json_body(request, limit=state.config.max_body_bytes)
        parsed = api.parse(body, hints=api.provider in state.config.hint_providers)
        check_model(parsed.model, served=state.config.served_models)
        session_id = session_header(request)
    except (ClientError, FrontendError) as exc:
        err = errors.from_client_error(exc) if isinstance(exc, ClientError) else exc
        state.metrics.rejections.labels(api.endpoint, err.reason).inc()
        done.outcome, done.status, done.error_code = "rejected", err.status, err.code
        return error_response(err, api.provider, request_id=request_id)

    done.model, done.stream = parsed.model, parsed.stream
    wire = parsed.envelope.to_wire() if parsed.envelope is not None else None
    if parsed.envelope is not None and parsed.envelope.retain_full_prompt is not None:
        ttl = parsed.envelope.retain_full_prompt.ttl_seconds
        state.metrics.hints.labels(api.endpoint, str(ttl)).inc()
    done.kv_hints = wire
    upstream_request = build_preprocessed(
        parsed,
        request_id=request_id,
        session_id=session_id,
        tokenizer=state.tokenizer,
    )
    try:
        return await _forward(request, api, parsed, upstream_request, state=state, done=done)
    except FrontendError as err:  # before anything was sent to the client
        done.outcome, done.status, done.error_code = "error", err.status, err.code
        return error_response(err, api.provider, request_id=request_id)


def build_preprocessed(
    parsed: ParsedRequest,
    *,
    request_id: str,
    session_id: str | None,
    tokenizer: ChatTokenizer | None,
) -> PreprocessedRequest:
    """The router request: token ids when a tokenizer is configured, messages otherwise; same hint."""
    wire = parsed.envelope.to_wire() if parsed.envelope is not None else None
    request = PreprocessedRequest(
        request_id=request_id,
        model=parsed.model,
        messages=parsed.messages,
        tools=parsed.tools,
        tool_choice=parsed.tool_choice,
        parallel_tool_calls=parsed.parallel_tool_calls,
        response_format=parsed.response_format,
        reasoning=parsed.reasoning,
        sampling=parsed.sampling,
        session_id=session_id,
        kv_hints=wire,
    )
    if tokenizer is not None:
        # The conversation still travels: the worker needs the tools to parse the answer.
        request.token_ids = tokenizer.encode_chat(parsed.messages)
    return request


async def _forward(
    request: web.Request,
    api: Api,
    parsed: ParsedRequest,
    upstream_request: PreprocessedRequest,
    *,
    state: FrontendState,
    done: _Outcome,
) -> web.StreamResponse:
    request_id = upstream_request.request_id
    latency = state.metrics.upstream_latency
    started = time.perf_counter()
    async with state.router.generate(upstream_request, hint_param=parsed.hint_param) as chunks:
        first = await anext(chunks)
        latency.labels(api.endpoint, "first_chunk").observe(time.perf_counter() - started)
        if not parsed.stream:
            result = Completion()
            result.add(first)
            async for chunk in chunks:
                result.add(chunk)
            latency.labels(api.endpoint, "total").observe(time.perf_counter() - started)
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
            await response.write(formatter.finish())
            latency.labels(api.endpoint, "total").observe(time.perf_counter() - started)
        except ConnectionResetError:
            done.outcome, done.status, done.error_code = "client_disconnected", 499, None
            return response
        except FrontendError as err:
            done.outcome, done.error_code = "error", err.code
            await _write_quietly(response, formatter.error(err))
        except Exception:
            log.exception("stream %s failed after it started", request_id)
            internal = errors.internal_error()
            done.outcome, done.error_code = "error", internal.code
            await _write_quietly(response, formatter.error(internal))
        await _write_eof_quietly(response)
        return response


async def _write_quietly(response: web.StreamResponse, data: bytes) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write(data)


async def _write_eof_quietly(response: web.StreamResponse) -> None:
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()


async def read_json_body(request: web.Request, *, limit: int) -> dict[str, Any]:
    """The request body as a JSON object, or a ``FrontendError`` (413 before reading when possible)."""
    if request.content_length is not None and request.content_length > limit:
        raise errors.body_too_large(limit)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise errors.body_too_large(limit) from None
    try:
        text = raw.decode("utf-8-sig")  # strict: invalid UTF-8 and encoded surrogates are refused
    except UnicodeDecodeError:
        raise errors.invalid_json("the body is not valid UTF-8") from None
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.invalid_json(str(exc)) from None
    except RecursionError:
        raise errors.invalid_json("the body is nested too deeply") from None
    except ValueError:  # Python refuses integers of more than sys.get_int_max_str_digits() digits
        raise errors.invalid_json("a number in the body has too many digits") from None
    if _SURROGATE_ESCAPE.search(text) is not None and _has_lone_surrogate(body):
        # json.loads turns an unpaired "\ud800" escape into a str that cannot be encoded as UTF-8
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


def session_header(request: web.Request) -> str | None:
    """The sticky-session id; aiohttp keeps non-UTF-8 header bytes as surrogates, refused here."""
    value = request.headers.get(HEADER_SESSION)
    if value is not None and _SURROGATE.search(value) is not None:
        raise errors.invalid_header(HEADER_SESSION)
    return value


def check_model(model: str, *, served: tuple[str, ...]) -> None:
    if served and model not in served:
        raise errors.unknown_model(model, served=served)


# -- plain endpoints ---------------------------------------------------------------------------


async def models(request: web.Request) -> web.Response:
    """OpenAI's model list, or Anthropic's when the client sends ``anthropic-version``."""
    served = request.app[STATE].config.served_models
    if "anthropic-version" in request.headers:
        data = [
            {"type": "model", "id": m, "display_name": m, "created_at": "1970-01-01T00:00:00Z"}
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


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if await state.router.healthy():
        return web.json_response({"status": "ready", "router": state.config.router_url})
    return web.json_response(
        {"status": "not_ready", "reason": f"router {state.config.router_url} is unreachable"},
        status=503,
    )


async def metrics_view(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    return web.Response(body=body, headers={"content-type": CONTENT_TYPE})
