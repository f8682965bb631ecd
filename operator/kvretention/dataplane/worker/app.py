"""The worker's HTTP app: ``POST /v1/generate`` in, NDJSON ``GenerateChunk`` lines out.

Every check that can fail runs before the engine is called, so a rejected request never reaches
SGLang: with ``--hop-key-file``, a tenant the fleet's frontend did not sign -> 403
``hop_unauthenticated`` (:mod:`kvretention.common.hop_auth`), first of all; malformed JSON or envelope -> 400 ``invalid_request``; a hint for an engine without
``kv_hints`` -> 501 ``kv_hints_unsupported`` naming ``kv_hints``. After the stream has started a
failure becomes one final ``{"error": ...}`` line. A client that goes away aborts the engine request.

The prompt is rendered with the model's chat template (tools included) and tokenized once; the
answer is parsed into text, reasoning and tool-call deltas by SGLang's own parsers (see
:mod:`kvretention.dataplane.worker.parsing`). A ``count_only`` request is rendered and counted and
answered with one chunk; the engine is never called.

Rendering and tokenizing a coding agent's ~200 KB prompt takes tens of milliseconds (a 3 MB one,
seconds), so it runs on a few planning threads shared fairly by tenants
(:mod:`kvretention.dataplane.worker.planning`), never on the event loop: streams in flight and
``/readyz`` keep answering while a burst of long prompts is prepared, the router does not eject a
busy worker as dead, and one tenant's huge prompt does not hold up another's small request
(:func:`~kvretention.dataplane.worker.plan.plan_call` decides each engine call). An agent's next
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
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

from aiohttp import web
from msgspec.structs import replace
from prometheus_client import CollectorRegistry

from kvretention.api.names import Role
from kvretention.common.hop_auth import HopKeyFile
from kvretention.common.tenancy import CACHE_SALT_PARAM, HEADER_TENANT, tenant_of_salt
from kvretention.common.trace import RequestTrace
from kvretention.dataplane.compiled_template import compiled_template_serving
from kvretention.dataplane.hop_key import refused_hop
from kvretention.dataplane.http import Readiness, add_metrics, add_probes
from kvretention.dataplane.metric_decl import counter, gauge
from kvretention.dataplane.protocol import (
    ERROR_STATUS,
    GENERATE_PATH,
    NDJSON,
    RESIDENCY_PATH,
    ContextOverflow,
    ErrorBody,
    ErrorCode,
    ErrorLine,
    GenerateChunk,
    Usage,
    chunk_line,
)
from kvretention.dataplane.worker.call import StreamAdapter, engine_overflow
from kvretention.dataplane.worker.engine import LoadedEngine
from kvretention.dataplane.worker.fast_paths import (
    COMPILED_TEMPLATE,
    TOKEN_REUSE,
    FastPathCollector,
)
from kvretention.dataplane.worker.kv_feed import ResidencyFeed
from kvretention.dataplane.worker.output_parser import OutputParser
from kvretention.dataplane.worker.parsing import ParserConfigError
from kvretention.dataplane.worker.plan import PlannedCall, plan_call
from kvretention.dataplane.worker.planning import DEFAULT_THREADS, MAX_BODY_BYTES, PlanningPool
from kvretention.dataplane.worker.render_cache import DEFAULT_MAX_BYTES, RenderCache
from kvretention.dataplane.worker.whole_answer import WHOLE_ANSWER_FLUSH_S, HeldChunks
from kvretention.dataplane.worker.wire import RequestRejected
from kvretention.retention.failures import FailureCollector
from kvretention.retention.l3_export import L3Collector
from kvretention.retention.pin_stats import PinnedTokensCollector, PinsDroppedCollector
from kvretention.retention.tree_core import TreeCoreCollector

__all__ = ["PlannedCall", "RequestRejected", "WorkerState", "build_app", "drain", "plan_call"]

log = logging.getLogger(__name__)

INFO_PATH: Final = "/v1/info"


@dataclass
class WorkerMetrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    retention_stats_dir: str | None = None
    """Where the retention plugin in SGLang's scheduler process writes its failure counts
    (:mod:`kvretention.retention.failures`); None: the engine runs no plugin of ours to read."""

    def __post_init__(self) -> None:
        if self.retention_stats_dir is not None:
            self.registry.register(FailureCollector(self.retention_stats_dir))
            self.registry.register(L3Collector(self.retention_stats_dir))
            self.registry.register(TreeCoreCollector(self.retention_stats_dir))
            self.registry.register(PinnedTokensCollector(self.retention_stats_dir))
            self.registry.register(PinsDroppedCollector(self.retention_stats_dir))
        self.requests = counter(
            self.registry,
            "kvretention_worker_requests",
            "Finished generate requests by outcome.",
            "outcome",
        )
        self.kv_hints = counter(
            self.registry,
            "kvretention_worker_kv_hints_passed",
            "Requests whose hint was passed to the engine, by dialect.",
            "dialect",
        )
        self.inflight = gauge(
            self.registry, "kvretention_worker_inflight", "Generate requests in flight."
        )
        self.tool_calls_unlike_whole = counter(
            self.registry,
            "kvretention_worker_tool_calls_unlike_whole",
            "Streamed answers whose tool calls are not the ones SGLang's non-streaming parse "
            "reads from the same text, by --tool-call-parser (its streaming detector lost, "
            "joined or misplaced a call).",
            "parser",
        )
        self.hop_refusals = counter(
            self.registry,
            "kvretention_worker_hop_refusals",
            "Requests refused with a 403 for a missing or bad x-kvr-tenant-sig (only with "
            "--hop-key-file), by reason (missing, malformed, stale, invalid).",
            "reason",
        )
        self.fast_paths = FastPathCollector()
        self.registry.register(self.fast_paths)
        self.prompt_tokens = counter(
            self.registry,
            "kvretention_worker_prompt_tokens",
            "Prompt tokens of rendered requests: reused from the conversation's previous prompt, "
            "or tokenized.",
            "how",
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
    planning_threads: int = DEFAULT_THREADS
    """How many requests are rendered and tokenized at once, off the event loop."""
    planner: PlanningPool = field(init=False)
    planning: int = 0
    """Requests waiting for or on a planning thread (reported by ``/readyz``)."""
    render_cache_bytes: int = DEFAULT_MAX_BYTES
    """The cap on the previous prompts kept for reuse (0: tokenize every prompt whole)."""
    render_cache: RenderCache | None = field(init=False, default=None)
    hop_keys: HopKeyFile | None = None
    """``--hop-key-file``: a request's tenant becomes its ``cache_salt`` only when the fleet's
    frontend signed it."""
    residency: ResidencyFeed | None = None
    """``--kv-events``: the engine's KV events, indexed (``GET /kv/residency``)."""

    def __post_init__(self) -> None:
        self.idle.set()
        self.planner = PlanningPool(threads=self.planning_threads)
        tokenizer = self.engine.tokenizer
        if self.render_cache_bytes > 0 and getattr(tokenizer, "chat_template", None):
            cache = self.render_cache = RenderCache(tokenizer, max_bytes=self.render_cache_bytes)
            self.metrics.fast_paths.sources[TOKEN_REUSE] = lambda: cache.enabled
        if getattr(tokenizer, "chat_template", None):
            sources = self.metrics.fast_paths.sources
            sources[COMPILED_TEMPLATE] = lambda: compiled_template_serving(tokenizer)

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


