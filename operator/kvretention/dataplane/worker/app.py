"""The worker's HTTP app: ``POST /v1/generate`` in, NDJSON ``GenerateChunk`` lines out.

Every check that can fail runs before the engine is called, so a rejected request never reaches
SGLang: malformed JSON or envelope -> 400 ``invalid_request``; a hint for an engine without
``kv_hints`` -> 501 ``kv_hints_unsupported`` naming ``kv_hints``. After the stream has started a
failure becomes one final ``{"error": ...}`` line. A client that goes away aborts the engine request.

The prompt is rendered with the model's chat template (tools included) and tokenized once; the
answer is parsed into text, reasoning and tool-call deltas by SGLang's own parsers (see
:mod:`kvretention.dataplane.worker.parsing`). A ``count_only`` request is rendered and counted and
answered with one chunk; the engine is never called.

Rendering and tokenizing a coding agent's ~200 KB prompt takes tens of milliseconds, so it runs on
one thread of its own (one: a Hugging Face fast tokenizer must not be called from two threads at
once), never on the event loop: streams in flight and ``/readyz`` keep answering while a burst of
long prompts is prepared, and the router does not eject a busy worker as dead. An agent's next
prompt extends its last one, so only what is new is tokenized: the worker keeps each
conversation's previous prompt tokens (:mod:`kvretention.dataplane.worker.render_cache`, bounded
by ``render_cache_bytes``) and reuses them where the new rendering proves them equal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, cast, get_args

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from kvretention.api.names import Role
from kvretention.dataplane.breakpoints import MarkerMismatch, Resolution
from kvretention.dataplane.chat_template import TemplateInputError
from kvretention.dataplane.http import Readiness, add_metrics, add_probes
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
    GenerateChunk,
    PreprocessedRequest,
    Usage,
)
from kvretention.dataplane.router.placement import parse_prefix_header
from kvretention.dataplane.tenancy import (
    CACHE_SALT_PARAM,
    TenantIsolationUnavailable,
    engine_kwargs,
    scoped_chain,
    scoped_session,
    tenant_of_headers,
    tenant_of_salt,
)
from kvretention.dataplane.trace import RequestTrace
from kvretention.dataplane.worker.call import (
    Bootstrap,
    StreamAdapter,
    build_engine_prompt,
    build_generate_kwargs,
    resolve_prompt_breakpoints,
)
from kvretention.dataplane.worker.dialect import (
    Dialect,
    PrefixHintUnsupported,
    build_kv_hints,
    require_support,
    retained_tokens,
)
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.parsing import (
    ConstraintConflict,
    OutputParser,
    OutputPlan,
    ParserConfigError,
    constrained_sampling,
    plan_output,
)
from kvretention.dataplane.worker.render_cache import DEFAULT_MAX_BYTES, RenderCache
from kvretention.dataplane.worker.wire import (
    ConversationMemo,
    RequestRejected,
    decode_reusing,
    decode_whole,
)
from kvretention.hints.envelope import WIRE_KEY

log = logging.getLogger(__name__)

INFO_PATH: Final = "/v1/info"
ROLES: Final[tuple[str, ...]] = get_args(Role)


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.requests = Counter(
            "kvretention_worker_requests",
            "Finished generate requests by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.kv_hints = Counter(
            "kvretention_worker_kv_hints_passed",
            "Requests whose hint was passed to the engine, by dialect.",
            ["dialect"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "kvretention_worker_inflight", "Generate requests in flight.", registry=self.registry
        )
        self.prompt_tokens = Counter(
            "kvretention_worker_prompt_tokens",
            "Prompt tokens of rendered requests: reused from the conversation's previous prompt, "
            "or tokenized.",
            ["how"],
            registry=self.registry,
        )


@dataclass
class WorkerState:
    """Everything the handlers share; lives on the app, not in module globals."""

    engine: LoadedEngine
    role: Role
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    trace: RequestTrace | None = None
    draining: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    metrics: WorkerMetrics = field(default_factory=WorkerMetrics)
    planner: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvr-plan")
    )
    """Where requests are rendered and tokenized: off the event loop, one at a time."""
    planning: int = 0
    """Requests waiting for or in the planning thread (reported by ``/readyz``)."""
    render_cache_bytes: int = DEFAULT_MAX_BYTES
    """The cap on the previous prompts kept for reuse (0: tokenize every prompt whole)."""
    render_cache: RenderCache | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.idle.set()
        tokenizer = self.engine.tokenizer
        if self.render_cache_bytes > 0 and getattr(tokenizer, "chat_template", None):
            self.render_cache = RenderCache(tokenizer, max_bytes=self.render_cache_bytes)

    def enter(self) -> None:
        self.inflight += 1
        self.idle.clear()
        self.metrics.inflight.set(self.inflight)

    def leave(self) -> None:
        self.inflight -= 1
        self.metrics.inflight.set(self.inflight)
        if self.inflight == 0:
            self.idle.set()


STATE: Final = web.AppKey("worker_state", WorkerState)


@dataclass(frozen=True)
class PlannedCall:
    """A validated request and the exact engine call it becomes."""

    request: PreprocessedRequest
    role: Role
    kwargs: dict[str, Any]
    kv_hints: dict[str, Any] | None
    output: OutputPlan | None = None
    retained_tokens: int | None = None
    """Where the retained prefix ends (reported in the final usage); ``None`` when not hinted."""
    count_only: int | None = None
    """For ``count_only`` requests: the prompt's token count; the engine is not called."""
    breakpoints: Resolution | None = None
    """Where the request's breakpoints resolved (or why they were dropped), for the trace."""
    prompt_tokens: int = 0
    reused_tokens: int = 0
    """Prompt tokens reused from the conversation's previous prompt (not tokenized again)."""


