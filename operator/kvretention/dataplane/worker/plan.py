"""A generate request validated and turned into the exact engine call, or refused with why.

:func:`plan_call` is pure but for the tokenizer and the render cache: it decodes the body once,
checks what the engine can take, renders and tokenizes the prompt, plans how the answer is parsed
and builds ``Engine.async_generate``'s keyword arguments. Every refusal is a
:class:`~kvretention.dataplane.worker.wire.RequestRejected` naming the error code and field. The
worker runs it on its planning threads (:mod:`kvretention.dataplane.worker.planning`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final, cast, get_args

from kvretention.api.names import Role
from kvretention.common.tenancy import (
    TenantIsolationUnavailable,
    engine_kwargs,
    scoped_chain,
    scoped_session,
    tenant_of_headers,
)
from kvretention.dataplane.breakpoints import MarkerMismatch, Resolution
from kvretention.dataplane.features import not_understood
from kvretention.dataplane.protocol import (
    HEADER_BOOTSTRAP_HOST,
    HEADER_BOOTSTRAP_PORT,
    HEADER_BOOTSTRAP_ROOM,
    HEADER_PREFIX,
    HEADER_ROLE,
    ContextOverflow,
    ErrorCode,
    PreprocessedRequest,
)
from kvretention.dataplane.router.placement import parse_prefix_header
from kvretention.dataplane.template_input import TemplateInputError
from kvretention.dataplane.worker.call import (
    Bootstrap,
    EnginePrompt,
    build_engine_prompt,
    build_generate_kwargs,
    fit_max_new_tokens,
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
    OutputPlan,
    ParserConfigError,
    constrained_sampling,
    plan_output,
)
from kvretention.dataplane.worker.render_cache import RenderCache
from kvretention.dataplane.worker.wire import (
    ConversationMemo,
    RequestRejected,
    decode_reusing,
    decode_whole,
)
from kvretention.hints.envelope import WIRE_KEY, KvHintEnvelope

ROLES: Final[tuple[str, ...]] = get_args(Role)


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


@dataclass(frozen=True)
class _Rendered:
    """What rendering a request that calls the engine gave."""

    prompt: EnginePrompt
    output: OutputPlan
    sampling: dict[str, Any]
    resolution: Resolution | None


def _check_understood(request: PreprocessedRequest) -> None:
    """Refuse, before anything is done, a request that needs what this worker predates: the
    router tries another worker (:mod:`kvretention.dataplane.features`)."""
    unknown = not_understood(request)
    if unknown:
        raise RequestRejected(
            ErrorCode.WORKER_OUTDATED,
            f"this worker is older than the request: it does not implement {', '.join(unknown)}"
            " (a worker of the fleet's current version does)",
        )


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
    request, envelope, memo = _decode(body, headers=headers, cache=cache)
    _check_understood(request)
    _check_engine_takes(request, envelope, engine=engine)
    role = _role_of(headers, default=state_role)
    bootstrap = _bootstrap_of(headers) if role != "aggregated" else None
    hint = envelope if not request.count_only else None
    prefixes = _prefixes_of(hint, engine=engine)
    tenant = _tenant_of(headers)
    # The render cache per tenant too: no tokenization-time probe of another tenant's prompts.
    request.session_id = scoped_session(tenant, request.session_id)
    with _refusals():
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
        rendered = _plan_answer(request, prompt, engine=engine, prefixes=prefixes)
    kv_hints = None
    if hint is not None:
        kv_hints = build_kv_hints(
            hint,
            engine.dialect,
            request_id=request.request_id,
            prompt_tokens=prompt.prompt_tokens,
            prefixes=() if rendered.resolution is None else rendered.resolution.resolved,
        )
    kwargs = build_generate_kwargs(
        request,
        prompt=prompt,
        sampling_params=rendered.sampling,
        kv_hints=kv_hints,
        bootstrap=bootstrap,
        require_reasoning=rendered.output.thinking,
    )
    kwargs.update(_tenant_kwargs(tenant, engine=engine))
    return PlannedCall(
        request=request,
        role=role,
        kwargs=kwargs,
        kv_hints=kv_hints,
        output=rendered.output,
        breakpoints=rendered.resolution,
        retained_tokens=retained_tokens(kv_hints, prompt_tokens=prompt.prompt_tokens),
        prompt_tokens=prompt.prompt_tokens,
        reused_tokens=prompt.reused_tokens,
    )


def _decode(
    body: bytes, *, headers: dict[str, str], cache: RenderCache | None
) -> tuple[PreprocessedRequest, KvHintEnvelope | None, ConversationMemo | None]:
    """The request, its hint envelope, and the memo to keep for the conversation's next turn."""
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
    return request, envelope, memo