def error_response(
    code: ErrorCode,
    message: str,
    *,
    param: str | None = None,
    overflow: ContextOverflow | None = None,
) -> web.Response:
    line = ErrorLine(error=ErrorBody(code=code, message=message, param=param, overflow=overflow))
    return web.Response(
        status=ERROR_STATUS[code], body=line.model_dump_json(), content_type="application/json"
    )


def _line(model: GenerateChunk | ErrorLine) -> bytes:
    if isinstance(model, GenerateChunk):
        return chunk_line(model) + b"\n"
    return model.model_dump_json(exclude_none=True).encode() + b"\n"


async def handle_generate(request: web.Request) -> web.StreamResponse:
    state = request.app[STATE]
    refused = refused_hop(state.hop_keys, request.headers, state.metrics.hop_refusals)
    if refused is not None:
        return error_response(ErrorCode.HOP_UNAUTHENTICATED, refused)
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
        planned = await state.planner.run(
            plan, tenant=request.headers.get(HEADER_TENANT, ""), size=len(body)
        )
    except RequestRejected as exc:
        state.metrics.requests.labels("rejected").inc()
        _trace(state, request_id=_request_id_of(body), outcome="rejected", code=str(exc.code))
        return error_response(exc.code, str(exc), param=exc.param, overflow=exc.overflow)
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
    usage = replace(chunk.usage, retained_tokens=planned.retained_tokens)
    return replace(chunk, usage=usage)


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
    usage: Usage | None = None

    def next_chunk(output: dict[str, Any]) -> GenerateChunk:
        nonlocal usage
        chunk = _with_retained(adapter.chunk(output), planned)
        usage = chunk.usage or usage
        return chunk

    try:
        try:
            _note_prompt(state, planned)
            gen = await state.engine.engine.async_generate(**planned.kwargs)
            assert gen is not None
            first = await gen.__anext__()
        except StopAsyncIteration:
            outcome = "error"
            return error_response(ErrorCode.ENGINE_ERROR, "engine produced no output")
        except ValueError as exc:
            # SGLang rejects malformed requests (including kv_hints) with ValueError.
            outcome = "rejected"
            return error_response(
                ErrorCode.INVALID_REQUEST,
                f"engine rejected request: {exc}",
                overflow=engine_overflow(str(exc)),
            )
        except Exception as exc:
            outcome = "error"
            log.exception("engine failed before the first chunk of %s", rid)
            return error_response(ErrorCode.ENGINE_ERROR, f"engine error: {exc}")
        response = web.StreamResponse(headers={"Content-Type": NDJSON})
        await response.prepare(request)
        await response.write(_line(next_chunk(first)))
        # an answer the client reads whole goes out in a few merged chunks (whole_answer.py)
        held = (
            None if planned.request.stream else HeldChunks(WHOLE_ANSWER_FLUSH_S, time.monotonic())
        )
        tail = b""
        try:
            async for output in gen:
                chunk = next_chunk(output)
                due = chunk if held is None else held.add(chunk, time.monotonic())
                if due is not None:
                    await response.write(_line(due))
                if adapter.stopped:  # the answer is complete: no more engine tokens for it
                    state.engine.abort(rid)
                    break
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as exc:
            outcome = "error"
            log.exception("engine failed mid-stream for %s", rid)
            tail = _line(ErrorLine(error=ErrorBody(code=ErrorCode.ENGINE_ERROR, message=str(exc))))
        rest = held.take(time.monotonic()) if held is not None else None
        await response.write_eof((b"" if rest is None else _line(rest)) + tail)
        if parser is not None and parser.differs_from_whole:
            _tell_unlike_whole(state, planned)
        return response
    except (asyncio.CancelledError, ConnectionResetError):
        outcome = "aborted"
        state.engine.abort(rid)
        raise
    finally:
        await _close(gen)
        _account(state, planned, outcome=outcome, usage=usage, started=started)