def plan_call(
    body: bytes,
    *,
    headers: dict[str, str],
    state_role: Role,
    engine: LoadedEngine,
    cache: RenderCache | None = None,
) -> PlannedCall:
    """Validate a generate request and build its engine call, or raise :class:`RequestRejected`.

    ``cache`` lends the conversation's previous prompt tokens (found by session id or by the
    ``x-kvr-prefix`` chain the router passes on)."""
    memo = ConversationMemo() if cache is not None and cache.enabled else None
    decoded = decode_reusing(body, headers=headers, cache=cache, memo=memo)
    if decoded is None:
        memo = None  # decoded as before: the messages are new objects, nothing to lend
        request, envelope = decode_whole(body)
    else:
        request, envelope = decoded
    if request.token_ids is None and not request.messages:
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST, "one of token_ids or messages is required", param="messages"
        )
    if envelope is not None and engine.dialect is Dialect.NONE and not request.count_only:
        raise RequestRejected(
            ErrorCode.KV_HINTS_UNSUPPORTED,
            f"this worker's engine ({engine.name}) has no kv_hints parameter on "
            "Engine.async_generate, so it cannot honour the prompt-retention hint; "
            "retry without prompt cache retention or upgrade the worker image",
            param=WIRE_KEY,
        )
    role = _role_of(headers, default=state_role)
    bootstrap = _bootstrap_of(headers) if role != "aggregated" else None
    hinted = envelope is not None and not request.count_only
    if hinted:
        assert envelope is not None
        try:
            require_support(envelope, engine.dialect)
        except PrefixHintUnsupported as exc:
            raise RequestRejected(
                ErrorCode.KV_HINTS_UNSUPPORTED, str(exc), param=WIRE_KEY
            ) from None
    prefixes = envelope.prefix_count if hinted and envelope is not None else 0
    try:
        tenant = tenant_of_headers(headers)
    except ValueError as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc)) from None
    # The render cache per tenant too: no tokenization-time probe of another tenant's prompts.
    request.session_id = scoped_session(tenant, request.session_id)
    try:
        prompt = build_engine_prompt(
            request,
            tokenizer=engine.tokenizer,
            with_offsets=prefixes > 0,
            cache=cache,
            chain=scoped_chain(tenant, parse_prefix_header(headers.get(HEADER_PREFIX))),
            memo=memo,
        )
        if request.count_only:
            return PlannedCall(
                request=request,
                role=role,
                kwargs={},
                kv_hints=None,
                count_only=prompt.prompt_tokens,
                prompt_tokens=prompt.prompt_tokens,
                reused_tokens=prompt.reused_tokens,
            )
        output = plan_output(request, engine.parsers, prompt_text=prompt.rendered)
        sampling = constrained_sampling(request, output)
        resolution = (
            resolve_prompt_breakpoints(
                request, prompt, tokenizer=engine.tokenizer, expected=prefixes
            )
            if prefixes
            else None
        )
    except MarkerMismatch as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param=WIRE_KEY) from None
    except TemplateInputError as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param=exc.param) from None
    except ConstraintConflict as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param="tool_choice") from None
    except ParserConfigError as exc:
        raise RequestRejected(ErrorCode.ENGINE_ERROR, str(exc)) from None
    kv_hints = None
    if hinted and envelope is not None:
        kv_hints = build_kv_hints(
            envelope,
            engine.dialect,
            request_id=request.request_id,
            prompt_tokens=prompt.prompt_tokens,
            prefixes=() if resolution is None else resolution.resolved,
        )
    kwargs = build_generate_kwargs(
        request,
        prompt=prompt,
        sampling_params=sampling,
        kv_hints=kv_hints,
        bootstrap=bootstrap,
        require_reasoning=output.thinking,
    )
    if tenant is not None:  # the tenant's cache_salt: its own radix namespace and storage keys
        try:
            kwargs.update(engine_kwargs(tenant, engine.engine.async_generate))
        except TenantIsolationUnavailable as exc:
            raise RequestRejected(ErrorCode.ENGINE_ERROR, str(exc)) from None
    return PlannedCall(
        request=request,
        role=role,
        kwargs=kwargs,
        kv_hints=kv_hints,
        output=output,
        breakpoints=resolution,
        retained_tokens=retained_tokens(kv_hints, prompt_tokens=prompt.prompt_tokens),
        prompt_tokens=prompt.prompt_tokens,
        reused_tokens=prompt.reused_tokens,
    )