def _check_engine_takes(
    request: PreprocessedRequest, envelope: KvHintEnvelope | None, *, engine: LoadedEngine
) -> None:
    if envelope is not None and engine.dialect is Dialect.NONE and not request.count_only:
        raise RequestRejected(
            ErrorCode.KV_HINTS_UNSUPPORTED,
            f"this worker's engine ({engine.name}) has no kv_hints parameter on "
            "Engine.async_generate, so it cannot honour the prompt-retention hint; "
            "retry without prompt cache retention or upgrade the worker image",
            param=WIRE_KEY,
        )


def _prefixes_of(hint: KvHintEnvelope | None, *, engine: LoadedEngine) -> int:
    """How many prefix breakpoints the hint announces, once the engine is known to take them."""
    if hint is None:
        return 0
    try:
        require_support(hint, engine.dialect)
    except PrefixHintUnsupported as exc:
        raise RequestRejected(ErrorCode.KV_HINTS_UNSUPPORTED, str(exc), param=WIRE_KEY) from None
    return hint.prefix_count


def _tenant_of(headers: dict[str, str]) -> str | None:
    try:
        return tenant_of_headers(headers)
    except ValueError as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc)) from None


def _plan_answer(
    request: PreprocessedRequest, prompt: EnginePrompt, *, engine: LoadedEngine, prefixes: int
) -> _Rendered:
    """How the answer is parsed and sampled, and where the breakpoints fall in the prompt."""
    _check_reads(prompt, engine=engine)
    _check_fits(prompt, engine=engine)
    output = plan_output(request, engine.parsers, prompt_text=prompt.rendered)
    sampling = fit_max_new_tokens(
        {**engine.sampling_defaults, **constrained_sampling(request, output)},
        prompt_tokens=prompt.prompt_tokens,
        context_length=engine.context_length,
    )
    resolution = (
        resolve_prompt_breakpoints(request, prompt, tokenizer=engine.tokenizer, expected=prefixes)
        if prefixes
        else None
    )
    return _Rendered(prompt, output, sampling, resolution)


def _check_reads(prompt: EnginePrompt, *, engine: LoadedEngine) -> None:
    """Refuse images the model cannot read: SGLang would drop them and answer the text alone."""
    images = len(prompt.image_urls)
    if images and not engine.takes_images:
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST,
            f"image input is not supported: the served model reads text only, and the"
            f" request has {images} image{'s' if images > 1 else ''}; send the request"
            " without image parts",
        )


def _check_fits(prompt: EnginePrompt, *, engine: LoadedEngine) -> None:
    """Refuse a prompt the context cannot hold, as SGLang would (its tokens plus the ones it
    reserves reach the context length), with the counts each provider's error reports."""
    window = engine.context_length
    if prompt.input_ids is None or window is None or engine.truncates_long_prompts:
        return  # images: only the engine knows the count, and refuses itself
    if prompt.prompt_tokens >= window:
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST,
            f"the prompt ({prompt.prompt_tokens} tokens) is longer than the model's context"
            f" length ({window} tokens)",
            overflow=ContextOverflow(prompt_tokens=prompt.prompt_tokens, context_length=window),
        )


@contextmanager
def _refusals() -> Iterator[None]:
    """What rendering, parsing and breakpoint resolution raise, as the client's refusal."""
    try:
        yield
    except MarkerMismatch as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param=WIRE_KEY) from None
    except TemplateInputError as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param=exc.param) from None
    except RecursionError:  # JSON nested past what any check above bounds: the client's 400
        raise RequestRejected(
            ErrorCode.INVALID_REQUEST, "the request nests JSON too deeply to render"
        ) from None
    except ConstraintConflict as exc:
        raise RequestRejected(ErrorCode.INVALID_REQUEST, str(exc), param="tool_choice") from None
    except ParserConfigError as exc:
        raise RequestRejected(ErrorCode.ENGINE_ERROR, str(exc)) from None


def _tenant_kwargs(tenant: str | None, *, engine: LoadedEngine) -> dict[str, Any]:
    """The tenant's ``cache_salt``: its own radix namespace and storage keys (none without)."""
    if tenant is None:
        return {}
    try:
        return engine_kwargs(tenant, engine.engine.async_generate)
    except TenantIsolationUnavailable as exc:
        raise RequestRejected(ErrorCode.ENGINE_ERROR, str(exc)) from None


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