_TOLD_UNLIKE_WHOLE: set[str] = set()


def _tell_unlike_whole(state: WorkerState, planned: PlannedCall) -> None:
    """Count an answer whose streamed calls differ from SGLang's whole parse; log the first of
    each parser (the count says how often)."""
    name = str(state.engine.parsers.tool_call_parser)
    state.metrics.tool_calls_unlike_whole.labels(name).inc()
    if name not in _TOLD_UNLIKE_WHOLE:
        _TOLD_UNLIKE_WHOLE.add(name)
        log.warning(
            "request %s: the tool calls streamed by SGLang's %r detector are not the ones its "
            "non-streaming parse reads from the same answer (counted in "
            "kvretention_worker_tool_calls_unlike_whole_total; later ones are not logged)",
            planned.request.request_id,
            name,
        )


async def _close(gen: AsyncIterator[dict[str, Any]] | None) -> None:
    """Close the engine's generator (an aborted or finished stream releases the request)."""
    if gen is not None:
        aclose = getattr(gen, "aclose", None)
        if aclose is not None:
            with contextlib.suppress(Exception):
                await aclose()


def _account(
    state: WorkerState, planned: PlannedCall, *, outcome: str, usage: Usage | None, started: float
) -> None:
    """Count one streamed request's outcome and write its trace record."""
    rid = planned.request.request_id
    state.metrics.requests.labels(outcome).inc()
    if planned.kv_hints is not None and outcome == "ok":
        state.metrics.kv_hints.labels(str(state.engine.dialect)).inc()
    extra: dict[str, Any] = {}
    if planned.breakpoints is not None:
        extra.update(planned.breakpoints.to_trace())
    tenant = tenant_of_salt(planned.kwargs.get(CACHE_SALT_PARAM))
    if tenant is not None:
        extra["tenant"] = tenant
    if usage is not None:
        # SGLang's own counts: what a replay reads retention from.
        extra.update(
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            completion_tokens=usage.completion_tokens,
        )
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

    Answered on the event loop from counters alone, never behind the planning threads: a worker
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
            "device": state.engine.device,
            "model_type": state.engine.parsers.model_type,
            "input_modalities": ["text", "image"] if state.engine.takes_images else ["text"],
            "context_length": state.engine.context_length,
            "sampling_defaults": dict(state.engine.sampling_defaults),
            "left_out": {
                "flags": list(state.engine.left_out),
                "reason": state.engine.left_out_reason,
            }
            if state.engine.left_out
            else None,
            "bootstrap_host": state.bootstrap_host,
            "bootstrap_port": state.bootstrap_port,
            "draining": state.draining,
        }
    )


def _note_prompt(state: WorkerState, planned: PlannedCall) -> None:
    """With ``--kv-events``: the session the engine's next stored blocks belong to."""
    session, ids = planned.request.session_id, planned.kwargs.get("input_ids")
    if state.residency is not None and session and isinstance(ids, list):
        state.residency.note_prompt(
            salt=planned.kwargs.get(CACHE_SALT_PARAM), session=session, ids=ids
        )


async def handle_residency(request: web.Request) -> web.Response:
    feed = request.app[STATE].residency
    assert feed is not None  # the route exists only with a feed
    return web.json_response(feed.summary())


async def _planner(app: web.Application) -> AsyncIterator[None]:
    """The planning threads end with the app; no handler is left waiting on them by then."""
    yield
    app[STATE].planner.shutdown()


def build_app(state: WorkerState) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.cleanup_ctx.append(_planner)
    app.router.add_post(GENERATE_PATH, handle_generate)
    add_probes(app, ready=lambda: readiness(state))
    app.router.add_get(INFO_PATH, handle_info)
    if state.residency is not None:
        app.router.add_get(RESIDENCY_PATH, handle_residency)
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