def _role_of(headers: dict[str, str], *, default: Role) -> Role:
    value = headers.get(HEADER_ROLE, default)
    if value not in ROLES:
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST, f"{HEADER_ROLE} must be one of {', '.join(ROLES)}"
        )
    return cast(Role, value)


def _bootstrap_of(headers: dict[str, str]) -> Bootstrap:
    try:
        return Bootstrap(
            host=headers[HEADER_BOOTSTRAP_HOST],
            port=int(headers[HEADER_BOOTSTRAP_PORT]),
            room=int(headers[HEADER_BOOTSTRAP_ROOM]),
        )
    except (KeyError, ValueError):
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST,
            f"prefill/decode requests need {HEADER_BOOTSTRAP_HOST}, {HEADER_BOOTSTRAP_PORT} "
            f"and {HEADER_BOOTSTRAP_ROOM} headers",
        ) from None


def error_response(code: ErrorCode, message: str, *, param: str | None = None) -> web.Response:
    line = ErrorLine(error=ErrorBody(code=code, message=message, param=param))
    return web.Response(
        status=ERROR_STATUS[code], body=line.model_dump_json(), content_type="application/json"
    )


def _line(model: GenerateChunk | ErrorLine) -> bytes:
    return model.model_dump_json(exclude_none=True).encode() + b"\n"


async def handle_generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    if state.draining:
        return error_response(ErrorCode.DRAINING, "worker is shutting down")
    body = await request.read()
    plan = partial(
        plan_call,
        body,
        headers={k.lower(): v for k, v in request.headers.items()},
        state_role=state.role,
        engine=state.engine,
        cache=state.render_cache,
    )
    state.planning += 1
    try:
        planned = await asyncio.get_running_loop().run_in_executor(state.planner, plan)
    except RequestRejected as exc:
        state.metrics.requests.labels("rejected").inc()
        _trace(state, request_id=_request_id_of(body), outcome="rejected", code=str(exc.code))
        return error_response(exc.code, str(exc), param=exc.param)
    finally:
        state.planning -= 1
    if planned.prompt_tokens:
        state.metrics.prompt_tokens.labels("reused").inc(planned.reused_tokens)
        state.metrics.prompt_tokens.labels("tokenized").inc(
            planned.prompt_tokens - planned.reused_tokens
        )
    if planned.count_only is not None:
        return await _count(request, state, planned, planned.count_only)
    state.enter()
    try:
        return await _stream(request, state, planned)
    finally:
        state.leave()


async def _count(
    request: web.Request, state: WorkerState, planned: PlannedCall, prompt_tokens: int
) -> web.StreamResponse:
    """A ``count_only`` answer: one chunk with the prompt's token count, no engine call."""
    chunk = GenerateChunk(finish_reason="stop", usage=Usage(prompt_tokens=prompt_tokens))
    response = web.StreamResponse(headers={"Content-Type": NDJSON})
    await response.prepare(request)
    await response.write(_line(chunk))
    await response.write_eof()
    state.metrics.requests.labels("counted").inc()
    _trace(
        state,
        request_id=planned.request.request_id,
        outcome="counted",
        prompt_tokens=prompt_tokens,
        kv_hints_passed=False,
    )
    return response


def _with_retained(chunk: GenerateChunk, planned: PlannedCall) -> GenerateChunk:
    """The final chunk's usage says how much of the prompt the engine was asked to retain."""
    if chunk.usage is None or planned.retained_tokens is None:
        return chunk
    usage = chunk.usage.model_copy(update={"retained_tokens": planned.retained_tokens})
    return chunk.model_copy(update={"usage": usage})


async def _stream(
    request: web.Request, state: WorkerState, planned: PlannedCall
) -> web.StreamResponse:
    rid = planned.request.request_id
    started = time.monotonic()
    outcome = "ok"
    try:
        parser = OutputParser(planned.output) if planned.output is not None else None
    except ParserConfigError as exc:
        return error_response(ErrorCode.ENGINE_ERROR, str(exc))
    adapter = StreamAdapter(incremental=state.engine.incremental_stream, parser=parser)
    gen: AsyncIterator[dict[str, Any]] | None = None
    response: web.StreamResponse | None = None
    try:
        try:
            gen = await state.engine.engine.async_generate(**planned.kwargs)
            assert gen is not None
            first = await gen.__anext__()
        except StopAsyncIteration:
            outcome = "error"
            return error_response(ErrorCode.ENGINE_ERROR, "engine produced no output")
        except ValueError as exc:
            # SGLang rejects malformed requests (including kv_hints) with ValueError.
            outcome = "rejected"
            return error_response(ErrorCode.INVALID_REQUEST, f"engine rejected request: {exc}")
        except Exception as exc:
            outcome = "error"
            log.exception("engine failed before the first chunk of %s", rid)
            return error_response(ErrorCode.ENGINE_ERROR, f"engine error: {exc}")
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(_line(_with_retained(adapter.chunk(first), planned)))
        try:
            async for output in gen:
                await response.write(_line(_with_retained(adapter.chunk(output), planned)))
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            outcome = "error"
            log.exception("engine failed mid-stream for %s", rid)
            err = ErrorLine(error=ErrorBody(code=ErrorCode.ENGINE_ERROR, message=str(exc)))
            await response.write(_line(err))
        await response.write_eof()
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        outcome = "aborted"
        state.engine.abort(rid)
        raise
    finally:
        if gen is not None:
            aclose = getattr(gen, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        state.metrics.requests.labels(outcome).inc()
        if planned.kv_hints is not None and outcome == "ok":
            state.metrics.kv_hints.labels(str(state.engine.dialect)).inc()
        extra: dict[str, Any] = {}
        if planned.breakpoints is not None:
            extra.update(planned.breakpoints.to_trace())
        tenant = tenant_of_salt(planned.kwargs.get(CACHE_SALT_PARAM))
        if tenant is not None:
            extra["tenant"] = tenant
        _trace(
            state,
            request_id=rid,
            outcome=outcome,
            kv_hints=planned.kv_hints,
            kv_hints_passed=planned.kv_hints is not None,
            **extra,
            role=planned.role,
            dialect=str(state.engine.dialect),
            prompt_tokens_reused=planned.reused_tokens,
            duration_s=round(time.monotonic() - started, 6),
        )


def _trace(
    state: WorkerState,
    *,
    request_id: str,
    outcome: str,
    kv_hints: dict[str, Any] | None = None,
    **fields: Any,
) -> None:
    if state.trace is not None:
        state.trace.record(request_id=request_id, outcome=outcome, kv_hints=kv_hints, **fields)


def _request_id_of(body: bytes) -> str:
    try:
        raw = json.loads(body)
    except ValueError:
        return ""
    rid = raw.get("request_id") if isinstance(raw, dict) else None
    return rid if isinstance(rid, str) else ""


async def readiness(state: WorkerState) -> Readiness:
    """Not ready once draining, so the router's health poll stops sending new requests.

    Answered on the event loop from counters alone, never behind the planning thread: a worker
    busy preparing long prompts says so (``planning``, ``inflight``) and stays ready."""
    if state.draining:
        return Readiness(ready=False, body={"status": "draining"})
    return Readiness(
        ready=True,
        body={"status": "ready", "planning": state.planning, "inflight": state.inflight},
    )


async def handle_info(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response(
        {
            "role": state.role,
            "engine": state.engine.name,
            "dialect": str(state.engine.dialect),
            "bootstrap_host": state.bootstrap_host,
            "bootstrap_port": state.bootstrap_port,
            "draining": state.draining,
        }
    )


async def _planner(app: web.Application) -> AsyncIterator[None]:
    """The planning thread ends with the app; no handler is left waiting on it by then."""
    yield
    app[STATE].planner.shutdown(wait=False, cancel_futures=True)


def build_app(state: WorkerState) -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATE] = state
    app.cleanup_ctx.append(_planner)
    app.router.add_post(GENERATE_PATH, handle_generate)
    add_probes(app, ready=lambda: readiness(state))
    app.router.add_get(INFO_PATH, handle_info)
    add_metrics(app, state.metrics.registry)
    return app


async def drain(state: WorkerState, *, deadline_s: float) -> bool:
    """Stop taking requests and wait (bounded) for in-flight streams; True if all finished."""
    state.draining = True
    try:
        await asyncio.wait_for(state.idle.wait(), timeout=deadline_s)
    except TimeoutError:
        return False
    return True
